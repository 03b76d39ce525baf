"""The depth study (issue 59): the paper's mechanism and its headline on text, with 4-layer
models at the paper's window ratios (T = 1024, W = T/128 and T/8). README.md says what it asks
and answers; RULE.md is the rule fixed before the main runs."""

"""Laziness on text alone, by a rule fixed before the runs (issue 49): on text only, does a long
window leave the recurrent memory's copy gain beyond it to the short window? Controls first
(does the memory copy beyond 32 at W = 8?), then SX and SD at W 8 / 64 / stochastic (and 128)
on the Python standard library's bytes, 5 seeds, and where the short window's lower text loss
comes from (README.md; the rule: TEXT_RULE.md; the reports: TEXT_STUDY.md, TEXT_POSITIONS.md)."""

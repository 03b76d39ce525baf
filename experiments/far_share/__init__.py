"""The natural far share of text: how many of a corpus's targets can only a copy from beyond
the window W predict, at training length T? KJV (prose) and the Python standard library
(code), bytes and GPT-2 BPE, T ∈ {256, 4k, 16k}, W ∈ {T/128, T/32, T/8, T/4}: the scale on
which the laziness map's ρ* is compared with text (README.md; the report: FAR_SHARE.md)."""

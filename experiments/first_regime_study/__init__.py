"""The first study of the paper's regime (long window T/8, text 97 % of the targets): does the
window effect appear there? Its reading, that it does not at this scale, was withdrawn: its
laziness map let near answers fall outside the window and its claim 2 read recall over uniform
distances. The laziness map and the claims studies redo it by distance bucket (README.md; the
report, superseded but kept as measured: FIRST_STUDY.md)."""

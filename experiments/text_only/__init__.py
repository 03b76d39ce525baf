"""Laziness on text alone, the first probe: is a long window lazy when the model is trained on
text only (KJV, no episodes)? The regime's SX model (and a 4-layer SXSX) with windows T/32,
T/8 and stochastic, read by the copy gain per distance bucket. Superseded by the text study's
fixed rule (README.md; the reports: TEXT_ONLY.md, TEXT_ONLY_SXSX.md)."""

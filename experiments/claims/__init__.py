"""The paper's three claims in its regime (T = 256, W_short = T/32, W_long = T/8, text 97 % of
the targets), judged part by part on recall by distance bucket: does a short window teach the
recurrent memory, is a long window lazy, does the stochastic schedule get both? Two settings:
1 % of the training answers beyond W_long (with controls), and none (README.md; the report:
CLAIMS.md)."""

"""The window-size study at CPU scale: does the paper's window effect appear when the long window
is the whole training length? SX, SD and SA hybrids with a short, a long and a stochastic window
on one-pair recall (MQAR), read at 1×–32× the training length, with the mechanism probe and a
phase diagram over the mLSTM input-gate bias (README.md; the report: REPORT.md)."""

"""The laziness map: how much supervision from beyond the long window does the recurrent memory
need before a long window stops making it lazy? SWAX at T = 256 with a fixed window W (T/16,
T/8, T/4) and a share ρ of the training answers beyond W; ρ*(W/T) is the share at which half
the seeds stay lazy (README.md; the report: LAZINESS.md)."""

"""`swax sweep`: train and evaluate a family of runs (resumable)."""

from __future__ import annotations

from swax.cli import options as C
from swax.core.errors import SwaxError
from swax.core.paths import check_writable_dir
from swax.sweep import aggregate, load_sweep, run_sweep


def cmd_sweep(args: C.SweepArgs) -> int:

    cfg = load_sweep(args.config, quick=args.quick)
    if args.jobs is not None:
        if args.jobs < 1:
            raise SwaxError(f"--jobs must be >= 1, got {args.jobs}")
        cfg.jobs = args.jobs
    check_writable_dir(cfg.out_dir, f"sweep {args.config}: out_dir")
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    agg = aggregate(run_sweep(cfg, only))
    lengths = sorted({n for a in agg.values() for n in a.get("episodes_deploy", {})})
    head = f"{'run':<22} {'window':>6}  " + "  ".join(f"{n:>11}" for n in lengths)
    print(
        "\nrecall (%) at each length with each run's own window (its fixed window, or the long "
        f"one after a stochastic schedule), mean ± spread over seeds\n{head}"
    )
    for name, a in agg.items():
        w = a["windows"]["train" if a["deploy"] == "train" else "long"]
        cells = "  ".join(
            f"{a['episodes_deploy'][n][0]:6.1f}±{a['episodes_deploy'][n][1]:<4.1f}" for n in lengths
        )
        print(f"{name:<22} {w:>6}  {cells}")
    return 0

"""The window-size study's entry point.

    python -m experiments.window_sweep run              # the CPU sweep (about 90 min, 2 cores)
    python -m experiments.window_sweep run --quick      # the reduced version (< 5 min, CI)
    python -m experiments.window_sweep run --config sweep_gpu.yaml   # the GPU sweep (one H200)
    python -m experiments.window_sweep report [--check] # REPORT.md from results.json

Runs are resumable: a finished run or evaluation stage is never redone. ``run`` collects every
run's summary.json and eval.json into results.json, then writes the report from it; ``report``
rebuilds it from the committed results.json alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.lab.cli import Block, Study, main, report, sweeps
from experiments.window_sweep.report import (
    CONFIGS,
    HERE,
    README_BEGIN,
    README_END,
    STUDIES_PAGE,
    names,
    studies_block,
    write_report,
    write_reports,
)
from swax.sweep import run_sweep


def run(args, study: Study) -> int:
    """Train and evaluate (resumably) one sweep (sweep.yaml unless --config), collect its
    results into results.json and write the report; --quick: all of it in the sweep's out_dir."""
    config = args.config or CONFIGS[0]
    cfg = sweeps(study, args.quick)[config]
    if args.jobs:
        cfg.jobs = args.jobs
    results = run_sweep(cfg, args.only.split(",") if args.only else None)
    out = Path(args.report_dir or (cfg.out_dir if args.quick else HERE))
    out.mkdir(parents=True, exist_ok=True)
    (out / names(config)[1]).write_text(json.dumps(results, indent=1))
    if args.quick or args.only or args.report_dir:
        print(f"report: {write_report(cfg, HERE / config, results, out, args.quick)}")
        return 0
    return report(args, study)


STUDY = Study(
    package="experiments.window_sweep",
    here=HERE,
    configs=CONFIGS,
    reports=write_reports,
    blocks=lambda: [Block(STUDIES_PAGE, README_BEGIN, README_END, studies_block)],
    run=run,
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

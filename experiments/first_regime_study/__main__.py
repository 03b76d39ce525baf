"""The first regime study's entry point.

    python -m experiments.first_regime_study run            # the CPU study (about 2 h, 2 cores)
    python -m experiments.first_regime_study run --quick    # the reduced version (CI, < 5 min)
    python -m experiments.first_regime_study run --config sweep_gpu.yaml   # at GPU scale
    python -m experiments.first_regime_study report [--check]   # FIRST_STUDY.md from results

Runs are resumable (a finished run or evaluation is never redone). ``run`` collects the runs'
evaluations into results.json and results_multipair.json, then writes the report from them;
``report`` rebuilds it from the committed files alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.first_regime_study.report import (
    HERE,
    RESULTS,
    SCALES,
    write_report,
    write_reports,
)
from experiments.lab.cli import Study, main, report, sweeps
from swax.sweep import run_sweep


def run(args, study: Study) -> int:
    """Train and evaluate the CPU study (sweep.yaml, then multipair.yaml) or, with --config
    sweep_gpu.yaml, the GPU one; collect the results and write the report."""
    scale = "gpu" if args.config == "sweep_gpu.yaml" else "cpu"
    config, multi = SCALES[scale]
    cfgs = sweeps(study, args.quick)
    cfg, mcfg = cfgs[config], (cfgs[multi] if multi else None)
    only = args.only.split(",") if args.only else None
    for c in (cfg, mcfg):
        if c is not None and args.jobs:
            c.jobs = args.jobs
    results = run_sweep(cfg, only)
    mresults = run_sweep(mcfg) if mcfg else None
    out = Path(args.report_dir or (cfg.out_dir if args.quick else HERE))
    out.mkdir(parents=True, exist_ok=True)
    main_file, multi_file = RESULTS[scale]
    (out / main_file).write_text(json.dumps(results, indent=1))
    if mresults:
        (out / multi_file).write_text(json.dumps(mresults, indent=1))
    if args.quick or args.only or args.report_dir or scale == "gpu":
        report_path = write_report(cfg, HERE / config, results, mcfg, mresults, out, args.quick)
        print(f"report: {report_path}")
        return 0
    return report(args, study)


STUDY = Study(
    package="experiments.first_regime_study",
    here=HERE,
    configs=("sweep.yaml", "multipair.yaml", "sweep_gpu.yaml"),
    reports=write_reports,
    run=run,
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

"""The text study's entry point.

    python -m experiments.text_study run --config text_controls.yaml --jobs 2   # the controls
    python -m experiments.text_study run --config text_code.yaml --jobs 2   # 40 runs, 20-30 min
    python -m experiments.text_study run --positions   # the loss by position, from the models
    python -m experiments.text_study run --quick --report-dir DIR   # CI smoke test (no KJV runs)
    python -m experiments.text_study report [--check]  # TEXT_STUDY.md and TEXT_POSITIONS.md

The rule (TEXT_RULE.md) was committed before the first main run; the report applies it to the
committed per-run files of text_controls.yaml, text_code.yaml and text_kjv.yaml and reads
nothing else. ``run --positions`` reads the trained models of runs/text_code (not committed)
into results/text_code_positions.json, from which TEXT_POSITIONS.md is made.
"""

from __future__ import annotations

from pathlib import Path

from experiments.lab.cli import Study, default_run, main, report, sweeps
from experiments.text_study import positions
from experiments.text_study.readings import CONTROLS, HERE, MAIN
from experiments.text_study.report import quick_reports, write_reports


def options(parser) -> None:
    parser.add_argument(
        "--positions", action="store_true", help="measure the loss by position (no training)"
    )
    parser.add_argument("--samples", type=int, default=256, help="held-out stretches per run")


def run(args, study: Study) -> int:
    """Train and report (the default run), or with --positions measure the trained models of
    text_code.yaml (--quick: its reduced runs, the JSON in --report-dir or their out_dir)."""
    if not args.positions:
        return default_run(args, study)
    cfg = sweeps(study, args.quick)[positions.CONFIG]
    if not args.quick:
        positions.measure_and_report(cfg, args.samples, HERE)
        return report(args, study)
    out = Path(args.report_dir or cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in positions.measure_and_report(cfg, args.samples, out, out / positions.RESULT.name):
        print(f"report: {path}")
    return 0


STUDY = Study(
    package="experiments.text_study",
    here=HERE,
    configs=(CONTROLS, *(f for _, f in MAIN)),
    reports=write_reports,
    quick_reports=quick_reports,
    quick_skips=("text_kjv.yaml",),
    run=run,
    options=options,
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

"""The depth study's entry point.

    python -m experiments.depth_study run --config controls.yaml   # the controls (3 runs)
    python -m experiments.depth_study run --config sx.yaml         # SX main runs (15), resumable
    python -m experiments.depth_study run                          # every sweep in order
    python -m experiments.depth_study run --quick                  # SX reduced: the smoke test
    python -m experiments.depth_study report [--check]             # REPORT.md from results/

Each finished run leaves results/CONFIG/NAME/seedS.json (its evaluation, training summary and
provenance); ``report`` reads those files alone.
"""

from __future__ import annotations

from pathlib import Path

from experiments.depth_study.report import (
    CONFIGS,
    HERE,
    blocks,
    load,
    write_report,
    write_reports,
)
from experiments.lab.cli import Study, main


def quick_reports(cfgs: dict, names: list[str], out: Path, command: str) -> list[Path]:
    runs = {name: load(name, cfg=cfg) for name, cfg in cfgs.items() if name in names}
    return [write_report(runs, out / "REPORT.md", title=f"The depth study, quick ({command})")]


STUDY = Study(
    package="experiments.depth_study",
    here=HERE,
    configs=CONFIGS,
    reports=write_reports,
    quick_reports=quick_reports,
    blocks=blocks,
    quick_skips=("controls.yaml", "sd.yaml", "lr.yaml", "reference.yaml"),
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

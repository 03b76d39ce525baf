"""The regime study's entry point.

    python -m experiments.regime_study report [--check]   # REPORT.md and the README's reading

It trains nothing (``run`` only reports): its parts are the laziness_map, claims, far_share,
text_only and text_study studies, each run by its own entry point; the report reads their
committed results with their own functions, so its numbers are theirs.
"""

from experiments.lab.cli import Block, Study, main, report
from experiments.regime_study.readme import BEGIN, END, README, block
from experiments.regime_study.report import HERE, write_reports

STUDY = Study(
    package="experiments.regime_study",
    here=HERE,
    configs=(),
    reports=write_reports,
    blocks=lambda: [Block(README, BEGIN, END, block)],
    run=lambda args, study: report(args, study),
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

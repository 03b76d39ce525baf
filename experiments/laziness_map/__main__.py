"""The laziness map's entry point.

    python -m experiments.laziness_map run --config laziness_clean.yaml --jobs 2
        # the map of record on clean episode ids: 78 runs, 4-8 min each on one core; resumable
    python -m experiments.laziness_map run --config laziness.yaml --jobs 2   # the first map
    python -m experiments.laziness_map run --quick --config laziness_clean.yaml --report-dir DIR
        # the CI smoke test: 2 tiny runs and their report
    python -m experiments.laziness_map report [--check]   # LAZINESS.md from the committed results

Every finished run leaves ``results/<archive>/NAME/seedS.json`` (committed); the report reads
those files and nothing else, so it is rebuilt from what is committed, and a cell with fewer
seeds than its config asks is reported with the seeds it has.
"""

from experiments.lab.cli import Block, Study, main
from experiments.laziness_map.report import (
    CONFIGS,
    HERE,
    README_BEGIN,
    README_END,
    STUDIES_PAGE,
    quick_reports,
    studies_block,
    write_reports,
)

STUDY = Study(
    package="experiments.laziness_map",
    here=HERE,
    configs=CONFIGS,
    reports=write_reports,
    quick_reports=quick_reports,
    blocks=lambda: [Block(STUDIES_PAGE, README_BEGIN, README_END, studies_block)],
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

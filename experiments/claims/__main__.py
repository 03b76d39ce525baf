"""The claims' entry point.

    python -m experiments.claims run --config claims.yaml --jobs 2        # ρ = 1 %: 40 runs
    python -m experiments.claims run --config claims_rho0.yaml --jobs 2   # ρ = 0: 24 runs
    python -m experiments.claims run --quick --config claims.yaml --report-dir DIR   # CI smoke
    python -m experiments.claims report [--check]    # CLAIMS.md from both committed archives

Runs take 15-19 min each on one core and are resumable; every finished run leaves
``results/<archive>/NAME/seedS.json`` (committed), and the report reads nothing else.
"""

from experiments.claims.judge import HERE
from experiments.claims.report import CONFIGS, quick_reports, write_reports
from experiments.lab.cli import Study, main

STUDY = Study(
    package="experiments.claims",
    here=HERE,
    configs=CONFIGS,
    reports=write_reports,
    quick_reports=quick_reports,
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

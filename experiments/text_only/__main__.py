"""The first text-only probe's entry point.

    python -m experiments.text_only run --config textonly.yaml --jobs 2   # 12 runs, ~6 min each
    python -m experiments.text_only run --config textonly_sxsx.yaml --jobs 2   # the SXSX model
    python -m experiments.text_only run --quick --config textonly.yaml --report-dir DIR   # CI
    python -m experiments.text_only report [--check]   # both reports from the committed results

A run is read by the copy gain (swax.probes.copies): what the earlier occurrence of a repeated
context is worth, in nats, on held-out copy events bucketed by their reach, with the run's own
window, the window cut to W_short and the recurrent reset. On text, **lazy** means the long
window gains nothing beyond W_long where the short one does.
"""

from experiments.lab.cli import Study, main
from experiments.text_only.report import CONFIGS, HERE, quick_reports, write_reports

STUDY = Study(
    package="experiments.text_only",
    here=HERE,
    configs=CONFIGS,
    reports=write_reports,
    quick_reports=quick_reports,
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

"""The natural far share's entry point.

    python -m experiments.far_share run       # every corpus and tokenizer: about 10 min, 2 cores
    python -m experiments.far_share run --quick --report-dir DIR   # KJV bytes at T = 256 (CI)
    python -m experiments.far_share report [--check]   # FAR_SHARE.md from the committed results

``run`` is ``swax data far-share`` per corpus and tokenizer, writing results/CORPUS-TOK.json;
pystdlib is this Python's standard library, so its numbers depend on the Python version, which
each file records.
"""

from __future__ import annotations

from pathlib import Path

from experiments.far_share.report import write_report, write_reports
from experiments.far_share.shares import CORPORA, FAR_SHARE, HERE, TOKENIZERS, load_far_shares
from experiments.lab.cli import Study, main, report
from swax.cli import main as swax


def run(args, study: Study) -> int:
    """``swax data far-share`` per corpus and tokenizer (--quick: KJV bytes at T = 256 into
    --report-dir, with 50 bootstrap samples), then the report."""
    if args.quick:
        out = Path(args.report_dir or "runs/far_share_quick")
        jobs = [("kjv", "byte", ["--seq-lens", "256", "--divisors", "8", "--samples", "50"])]
    else:
        out = Path(args.report_dir) if args.report_dir else FAR_SHARE
        grid = ["--seq-lens", "256,4k,16k", "--divisors", "128,32,8,4"]
        jobs = [(c, t, grid) for c, _ in CORPORA for t, _ in TOKENIZERS]
    out.mkdir(parents=True, exist_ok=True)
    for source, tok, extra in jobs:
        argv = ["data", "far-share", source, "--tokenizer", tok, *extra]
        rc = swax([*argv, "--out", str(out / f"{source}-{tok}.json")])
        if rc:
            return rc
    if args.quick or args.report_dir:
        command = f"{study.command} run" + (" --quick" if args.quick else "")
        print(f"report: {write_report(load_far_shares(out), out, command, str(out))}")
        return 0
    return report(args, study)


STUDY = Study(
    package="experiments.far_share",
    here=HERE,
    configs=(),
    reports=write_reports,
    run=run,
    doc=__doc__,
)

if __name__ == "__main__":
    main(STUDY)

"""The command line the regime study's scripts share (laziness.py, claims.py): the same
arguments, the archive of the quick runs, training the missing runs, one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

from swax.sweep import load_sweep, run_script, run_sweep

HERE = Path(__file__).resolve().parent


def prepare(script: str, doc: str, config: str, report: str, argv=None):
    """Parse ``script``'s arguments, load ``config`` (next to this file), train and evaluate the
    missing runs with --run; returns (cfg, args, report folder, the command to cite)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="train and evaluate the missing runs")
    ap.add_argument("--quick", action="store_true", help="the reduced study (CI smoke test)")
    ap.add_argument("--jobs", type=int, default=None, help="runs at a time (default: config's)")
    ap.add_argument("--only", default=None, help="comma list of the runs to train")
    ap.add_argument("--report-dir", default=None, help=f"where {report} goes (default: here)")
    ap.add_argument("--config", default=config, help=f"the sweep to run (default: {config})")
    args = ap.parse_args(argv)
    cfg = load_sweep(HERE / args.config, quick=args.quick)
    if args.quick and not cfg.archive:  # the smoke test keeps its results with its runs
        cfg.archive = str(Path(cfg.out_dir).resolve() / "archive")
    if args.run:
        if args.jobs:
            cfg.jobs = args.jobs
        run_sweep(cfg, only=args.only.split(",") if args.only else None)
    out = Path(args.report_dir) if args.report_dir else HERE
    out.mkdir(parents=True, exist_ok=True)
    command = f"python experiments/regime_study/{script}" + (" --quick" if args.quick else "")
    return cfg, args, out, command


def load_archived(cfg, convert) -> dict[str, list]:
    """{run name: [convert(archived result, seed) per seed that has one]} of a sweep's runs."""
    import json

    from swax.sweep import archive_path

    out = {}
    for name in cfg.runs:
        recs = []
        for seed in cfg.seeds:
            path = archive_path(cfg, name, seed)
            if path is not None and path.is_file():
                recs.append(convert(json.loads(path.read_text()), seed))
        out[name] = recs
    return out


def update_readme(readme: Path, begin: str, end: str, block: str) -> bool:
    """Replace what stands between the markers ``begin`` and ``end`` in ``readme`` with
    ``block``; False (nothing written) when the file or a marker is missing."""
    text = readme.read_text() if readme.is_file() else ""
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{block}\n{end}{tail}")
    return True


run = run_script  # exit with main()'s code; a SwaxError is one line and exit 2

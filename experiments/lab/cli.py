"""The one entry point every study has: ``python -m experiments.<study> run|report``.

    python -m experiments.<study> run [--config NAME] [--jobs N] [--only a,b]
        # train and evaluate the study's missing runs (every sweep, or --config's), then report
    python -m experiments.<study> run --quick [--report-dir DIR]
        # the reduced study (the CI smoke test): its runs, archive and report in the sweep's
        # out_dir (or DIR), never in the study's folder
    python -m experiments.<study> report [--report-dir DIR]
        # the reports from the committed results alone (and the docs blocks the study writes)
    python -m experiments.<study> report --check
        # the same written aside and compared with the committed files: exit 1 on a difference

A study is a :class:`Study`: its folder, its sweeps, a function that writes its reports from the
committed results into a folder, the blocks of docs pages it writes, and (where ``run`` is more
than running its sweeps and reporting) a run of its own. ``report --check`` compares every
Markdown file the study writes byte for byte, and each block with its page; the figures are
rewritten in the temporary folder but not compared (their bytes follow matplotlib's version).
``make studies`` runs it for every study. Errors are one line and exit 2 (swax.sweep.run_script).
"""

from __future__ import annotations

import argparse
import difflib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from swax.core.errors import SwaxError
from swax.sweep import archive_path, load_sweep, run_script, run_sweep

ROOT = Path(__file__).resolve().parents[2]
"""The repository: a study's commands run from here, its docs pages are here."""


@dataclass(frozen=True)
class Block:
    """What a study writes into a docs page, between the lines ``begin`` and ``end``."""

    page: Path
    begin: str
    end: str
    text: Callable[[], str]

    def render(self, page_text: str) -> str | None:
        """``page_text`` with the block rewritten; None when a marker is missing."""
        if self.begin not in page_text or self.end not in page_text:
            return None
        head, rest = page_text.split(self.begin, 1)
        _, tail = rest.split(self.end, 1)
        return f"{head}{self.begin}\n{self.text()}\n{self.end}{tail}"


@dataclass
class Study:
    """One question: where it lives, what it runs and what it writes."""

    package: str
    """The study's package, e.g. ``experiments.claims``: ``python -m`` runs it."""
    here: Path
    """Its folder: configs, committed results and reports."""
    configs: tuple[str, ...]
    """Its sweeps (files in ``here``), in the order ``run`` trains them."""
    reports: Callable[[Path], list[Path]]
    """Write every report from the committed results into a folder; the files written."""
    quick_reports: Callable[[dict, list[str], Path, str], list[Path]] | None = None
    """After ``run --quick``: (every config loaded quick, the ones run, folder, command)."""
    blocks: Callable[[], list[Block]] = list
    """The docs blocks it writes from the committed results."""
    quick_skips: tuple[str, ...] = ()
    """Configs ``run --quick`` leaves out unless named with --config."""
    run: Callable[[argparse.Namespace, Study], int] | None = None
    """A run of its own, in place of running the sweeps and reporting."""
    options: Callable[[argparse.ArgumentParser], None] | None = None
    """More options of ``run``."""
    doc: str = field(default="", repr=False)

    @property
    def command(self) -> str:
        return f"python -m {self.package}"


def archived(cfg):
    """(run name, seed, archived result) of every run of a sweep that has one, in the order of
    its runs and seeds."""
    for name in cfg.runs:
        for seed in cfg.seeds:
            path = archive_path(cfg, name, seed)
            if path is not None and path.is_file():
                yield name, seed, json.loads(path.read_text())


def load_archived(cfg, convert) -> dict[str, list]:
    """{run name: [convert(archived result, seed) per seed that has one]} of a sweep's runs."""
    out: dict[str, list] = {name: [] for name in cfg.runs}
    for name, seed, ev in archived(cfg):
        out[name].append(convert(ev, seed))
    return out


def sweeps(study: Study, quick: bool = False) -> dict:
    """{config name: its sweep} of every config of the study; with ``quick`` the reduced ones,
    each archiving into its own out_dir (the smoke test keeps its results with its runs)."""
    out = {}
    for name in study.configs:
        cfg = load_sweep(study.here / name, quick=quick)
        if quick and not cfg.archive:
            cfg.archive = str(Path(cfg.out_dir).resolve() / "archive")
        out[name] = cfg
    return out


def run_sweeps(study: Study, args) -> tuple[dict, list[str]]:
    """Train and evaluate the missing runs of the study's sweeps (--config: that one only);
    returns (every config, the names run)."""
    cfgs = sweeps(study, args.quick)
    if args.config and args.config not in cfgs:
        raise SwaxError(f"--config {args.config}: not a sweep of this study ({', '.join(cfgs)})")
    if args.config:
        names = [args.config]
    else:
        names = [n for n in cfgs if not (args.quick and n in study.quick_skips)]
    for name in names:
        if args.jobs:
            cfgs[name].jobs = args.jobs
        run_sweep(cfgs[name], only=args.only.split(",") if args.only else None)
    return cfgs, names


def default_run(args, study: Study) -> int:
    """Run the sweeps, then report: the committed reports (and blocks), or with --quick the
    reduced runs' report in --report-dir or the first sweep's out_dir."""
    cfgs, names = run_sweeps(study, args)
    if not args.quick:
        return report(args, study)
    out = Path(args.report_dir) if args.report_dir else Path(cfgs[names[0]].out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = f"{study.command} run --quick" + (f" --config {args.config}" if args.config else "")
    for path in study.quick_reports(cfgs, names, out, command):
        print(f"report: {path}")
    return 0


def report(args, study: Study) -> int:
    """Write the reports from the committed results (and the blocks, into the folder's pages)."""
    out = Path(args.report_dir) if args.report_dir else study.here
    out.mkdir(parents=True, exist_ok=True)
    for path in study.reports(out):
        print(f"report: {path}")
    if args.report_dir is None:
        for block in study.blocks():
            text = block.render(block.page.read_text())
            if text is not None:
                block.page.write_text(text)
                print(f"{block.page.relative_to(ROOT)}: {block.begin.split(' (')[0]} updated")
    return 0


def check(study: Study) -> list[str]:
    """The differences between the committed reports and blocks and what the study writes now
    (empty: byte-identical), as unified diffs."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in study.reports(Path(tmp)):
            if path.suffix != ".md":
                continue
            committed = study.here / path.name
            old = committed.read_text() if committed.is_file() else ""
            if path.read_text() != old:
                name = str(committed.relative_to(ROOT))
                new = path.read_text().splitlines()
                diff = difflib.unified_diff(old.splitlines(), new, name, "now", lineterm="", n=1)
                problems.append("\n".join(diff))
    for block in study.blocks():
        page = block.page.read_text()
        if block.render(page) != page:
            problems.append(f"{block.page.relative_to(ROOT)}: the block {block.begin} differs")
    return problems


def main(study: Study, argv=None) -> None:
    """Parse ``run|report`` and do it; exits (one-line errors, exit 2)."""
    ap = argparse.ArgumentParser(prog=study.command, description=(study.doc or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="train and evaluate the missing runs, then report")
    run.add_argument("--quick", action="store_true", help="the reduced study (CI smoke test)")
    run.add_argument("--config", default=None, help=f"one sweep of {', '.join(study.configs)}")
    run.add_argument("--jobs", type=int, default=None, help="runs at a time (default: config's)")
    run.add_argument("--only", default=None, help="comma list of the runs to train")
    run.add_argument("--report-dir", default=None, help="where the reports go")
    if study.options:
        study.options(run)
    rep = sub.add_parser("report", help="the reports from the committed results")
    rep.add_argument("--check", action="store_true", help="compare with the committed ones")
    rep.add_argument("--report-dir", default=None, help="where the reports go (default: here)")
    args = ap.parse_args(argv)

    def go() -> int:
        if args.what == "run":
            return (study.run or default_run)(args, study)
        if not args.check:
            return report(args, study)
        found = check(study)
        for text in found:
            print(text)
        name = study.package.rsplit(".", 1)[-1]
        print(f"{name}: " + ("reports differ" if found else "reports unchanged"))
        return 1 if found else 0

    run_script(go)

"""The lab's layout: every study is a package with a README and one entry point, its committed
reports are what it writes from its committed results (byte for byte), every committed result
file is where experiments/results.sha256 says with the bytes it says, and no study edits the
import path or names this checkout's path."""

import hashlib
import importlib
import re

import pytest

from experiments.lab.cli import check
from experiments.tests.helpers import ROOT

EXPERIMENTS = ROOT / "experiments"
STUDIES = sorted(p.parent.name for p in EXPERIMENTS.glob("*/__main__.py"))
MANIFEST = EXPERIMENTS / "results.sha256"
"""Every committed result file (the studies' evidence) with its SHA-256, as `sha256sum -c`
reads it from the repository's root. A result is added to it when it is committed, and never
regenerated, edited or lost: a file that moves does so with `git mv` and its line follows."""


def _study(name: str):
    return importlib.import_module(f"experiments.{name}.__main__").STUDY


def test_the_lab_holds_the_studies_of_the_issue():
    assert {
        "window_sweep",
        "first_regime_study",
        "laziness_map",
        "claims",
        "far_share",
        "text_only",
        "text_study",
        "regime_study",
    } <= set(STUDIES)


@pytest.mark.parametrize("name", STUDIES)
def test_a_study_is_a_package_with_a_readme_and_one_entry_point(name):
    folder = EXPERIMENTS / name
    study = _study(name)
    assert study.package == f"experiments.{name}" and study.here == folder
    readme = (folder / "README.md").read_text()
    for part in ("the question", "the command", "the answer"):  # a heading or a bold lead
        assert part in readme.lower(), (name, part)
    assert f"python -m experiments.{name}" in readme
    assert importlib.import_module(f"experiments.{name}").__doc__  # the question, in a line
    for config in study.configs:
        assert (folder / config).is_file(), config
    # one entry point: no other module of the study runs as a script
    scripts = [p.name for p in folder.glob("*.py") if "__main__" in p.read_text()]
    assert scripts == ["__main__.py"], scripts


@pytest.mark.parametrize("name", STUDIES)
def test_the_committed_reports_are_what_the_study_writes(name):
    """`python -m experiments.<study> report --check` (make studies): every committed report
    and docs block regenerates byte for byte from the committed results."""
    assert check(_study(name)) == []


def test_every_committed_result_is_where_the_manifest_says():
    lines = [ln.split("  ", 1) for ln in MANIFEST.read_text().splitlines() if ln]
    assert len(lines) >= 285
    for digest, path in lines:
        data = (ROOT / path).read_bytes()  # a missing file fails here, with its path
        assert hashlib.sha256(data).hexdigest() == digest, f"{path} changed"
    # and a folder of results holds no file the manifest does not list
    listed = {path for _, path in lines}
    folders = {str((ROOT / p).parent.relative_to(ROOT)) for p in listed}
    for folder in folders:
        for path in (ROOT / folder).glob("*.json"):
            assert str(path.relative_to(ROOT)) in listed, f"{path}: not in {MANIFEST.name}"


def test_no_study_edits_the_import_path_or_names_this_checkout():
    for path in sorted(EXPERIMENTS.rglob("*.py")):
        assert not re.search(r"sys[.]path[.](insert|append)", path.read_text()), path
    for md in sorted(EXPERIMENTS.rglob("*.md")):
        assert str(ROOT) not in md.read_text(), md

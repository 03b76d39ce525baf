"""The first text-only probe (experiments/text_only): its reduced study end to end (slow tier);
its committed reports regenerate from the archives (experiments/tests/test_studies.py)."""

import pytest

from experiments.tests.helpers import run_study


@pytest.mark.slow
def test_quick_text_only_runs_and_reports(tmp_path):
    args = ("run", "--quick", "--config", "textonly.yaml", "--report-dir", str(tmp_path / "r"))
    r = run_study("experiments.text_only", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    text_only = (tmp_path / "r" / "TEXT_ONLY.md").read_text()
    assert "3 of 3 planned" in text_only
    assert text_only.count("| sx-long | 0 |") == 4  # one row per bucket

"""tools/gpu_check.py, the one command for the GPU paths: its plan on any machine, and its
plumbing (every stage, the JSON and Markdown report) at toy sizes on the CPU (slow tier)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "tools/gpu_check.py", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


def test_dry_run_lists_every_stage_within_eight_minutes(tmp_path):
    r = _run("--dry-run", "--out", str(tmp_path / "g.json"))
    assert r.returncode == 0, r.stderr
    for stage in ("tests", "mlstm_grad", "ops", "train", "decode"):
        assert f"  {stage} " in r.stdout
    limits = sum(float(x) for x in __import__("re").findall(r"limit\s+(\d+) s", r.stdout))
    assert 0 < limits <= 480
    assert "train 350m SX seq 16384" in r.stdout and "train 350m A seq 16384" in r.stdout
    assert not (tmp_path / "g.json").exists()  # a dry run writes nothing


def test_unknown_stage_is_one_clear_error(tmp_path):
    r = _run("--only", "tests,bogus", "--dry-run")
    assert r.returncode == 2
    assert "bogus" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_cpu_smoke_writes_the_report(tmp_path):
    out = tmp_path / "gpu_check.json"
    r = _run("--cpu-smoke", "--out", str(out), "--only", "ops,train,decode")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert {"device", "versions", "stages", "tests", "train"} <= set(rep)
    assert [(t["preset"], t["pattern"]) for t in rep["train"]] == [("tiny", "SX"), ("tiny", "A")]
    assert all(t["tok_s"] > 0 and 0 < t["mfu"] < 1 for t in rep["train"])
    ops = rep["stages"]["ops"]["result"]["rows"]
    assert {r["op"] for r in ops} >= {"sdpa_causal", "mlstm[native]"}
    dec = rep["stages"]["decode"]["result"]["rows"]
    assert all(r["tok_s"] > 0 for r in dec)
    assert "**train**" in out.with_suffix(".md").read_text()

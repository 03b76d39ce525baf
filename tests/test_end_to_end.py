"""Slow tier (make test-slow): long-context prefill, the demo, benchmark smoke runs."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(args, timeout=900):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_prefill_131k_tokens_without_quadratic_tensors():
    r = run(["benchmarks/prefill.py", "--tokens", "131072"])
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no T×T or T×vocab tensor: yes" in r.stdout
    rss = float(r.stdout.split("peak RSS")[1].split("GiB")[0])
    assert rss < 4.0


def test_demo_runs():
    r = run(["-m", "swax", "demo", "--context", "8192"])
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "decode state" in ln]
    assert len(lines) == 2
    # constant-memory state: the same size after 1k and after 8k tokens
    assert lines[0].split("decode state")[1] == lines[1].split("decode state")[1]


def test_ops_benchmark_smoke(tmp_path):
    out = tmp_path / "ops.csv"
    r = run(["benchmarks/ops.py", "--T", "256", "--repeat", "1", "--csv", str(out)])
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    for op in ("swa", "mlstm", "gdn"):
        assert f"\n{op}," in text
    assert "x_vs_sdpa+mask" in text and "x_vs_native_custbw" in text


def test_generate_long_prompt_file(tmp_path):
    prompt = tmp_path / "prompt.txt"
    text = "And God said, Let there be light: and there was light. " * 400
    prompt.write_text(text)
    r = run(["-m", "swax", "generate", "--prompt-file", str(prompt), "--max-new-tokens", "16",
             "--prefill-chunk", "1000", "--stop", "zzz", "--dtype", "bfloat16"])
    assert r.returncode == 0, r.stderr
    assert f"{len(text.encode())} prompt tokens" in r.stderr

"""Slow tier (make test-slow): long-context prefill, the demo, benchmark smoke runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run(args, timeout=900):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


def test_prefill_131k_tokens_without_quadratic_tensors():
    r = run(["benchmarks/prefill.py", "--tokens", "131072"])
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no T×T or T×vocab tensor: yes" in r.stdout
    rss = float(r.stdout.split("peak RSS")[1].split("GiB")[0])
    assert rss < 4.0


def test_precision_benchmark_smoke(tmp_path):
    out = tmp_path / "precision.csv"
    args = ["--threads", "1", "--cases", "sx64", "--rounds", "1", "--csv", str(out)]
    r = run(["benchmarks/precision.py", *args])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "## matmul ceiling" in r.stdout and "SX d64 2L T=256" in r.stdout
    assert "bf16/fp32" in out.read_text()


def test_copy_probe_benchmark_smoke():
    r = run(
        [
            "benchmarks/copy_probe.py",
            "--fit-tokens",
            "200000",
            "--heldout-tokens",
            "100000",
            "--events",
            "50",
            "--rounds",
            "1",
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [ln for ln in r.stdout.splitlines() if ln.lstrip().startswith(("n-gram", "copy ev"))]
    assert len(rows) == 2 and all(ln.split()[-1] == "yes" for ln in rows), r.stdout


def test_ops_benchmark_smoke(tmp_path):
    out = tmp_path / "ops.csv"
    r = run(["benchmarks/ops.py", "--T", "256", "--repeat", "1", "--csv", str(out)])
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    for op in ("swa", "mlstm", "gdn"):
        assert f"\n{op}," in text
    assert "x_vs_sdpa+mask" in text and "x_vs_native_custbw" in text


def test_decode_compare_benchmark_smoke(tmp_path):
    """The issue-34 comparison in its --quick form: eager, compiled (one inductor compile per
    batch), the bounds and the Llama, and the targets' lines (no number is checked)."""
    out = tmp_path / "decode_compare.csv"
    r = run(["benchmarks/decode.py", "--quick", "--threads", "1", "--csv", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "## targets (issue 34)" in r.stdout and "tiny 1,024 x1 compiled vs eager" in r.stdout
    text = out.read_text()
    assert "compiled" in text.splitlines()[0] and "llama" in text.splitlines()[0]
    # the decode weights (issue 45): int8 and bf16 against float32 at batch 1
    assert "## decode weights at batch 1 (issue 45)" in r.stdout
    weights = (tmp_path / "decode_compare_weights.csv").read_text().splitlines()
    assert weights[0].startswith("preset,context,weights,compiled")
    assert [line.split(",")[2] for line in weights[1:]] == ["float32", "int8", "bf16"]


def test_train_speed_benchmark_smoke(tmp_path):
    out = tmp_path / "train_speed.csv"
    r = run(
        [
            "benchmarks/train_speed.py",
            "--presets",
            "tiny",
            "--patterns",
            "SX",
            "A",
            "--seq",
            "128",
            "256",
            "--tokens-per-step",
            "512",
            "--steps",
            "1",
            "--csv",
            str(out),
        ]
    )
    assert r.returncode == 0, r.stderr
    rows = out.read_text().splitlines()
    assert len(rows) == 1 + 4, rows  # header + 2 patterns x 2 lengths
    assert (tmp_path / "train_speed.png").is_file()


def test_decode_benchmark_smoke(tmp_path):
    out = tmp_path / "decode.csv"
    r = run(
        [
            "benchmarks/decode.py",
            "--patterns",
            "SX",
            "A",
            "--contexts",
            "256",
            "1024",
            "--steps",
            "4",
            "--rounds",
            "1",
            "--csv",
            str(out),
        ]
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.count("\nSX,") == 2 and text.count("\nA,") == 2, text
    # the SX state is the same size at both contexts; the attention cache is not
    assert "state bytes x1.00" in r.stdout


def test_generate_long_prompt_file(tmp_path):
    prompt = tmp_path / "prompt.txt"
    text = "And God said, Let there be light: and there was light. " * 400
    prompt.write_text(text)
    r = run(
        [
            "-m",
            "swax",
            "generate",
            "--prompt-file",
            str(prompt),
            "--max-new-tokens",
            "16",
            "--prefill-chunk",
            "1000",
            "--stop",
            "zzz",
            "--dtype",
            "bfloat16",
        ]
    )
    assert r.returncode == 0, r.stderr
    assert f"{len(text.encode())} prompt tokens" in r.stderr


def test_train_then_generate_from_the_trained_model(tmp_path):
    run_dir = tmp_path / "demo"
    r = run(
        [
            "-m",
            "swax",
            "demo",
            "--run-dir",
            str(run_dir),
            "--context",
            "4096",
            "steps=60",
            "log.val_every=0",
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("validation loss"))
    untrained = float(line.split("untrained")[1].split("->")[0])
    trained = float(line.split("trained")[-1])
    assert trained < untrained - 1.0, line
    assert "sample (temperature" in r.stdout
    # a second demo reuses the finished run instead of overwriting it
    before = (run_dir / "model" / "model.safetensors").read_bytes()
    r2 = run(["-m", "swax", "demo", "--run-dir", str(run_dir), "--context", "2048"])
    assert r2.returncode == 0 and "reusing the finished run" in r2.stdout
    assert (run_dir / "model" / "model.safetensors").read_bytes() == before
    g = run(
        [
            "-m",
            "swax",
            "generate",
            "--model",
            str(run_dir / "model"),
            "--prompt",
            "And the LORD",
            "--max-new-tokens",
            "40",
            "--no-stream",
        ]
    )
    assert g.returncode == 0, g.stderr
    assert "40 new tokens" in g.stderr or "new tokens" in g.stderr


def test_eval_niah_131k_random_tiny_model_under_4gib(tmp_path):
    r = run(
        [
            "-m",
            "swax",
            "eval",
            "niah",
            "--preset",
            "tiny",
            "--lengths",
            "131k",
            "--tasks",
            "niah_single_1,niah_multikey_2",
            "--samples",
            "1",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)
    peak = float(r.stdout.split("peak memory:")[1].split("GiB")[0])
    assert peak < 4.0
    assert "128k" in r.stdout and "niah_multikey_2" in r.stdout


def test_readme_commands_after_make_demo(tmp_path):
    """The README's block of commands for after `make demo`, pasted in order, twice: `swax demo`
    (fewer steps) makes runs/demo in a fresh folder whose .venv is this interpreter's, then
    every command of the block runs there with its exit status 0, and again (the block is
    re-runnable). The training command comes first, so every later command reads the model it
    extends."""

    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- readme-commands:begin -->")[1].split("<!-- readme-commands:end -->")[0]
    commands = [ln.split("  #")[0].strip() for ln in block.splitlines()]
    commands = [c for c in commands if c.startswith(".venv/bin/")]
    assert len(commands) >= 10
    os.symlink(sys.prefix, tmp_path / ".venv")
    env = {**os.environ, "SWAX_THREADS": "1"}
    demo = subprocess.run(
        [str(tmp_path / ".venv/bin/swax"), "demo", "steps=30", "--context", "4096"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    _assert_clean(demo.stdout + demo.stderr, "swax demo")
    assert "swax train" in commands[0] and not any("swax train" in c for c in commands[1:])
    for cmd in commands + commands:
        # the README extends the 400-step demo run by 20 steps; here the demo ran 30
        cmd = re.sub(r"resume=true steps=\d+", "resume=true steps=40", cmd)
        r = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-1500:]}\n{r.stderr[-2500:]}"
        _assert_clean(r.stdout + r.stderr, cmd)


REPR = re.compile(
    r"\{'|\[\(|\b[A-Z]\w*\(\w+=|\b[A-Z][a-z]\w*Window\(|<[\w.]+ object at 0x|\w*Path\('"
    r"|namespace\(|torchvision is not installed|Traceback"
)
"""What a person should never read in swax's output: a Python dict/list/object repr, a
third-party warning they cannot act on, a traceback."""


def _assert_clean(output: str, what: str) -> None:
    """No carriage return (a progress bar's redraw in a log) and no Python repr in ``output``."""
    assert "\r" not in output, f"{what}: a carriage return in piped output"
    found = REPR.search(output)
    assert found is None, (
        f"{what}: {found.group(0)!r} in: {output[max(0, found.start() - 200) : found.end() + 200]}"
    )


TRAINED_SPREAD = 0.02
"""Twice the spread of the trained demo's loss over the thread counts and CPUs measured (0.010):
a documented loss further than this from a fresh run's is stale, not a rounding order."""


@pytest.mark.slow
def test_the_documented_demo_losses_are_a_fresh_runs(tmp_path):
    """The losses README.md and docs/demo.md quote for `make demo` are what a fresh `swax demo`
    prints, within TRAINED_SPREAD after training (the untrained loss within 0.01): 400 steps
    carry float32 rounding-order differences into the loss, so thread counts and CPUs end
    apart (measured with the same code: 1.281 on two threads, 1.288 and 1.291 on one thread of
    two different CPUs, the last an AVX2-only one)."""
    env = {**os.environ, "SWAX_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "swax", "demo", "--context", "2048"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    found = re.search(r"untrained (\d+\.\d+) -> trained (\d+\.\d+)", r.stdout)
    assert found, r.stdout[-2000:]
    before, after = float(found.group(1)), float(found.group(2))
    readme = re.search(
        r"loss falls from (\d+\.\d+) to (\d+\.\d+) nats/byte", " ".join(_readme().split())
    )
    assert readme, "the README's sentence on the demo's loss"
    assert abs(float(readme.group(1)) - before) <= 0.01
    assert abs(float(readme.group(2)) - after) <= TRAINED_SPREAD
    demo = (ROOT / "docs" / "demo.md").read_text()
    row = re.search(r"\| (\d+\.\d+) untrained → \*\*(\d+\.\d+)\*\* \|", demo)
    assert row, "docs/demo.md's table of the demo's loss"
    assert abs(float(row.group(1)) - before) <= 0.01
    assert abs(float(row.group(2)) - after) <= TRAINED_SPREAD


def _readme() -> str:
    return (ROOT / "README.md").read_text()

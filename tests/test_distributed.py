"""Slow tier: 2-process gloo runs under torchrun (DDP and FSDP2) against 1 process."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ARGS = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "seq_len=64",
    "batch_size=4",
    "window.short=8",
    "window.long=32",
    "log.val_batches=2",
    "log.every=1",
    "log.val_every=3",
    "optim.warmup_steps=2",
    "threads=1",
    "steps=6",
    "checkpoint.every=3",
]


def metrics(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def run_swax(args, nproc=1):
    prefix = [sys.executable]
    if nproc > 1:
        prefix += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    r = subprocess.run(
        [*prefix, "-m", "swax", "train", *args], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run = tmp_path_factory.mktemp("dist") / "one"
    run_swax([*ARGS, f"run_dir={run}"])
    return metrics(run)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one(tmp_path, single, strategy):
    run = tmp_path / strategy
    run_swax([*ARGS, f"run_dir={run}", f"dist.strategy={strategy}"], nproc=2)
    got = metrics(run)
    assert len(got) == len(single)
    for a, b in zip(single, got):
        assert a["step"] == b["step"]
        for key in ("loss", "val_loss"):
            if key in a:
                assert abs(a[key] - b[key]) < 1e-5, (strategy, a["step"], key, a[key], b[key])
        if "window" in a:
            assert a["window"] == b["window"]
    # the checkpoint of a sharded run resumes in a single process
    r = run_swax([*ARGS, f"run_dir={run}", "steps=8", "resume=true"])
    assert "resumed from step_000006" in r.stderr


def test_torch_compile_matches_eager(tmp_path, single):
    run = tmp_path / "compiled"
    run_swax([*ARGS, f"run_dir={run}", "compile=true"])
    for a, b in zip(single, metrics(run)):
        for key in ("loss", "val_loss"):
            if key in a:
                assert abs(a[key] - b[key]) < 1e-5, (a["step"], key, a[key], b[key])

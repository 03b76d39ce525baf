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


def test_sigterm_to_torchrun_stops_every_rank_at_one_step_and_resumes(tmp_path):
    """SIGTERM to torchrun (what a scheduler sends): it is forwarded to both ranks, which agree
    on one step, save one checkpoint together and exit; resuming under torchrun ends with the
    uninterrupted 2-process run's weights exactly."""
    import signal
    import time

    import torch

    from swax import SwaxLM

    args = [*ARGS, "steps=14", "checkpoint.every=100", "log.val_every=0"]
    ref = tmp_path / "ref"
    run_swax([*args, f"run_dir={ref}"], nproc=2)
    run = tmp_path / "int"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    proc = subprocess.Popen(
        [*cmd, "-m", "swax", "train", *args, f"run_dir={run}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    t0 = time.time()
    while not (
        (run / "metrics.jsonl").is_file()
        and (run / "metrics.jsonl").read_text().count('"loss"') >= 4
    ):
        assert proc.poll() is None and time.time() - t0 < 900, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    err = proc.communicate()[1]
    assert proc.returncode != 0
    assert "stopped by SIGTERM after step" in err, err[-3000:]
    stopped = [ln for ln in err.splitlines() if "stopped by SIGTERM after step" in ln]
    assert len({ln.split("after step ")[1].split(":")[0] for ln in stopped}) == 1  # one step
    run_swax([*args, f"run_dir={run}", "resume=true"], nproc=2)
    a = SwaxLM.from_pretrained(ref / "model").state_dict()
    b = SwaxLM.from_pretrained(run / "model").state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name

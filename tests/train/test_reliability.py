"""Reliability of training runs: signals stop at a step boundary and resume bit-exactly, one
writer per run folder, corrupt checkpoints are skipped, checksums catch flipped bits, metrics
are standard JSON, files get ordinary modes."""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch

from swax import SwaxLM
from swax.core.errors import CheckpointError, ConfigError
from swax.train import train
from swax.train.checkpoint import latest_checkpoint, list_checkpoints, read_trainer_state
from swax.train.runctl import RunLock, TrainingStopped
from tests.train.test_train import SMALL, small_cfg

STEPS = ["steps=12", "checkpoint.every=4", "checkpoint.keep=3"]


def weights(run_dir):
    return SwaxLM.from_pretrained(run_dir / "model").state_dict()


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every interrupted one must reproduce exactly."""
    root = tmp_path_factory.mktemp("ref")
    summary = train(small_cfg(root, *STEPS, name="ref"))
    return root / "ref", summary


def _signal_during(monkeypatch, module, name, at_call, signums):
    """Send ``signums`` to this process from inside call number ``at_call`` of module.name,
    half-way through it (after the wrapped function has run its first part: we call the real
    function after signalling, so the signal lands while the step or write is in progress)."""
    real = getattr(module, name)
    calls = {"n": 0}

    def wrapped(*a, **k):
        calls["n"] += 1
        if calls["n"] == at_call:
            for s in signums:
                os.kill(os.getpid(), s)
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapped)
    return calls


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_step_stops_at_the_boundary_and_resumes_exactly(
    tmp_path, monkeypatch, reference, signum
):
    """The signal arrives inside step 7's forward/backward (its batch already taken from the
    loader): the step finishes, step 7 is saved with the loader, optimizer and RNG of step 7,
    and the resumed run ends with the reference's weights, bit for bit."""
    import swax.train.step as T

    _signal_during(monkeypatch, T, "_forward_backward", 7, [signum])
    with pytest.raises(TrainingStopped) as info:
        train(small_cfg(tmp_path, *STEPS, name="r"))
    assert info.value.exit_code == 128 + signum
    ck = latest_checkpoint(tmp_path / "r")
    assert ck.name == "step_000007"
    state = read_trainer_state(ck)
    assert state["loader"]["consumed"] == 7 * 4  # 7 steps of batch_size 4, not one ahead
    monkeypatch.undo()
    summary = train(small_cfg(tmp_path, *STEPS, "resume=true", name="r"))
    assert summary["final_val_loss"] == reference[1]["final_val_loss"]
    assert_same_weights(tmp_path / "r", reference[0])


def test_the_command_line_prints_the_stop_line_once(tmp_path, monkeypatch, capsys):
    import swax.train.step as T
    from swax.cli import main

    _signal_during(monkeypatch, T, "_forward_backward", 3, [signal.SIGINT])
    rc = main(["train", *SMALL, *STEPS, f"run_dir={tmp_path / 'once'}"])
    err = capsys.readouterr().err
    assert rc == 130
    assert err.count("stopped by SIGINT after step 3") == 1, err[-2000:]


def test_signal_during_a_checkpoint_write_completes_it(tmp_path, monkeypatch, reference):
    """SIGTERM while step 8's checkpoint is written: the write completes, the run stops
    without writing step 8 twice, and resumes exactly."""
    import swax.train.checkpoint as C

    _signal_during(monkeypatch, C, "_write_files", 2, [signal.SIGTERM])
    with pytest.raises(TrainingStopped, match="after step 8"):
        train(small_cfg(tmp_path, *STEPS, name="w"))
    assert [p.name for p in list_checkpoints(tmp_path / "w")] == ["step_000004", "step_000008"]
    assert not list((tmp_path / "w" / "checkpoints").glob("*.tmp"))
    monkeypatch.undo()
    train(small_cfg(tmp_path, *STEPS, "resume=true", name="w"))
    assert_same_weights(tmp_path / "w", reference[0])


def test_second_signal_stops_at_once_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch, reference, capfd
):
    """Two Ctrl-C during step 8's checkpoint write: the write is abandoned (no message claims
    it was saved), step 4 stays the latest, and resume cleans the leftover and ends exactly."""
    import swax.train.checkpoint as C

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the tests run as a background job
    _signal_during(monkeypatch, C, "_write_files", 2, [signal.SIGINT, signal.SIGINT])
    with pytest.raises(KeyboardInterrupt) as info:
        train(small_cfg(tmp_path, *STEPS, name="d"))
    assert not isinstance(info.value, TrainingStopped)
    err = capfd.readouterr().err
    assert "second SIGINT: stopping now, without saving" in err
    assert "saved" not in err.split("second SIGINT")[1]
    assert latest_checkpoint(tmp_path / "d").name == "step_000004"
    assert (tmp_path / "d" / "checkpoints" / "step_000008.tmp").is_dir()
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    monkeypatch.undo()
    train(small_cfg(tmp_path, *STEPS, "resume=true", name="d"))
    assert not (tmp_path / "d" / "checkpoints" / "step_000008.tmp").exists()
    assert_same_weights(tmp_path / "d", reference[0])


def test_repeated_sigterm_still_saves(tmp_path, monkeypatch, reference):
    """SLURM signals every process of a job step and torchrun forwards its own copy: a worker
    gets SIGTERM twice. The second is not an escalation: the checkpoint is still written."""
    import swax.train.step as T

    _signal_during(monkeypatch, T, "_forward_backward", 6, [signal.SIGTERM, signal.SIGTERM])
    with pytest.raises(TrainingStopped, match="after step 6"):
        train(small_cfg(tmp_path, *STEPS, name="tt"))
    assert latest_checkpoint(tmp_path / "tt").name == "step_000006"
    monkeypatch.undo()
    train(small_cfg(tmp_path, *STEPS, "resume=true", name="tt"))
    assert_same_weights(tmp_path / "tt", reference[0])


def test_half_renamed_resave_is_put_back(tmp_path):
    """Killed between the two renames of a re-save (step_N -> step_N.old, step_N.tmp -> step_N):
    resume puts the complete copy back instead of deleting both as leftovers."""
    import shutil

    train(small_cfg(tmp_path, "steps=8", "checkpoint.every=4", name="h"))
    ck = tmp_path / "h" / "checkpoints"
    (ck / "step_000008").rename(ck / "step_000008.old")
    shutil.copytree(ck / "step_000008.old", ck / "step_000008.tmp")
    (ck / "step_000008.tmp" / "trainer.json").unlink()  # the new copy was incomplete
    summary = train(small_cfg(tmp_path, "steps=10", "checkpoint.every=4", "resume=true", name="h"))
    assert summary["steps_run"] == 2  # resumed from step 8, not step 4
    assert not list(ck.glob("*.old")) and not list(ck.glob("*.tmp"))


def test_a_second_writer_is_refused(tmp_path):
    """While one process holds the run folder, train() refuses it with the holder's pid and
    touches nothing in it."""
    run_dir = tmp_path / "busy"
    train(small_cfg(tmp_path, "steps=2", name="busy"))
    before = {
        p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".swax.lock"
    }
    with RunLock(run_dir):
        with pytest.raises(ConfigError, match=rf"in use by another swax train \(pid {os.getpid()}"):
            train(small_cfg(tmp_path, "steps=4", "resume=true", name="busy"))
        with pytest.raises(ConfigError, match="in use"):
            train(small_cfg(tmp_path, "steps=4", "overwrite=true", name="busy"))
    after = {
        p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".swax.lock"
    }
    assert after == before
    train(small_cfg(tmp_path, "steps=4", "resume=true", name="busy"))  # free again


def test_another_process_holding_the_run_is_named_and_its_kill_frees_it(tmp_path):
    """A second process holds the run folder: train() is refused naming its pid; killed with
    SIGKILL (no clean-up at all), it leaves no stale lock to remove by hand."""
    run_dir = tmp_path / "held"
    code = (
        "import sys, time; from swax.train.runctl import RunLock; lock = RunLock(sys.argv[1]); "
        "lock.acquire(); print('held', flush=True); time.sleep(600)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"another swax train \(pid {child.pid} on"):
            train(small_cfg(tmp_path, "steps=2", name="held"))
    finally:
        child.kill()
        child.wait()
    train(small_cfg(tmp_path, "steps=2", name="held"))
    assert not (run_dir / ".swax.lock.holder").exists()  # the holder's name goes with the lock


def _flip_byte(path, offset_from_end=100):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))


def test_corrupt_latest_checkpoint_falls_back_to_the_one_before(
    tmp_path, monkeypatch, reference, capfd
):
    """Stop after step 9, flip one bit of step 9's weights, leave a partial metrics line and
    stale temporary files: resume warns naming step_000009 and the metrics file, resumes from
    step 8, removes the leftovers and still ends exactly at the reference."""
    import swax.train.step as T

    _signal_during(monkeypatch, T, "_forward_backward", 9, [signal.SIGTERM])
    with pytest.raises(TrainingStopped):
        train(small_cfg(tmp_path, *STEPS, name="c"))
    monkeypatch.undo()
    run_dir = tmp_path / "c"
    _flip_byte(run_dir / "checkpoints" / "step_000009" / "model.safetensors")
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 10, "loss": 1.2')  # a crash half-way through a line
    (run_dir / "checkpoints" / "step_000010.tmp").mkdir()
    (run_dir / "model").mkdir()
    (run_dir / "model" / "model.safetensors.tmp").write_bytes(b"partial")
    capfd.readouterr()
    train(small_cfg(tmp_path, *STEPS, "resume=true", name="c"))
    err = capfd.readouterr().err
    assert "skipping step_000009 (renamed step_000009.corrupt)" in err and "SHA-256" in err
    assert "resumed from step_000008" in err
    assert f"{run_dir / 'metrics.jsonl'}:" in err
    assert not (run_dir / "checkpoints" / "step_000010.tmp").exists()
    assert not (run_dir / "model" / "model.safetensors.tmp").exists()
    assert (run_dir / "checkpoints" / "step_000009.corrupt").is_dir()  # kept, not a checkpoint
    assert_same_weights(run_dir, reference[0])
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 13))  # once each, in order


def test_no_intact_checkpoint_is_one_error(tmp_path):
    train(small_cfg(tmp_path, "steps=4", "checkpoint.every=2", name="x"))
    for ck in list_checkpoints(tmp_path / "x"):
        (ck / "trainer.json").write_text('{"step": ')  # truncated
    with pytest.raises(
        CheckpointError, match="no intact checkpoint.*step_000004, step_000002 are corrupt"
    ):
        train(small_cfg(tmp_path, "steps=6", "resume=true", name="x"))


def test_resume_with_another_model_names_the_difference(tmp_path):
    """Resuming with another model: the run's config.yaml names the key and both values; with
    config.yaml gone, loading the checkpoint names the mismatched shape and the saved model."""
    train(small_cfg(tmp_path, "steps=2", name="m"))
    with pytest.raises(ConfigError) as info:
        small_cfg(tmp_path, "steps=4", "resume=true", "model.d_model=48", name="m")
    msg = str(info.value)
    assert "model.d_model=48 differs from the run being resumed" in msg
    assert "model.d_model=32" in msg
    (tmp_path / "m" / "config.yaml").unlink()
    with pytest.raises(CheckpointError) as info:
        train(small_cfg(tmp_path, "steps=4", "resume=true", "model.d_model=48", name="m"))
    msg = str(info.value)
    assert "does not match this model" in msg
    assert "has shape" in msg  # a shape named, not torch's bare "Error(s) in loading"
    assert "'d_model': 32" in msg  # the model it was trained with


def test_flipped_bit_in_exported_weights_is_an_error(tmp_path):
    """One flipped bit in model/model.safetensors: loading fails naming the file (before the
    checksums it loaded silently and generated garbage); the CLI prints one line, exit 2."""
    train(small_cfg(tmp_path, "steps=2", name="f"))
    model_dir = tmp_path / "f" / "model"
    good = SwaxLM.from_pretrained(model_dir)  # intact: loads
    _flip_byte(model_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors does not match its SHA-256"):
        SwaxLM.from_pretrained(model_dir)
    flipped = SwaxLM.from_pretrained(model_dir, verify=False)  # explicitly unchecked
    assert any(
        not torch.equal(a, b)
        for a, b in zip(good.state_dict().values(), flipped.state_dict().values())
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "swax",
            "generate",
            "--model",
            str(model_dir),
            "--prompt",
            "a",
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "SHA-256" in r.stderr
    # sha256sum's own format
    line = (model_dir / "checksums.sha256").read_text().splitlines()[0]
    digest, name = line.split("  ")
    assert name == "model.safetensors" and len(digest) == 64


def _strict_json(line):
    def no_constant(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=no_constant)


def test_metrics_are_standard_json_without_clipping_or_validation(tmp_path):
    """grad_clip=0 used to log grad_norm NaN and val_fraction=0 a NaN validation loss: bare
    NaN is not JSON. Now the norm is measured anyway and a missing value is null."""
    train(small_cfg(tmp_path, "steps=3", "optim.grad_clip=0", "data.val_fraction=0", name="j"))
    rows = [_strict_json(ln) for ln in (tmp_path / "j" / "metrics.jsonl").read_text().splitlines()]
    norms = [r["grad_norm"] for r in rows if "grad_norm" in r]
    assert len(norms) == 3 and all(isinstance(n, float) and n > 0 for n in norms)
    assert all(r["val_loss"] is None for r in rows if "val_loss" in r)
    _strict_json((tmp_path / "j" / "summary.json").read_text())


def test_saved_files_get_the_umask_mode(tmp_path):
    """safetensors creates its files 0600; every file of a run gets 0666 less the umask, the
    mode of config.json beside it."""
    old = os.umask(0o022)
    try:
        train(small_cfg(tmp_path, "steps=2", "checkpoint.every=1", name="p"))
    finally:
        os.umask(old)
    run_dir = tmp_path / "p"
    files = [
        run_dir / "model" / "model.safetensors",
        run_dir / "model" / "config.json",
        *(latest_checkpoint(run_dir)).glob("*"),
    ]
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
    assert set(modes.values()) == {0o644}, modes


# ------------------------------------------------------------------------------ real signals


def _cli_train(run_dir, *extra):
    args = [sys.executable, "-m", "swax", "train", *SMALL, f"run_dir={run_dir}", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(run_dir, n, proc, timeout=900):
    t0 = time.time()
    path = run_dir / "metrics.jsonl"
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.communicate()[1][-2000:]}")
        if path.is_file() and sum(1 for ln in path.read_text().splitlines() if '"loss"' in ln) >= n:
            return
        time.sleep(0.02)
    raise AssertionError("training too slow")


@pytest.mark.slow
def test_sigterm_and_sigint_to_the_cli_at_random_times_resume_exactly(tmp_path):
    """What a scheduler does: SIGTERM (or a user's Ctrl-C) at an arbitrary moment of a real
    `swax train` process, several times over one run; each stops with exit 128 + signal and a
    line naming the checkpoint; the resumed runs end with the uninterrupted run's weights."""
    steps = ["steps=30", "checkpoint.every=7"]
    ref = _cli_train(tmp_path / "ref", *steps)
    assert ref.wait(timeout=600) == 0, ref.communicate()[1][-2000:]
    run_dir = tmp_path / "int"
    delays = [0.0, 0.013, 0.031]  # after a step's metrics line: mid-step or mid-write
    for i, (sig, delay) in enumerate(zip([signal.SIGTERM, signal.SIGINT, signal.SIGTERM], delays)):
        proc = _cli_train(run_dir, *steps, *(["resume=true"] if i else []))
        _wait_for_steps(run_dir, 5 + 7 * i, proc)
        time.sleep(delay)
        proc.send_signal(sig)
        rc = proc.wait(timeout=300)
        err = proc.communicate()[1]
        assert rc == 128 + sig, err[-2000:]
        assert f"stopped by {signal.Signals(sig).name} after step" in err
        assert "Traceback" not in err
    proc = _cli_train(run_dir, *steps, "resume=true")
    assert proc.wait(timeout=600) == 0, proc.communicate()[1][-2000:]
    assert_same_weights(run_dir, tmp_path / "ref")


@pytest.mark.slow
def test_two_cli_trainings_on_one_run_dir(tmp_path):
    run_dir = tmp_path / "two"
    first = _cli_train(run_dir, "steps=1000000")  # busy until the SIGTERM below
    _wait_for_steps(run_dir, 1, first)
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "swax",
            "train",
            *SMALL,
            f"run_dir={run_dir}",
            "steps=5",
            "overwrite=true",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 2
    assert f"in use by another swax train (pid {first.pid}" in second.stderr
    assert second.stderr.count("\n") == 1
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=300) == 143


# ------------------------------------------------------------------------------ a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root only), unmounted afterwards; the test is skipped where it cannot be
    mounted (not root, or no permission to mount in this container)."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is tested on a small tmpfs, which needs root to mount")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(disk, leave: int):
    """A file on ``disk`` that leaves about ``leave`` bytes free; returns its path."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


@pytest.mark.slow
def test_a_full_disk_stops_with_one_line_and_resume_after_freeing_is_exact(tmp_path, small_disk):
    """The second checkpoint of a run does not fit: one error line naming it and the path,
    exit 2, no partial checkpoint left, the first intact; after space is freed, resume=auto
    ends with the uninterrupted run's weights. An export onto a full disk is the same."""
    steps = ["steps=9", "checkpoint.every=3", "checkpoint.keep=3", "log.val_every=0"]
    _cli_train(tmp_path / "ref", *steps).wait(timeout=600)
    size = sum(
        f.stat().st_size for f in (tmp_path / "ref" / "checkpoints" / "step_000003").iterdir()
    )
    run = small_disk / "run"
    filler = _fill(small_disk, int(1.5 * size) + 64 * 1024)  # one checkpoint fits, not two
    proc = _cli_train(run, *steps)
    assert proc.wait(timeout=600) == 2
    err = proc.communicate()[1].strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith(
        "swax: error: no space left on the device writing checkpoint step_000006 to "
    ), err[-3:]
    assert latest_checkpoint(run).name == "step_000003"
    assert not list((run / "checkpoints").glob("*.tmp"))  # the partial one is gone
    filler.unlink()
    proc = _cli_train(run, *steps, "resume=auto")
    assert proc.wait(timeout=600) == 0, proc.communicate()[1][-2000:]
    assert_same_weights(run, tmp_path / "ref")
    # an export onto a full disk: one line, exit 2, nothing half-written left as the folder
    filler = _fill(small_disk, 16 * 1024)
    r = subprocess.run(
        [sys.executable, "-m", "swax", "export", "hf", str(run / "model"), str(small_disk / "hf")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("swax: error: no space left on the device")
    assert not (small_disk / "hf").exists() or not any((small_disk / "hf").iterdir())

"""Bad steps survived (swax.train.guard): a non-finite gradient skips the step, K bad steps in
a row or a non-finite loss roll back to the last checkpoint and skip the batches that caused
it, and a run that went through that ends with the weights of a run that never saw them. The
faults come from the test hook $SWAX_TEST_FAULTS (no config key)."""

import contextlib
import json
import math
import os
import statistics
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from swax.core.errors import CheckpointError
from swax.train import TrainingError, load_train_config, train
from swax.train.checkpoint import list_checkpoints, load_checkpoint
from swax.train.config import GuardConfig
from swax.train.guard import FAULTS_ENV, StepGuard, Verdict
from tests.train.test_train import Stop, stop_at

SMALL = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "seq_len=32",
    "batch_size=2",
    "window.short=8",
    "window.long=16",
    "log.val_batches=1",
    "log.every=1",
    "log.val_every=0",
    "optim.warmup_steps=2",
    "threads=1",
    "data.val_fraction=0",
]


@contextlib.contextmanager
def injected(**faults):
    """The fault injector for the runs inside: $SWAX_TEST_FAULTS set, then restored."""
    before = os.environ.get(FAULTS_ENV)
    os.environ[FAULTS_ENV] = json.dumps(faults)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FAULTS_ENV, None)
        else:
            os.environ[FAULTS_ENV] = before


def run(tmp_path, name, *extra, faults=None, on_step_end=None):
    cfg = load_train_config(None, [*SMALL, f"run_dir={tmp_path / name}", *extra])
    with injected(**faults) if faults else contextlib.nullcontext():
        summary = train(cfg, on_step_end=on_step_end)
    return summary, load_file(str(tmp_path / name / "model" / "model.safetensors"))


def records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines]


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nan_gradient_skips_the_step_and_equals_a_run_without_the_batch(tmp_path):
    _, plain = run(tmp_path, "plain", "steps=6")
    _, hit = run(tmp_path, "hit", "steps=6", faults={"nan_grad": [3]})
    _, ref = run(tmp_path, "ref", "steps=6", "guard.skip_batches=[3]")
    assert same(hit, ref)
    assert not same(hit, plain)  # the skipped batch mattered: the comparison can fail
    skipped = [r for r in records(tmp_path / "hit") if "skipped" in r]
    assert [(r["step"], r["batch"]) for r in skipped] == [(4, 3)]
    assert "gradient norm nan" in skipped[0]["skipped"]
    steps = [r["step"] for r in records(tmp_path / "hit") if "tokens" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 4 was trained again, on batch 4


def test_bad_steps_in_a_row_roll_back_and_skip_their_batches(tmp_path, capsys):
    args = ["steps=8", "checkpoint.every=3", "guard.max_bad_in_row=3"]
    summary, hit = run(tmp_path, "hit", *args, faults={"nan_grad": [4, 5, 6]})
    _, ref = run(tmp_path, "ref", *args, "guard.skip_batches=[4,5,6]")
    _, plain = run(tmp_path, "plain", *args)
    assert same(hit, ref) and not same(hit, plain)
    # steps 1-4 trained, three skipped tries, back to step 3, steps 4-8 trained: 9 optimizer
    # steps taken (the run's step count alone, 8 - 3, would say 5)
    assert summary["steps_run"] == 9
    err = capsys.readouterr()
    text = err.out + err.err
    assert "3 bad steps in a row at step 5: rolled back to step_000003" in text
    rows = records(tmp_path / "hit")
    back = [r for r in rows if "rollback" in r]
    assert len(back) == 1 and back[0]["skip_batches"] == [4, 5, 6]
    # the replayed step 4 trained on batch 3 again, then step 5 on batch 7
    trained = [(r["step"], r["batch"]) for r in rows if "tokens" in r]
    assert trained[-5:] == [(4, 3), (5, 7), (6, 8), (7, 9), (8, 10)]
    # the skip list travels in the checkpoints, and nothing NaN reached one
    last = list_checkpoints(tmp_path / "hit")[-1]
    state = json.loads((last / "trainer.json").read_text())
    assert state["guard"] == {"skip_batches": [4, 5, 6], "rollbacks": 1}
    weights = load_file(str(last / "model.safetensors"))
    assert all(torch.isfinite(v).all() for k, v in weights.items() if not k.startswith("__"))


def test_non_finite_loss_rolls_back_at_once(tmp_path):
    args = ["steps=6", "checkpoint.every=2"]
    _, hit = run(tmp_path, "hit", *args, faults={"nan_loss": [3]})
    _, ref = run(tmp_path, "ref", *args, "guard.skip_batches=[3]")
    assert same(hit, ref)
    back = [r for r in records(tmp_path / "hit") if "rollback" in r]
    assert len(back) == 1 and "loss is nan at step 4 (batch 3)" in back[0]["rollback"]


def test_rollbacks_are_limited_and_stop_with_one_line(tmp_path):
    cfg = load_train_config(
        None,
        [
            *SMALL,
            f"run_dir={tmp_path / 'r'}",
            "steps=8",
            "checkpoint.every=2",
            "guard.max_rollbacks=2",
        ],
    )
    with pytest.raises(TrainingError) as e, injected(nan_loss=[2, 3, 4]):
        train(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    assert "guard.max_rollbacks=2" in msg and "batches skipped: 2, 3, 4" in msg
    assert not (tmp_path / "r" / "model").exists()


def test_no_checkpoint_to_roll_back_to(tmp_path):
    cfg = load_train_config(
        None, [*SMALL, f"run_dir={tmp_path / 'r'}", "steps=4", "checkpoint.every=0"]
    )
    with pytest.raises(TrainingError, match=r"no checkpoint to roll back to \(checkpoint.every=0"):
        with injected(nan_loss=[1]):
            train(cfg)


def test_rollback_resumes_with_the_skip_list(tmp_path):
    """A run killed after a rollback and resumed keeps skipping the rolled-back batches."""

    args = ["steps=7", "checkpoint.every=2"]
    with pytest.raises(Stop):
        run(tmp_path, "hit", *args, faults={"nan_loss": [3]}, on_step_end=stop_at(5))
    _, resumed = run(tmp_path, "hit", *args, "resume=true")  # the injector is gone
    _, ref = run(tmp_path, "ref", *args, "guard.skip_batches=[3]")
    _, plain = run(tmp_path, "plain", *args)
    assert same(resumed, ref) and not same(resumed, plain)


def good(guard, loss):
    """A good step of ``loss`` judged (the spike rule's statistics take it)."""
    assert guard.judge(rec(1, 0, loss=loss), CK) == Verdict("step")


def rec(step, batch, loss=2.0, gnorm=1.0):
    return {"step": step, "batch": batch, "loss": loss, "grad_norm": gnorm}


CK = Path("run/checkpoints/step_000004")


def test_spike_rule_against_hand_computed_statistics():
    guard = StepGuard(GuardConfig(spike_z=3.0, spike_window=5))
    losses = [2.0, 2.2, 1.9, 2.1, 2.05]
    for x in losses[:-1]:
        good(guard, x)
        assert guard.spike(100.0) is None  # fewer than spike_window good steps: off
    good(guard, losses[-1])
    mean, std = statistics.mean(losses), statistics.stdev(losses)
    assert guard.spike(mean + 2.9 * std) is None
    z = guard.spike(mean + 3.1 * std)
    assert z == pytest.approx(3.1, rel=1e-9)
    v = guard.judge(rec(6, 5, loss=mean + 3.1 * std), CK)
    assert v.action == "skip" and "3.1 standard deviations above the last 5 steps'" in v.skipped
    assert StepGuard(GuardConfig(spike_window=5)).spike(math.inf) is None  # spike_z = 0: off


def test_the_verdicts_of_the_policy():
    """One function decides: skip a bad gradient, roll back at K in a row (the run of bad
    steps skipped from then on), stop past max_rollbacks naming every skipped batch."""
    guard = StepGuard(GuardConfig(max_bad_in_row=2, max_rollbacks=1), checkpoint_every=4)
    assert guard.judge(rec(1, 0), CK) == Verdict("step")
    v = guard.judge(rec(2, 1, gnorm=math.nan), CK)
    assert v == Verdict("skip", skipped="gradient norm nan", in_row=1)
    assert guard.judge(rec(2, 2), CK) == Verdict("step")  # a good step ends the run of bad ones
    assert guard.judge(rec(3, 3, gnorm=math.inf), CK).action == "skip"
    v = guard.judge(rec(3, 4, gnorm=math.nan), CK)
    assert v == Verdict(
        "rollback", "gradient norm nan", "2 bad steps in a row at step 3", (3, 4), in_row=2
    )
    assert guard.skip == {3, 4} and guard.rollbacks == 1 and guard.bad_in_row == []
    v = guard.judge(rec(5, 7, loss=math.nan), CK)  # a second rollback: max_rollbacks=1 spent
    assert (v.action, v.skipped, v.batches) == ("stop", "", (7,))
    assert v.why == (
        f"loss is nan at step 5 (batch 7); last good checkpoint: {CK}; stopping: "
        "guard.max_rollbacks=1 rollback(s) spent (batches skipped: 3, 4, 7). Lower optim.lr, "
        "check the data, or resume=true with a higher guard.max_rollbacks"
    )


def test_a_non_finite_loss_rolls_back_its_batch_alone_or_stops_without_checkpoint():
    guard = StepGuard(GuardConfig(max_bad_in_row=3))
    assert guard.judge(rec(1, 0, gnorm=math.nan), CK).action == "skip"
    v = guard.judge(rec(1, 1, loss=math.inf), CK)
    assert (v.action, v.batches, v.skipped) == ("rollback", (1,), "")
    assert v.why == f"loss is inf at step 1 (batch 1); last good checkpoint: {CK}"
    guard = StepGuard(GuardConfig(), checkpoint_every=0)
    v = guard.judge(rec(1, 0, loss=math.nan), None)
    assert v.action == "stop" and v.why == (
        "loss is nan at step 1 (batch 0); last good checkpoint: none; stopping: no checkpoint "
        "to roll back to (checkpoint.every=0); lower optim.lr or check the data"
    )


@pytest.mark.parametrize("key", ["inject_nan_grad", "inject_nan_loss"])
def test_the_injector_is_no_config_key(tmp_path, capsys, key):
    """guard.inject_* on the command line or in YAML: one line, exit 2, nothing written."""
    from swax.cli import main

    rc = main(["train", f"run_dir={tmp_path / 'r'}", f"guard.{key}=[3]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"unknown config key guard.{key}" in err[0], err
    config = tmp_path / "c.yaml"
    config.write_text(f"run_dir: {tmp_path / 'r'}\nguard:\n  {key}: [3]\n")
    rc = main(["train", str(config)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"unknown config key guard.{key}" in err[0], err
    assert not (tmp_path / "r").exists()


def test_a_malformed_fault_hook_is_one_error(tmp_path, monkeypatch):
    from swax.core.errors import ConfigError

    monkeypatch.setenv(FAULTS_ENV, '{"nan_grad": [3], "nan_los": [1]}')
    cfg = load_train_config(None, [*SMALL, f"run_dir={tmp_path / 'r'}", "steps=2"])
    with pytest.raises(ConfigError, match=rf"^{FAULTS_ENV}=.*nan_los.*expected JSON like"):
        train(cfg)
    assert not [p.name for p in (tmp_path / "r").iterdir() if p.name != ".swax.lock"]


def test_a_run_whose_config_holds_the_retired_keys_resumes(tmp_path):
    """Earlier versions wrote guard.inject_nan_grad / inject_nan_loss into every config.yaml:
    such a run still resumes (and ends where an uninterrupted run does)."""
    import yaml

    _, ref = run(tmp_path, "ref", "steps=4", "checkpoint.every=2")
    args = ["steps=4", "checkpoint.every=2"]
    with pytest.raises(Stop):
        run(tmp_path, "old", *args, on_step_end=stop_at(2))
    saved = tmp_path / "old" / "config.yaml"
    config = yaml.safe_load(saved.read_text())
    config["guard"].update(inject_nan_grad=[], inject_nan_loss=[])
    saved.write_text(yaml.safe_dump(config, sort_keys=False))
    _, resumed = run(tmp_path, "old", *args, "resume=true")
    assert same(resumed, ref)
    assert "inject" not in saved.read_text()


def test_spike_skips_like_a_bad_gradient(tmp_path, monkeypatch):
    """A step the spike rule calls bad (its statistics are tested above; here the verdict is
    forced on the fourth step tried) is skipped like a bad gradient: the weights end where a
    run without that batch has them."""
    tried = []

    def spike(self, loss):
        tried.append(loss)
        return 9.0 if len(tried) == 4 else None

    monkeypatch.setattr(StepGuard, "spike", spike)
    _, hit = run(tmp_path, "hit", "steps=5", "guard.spike_z=3")
    monkeypatch.undo()
    skipped = [r for r in records(tmp_path / "hit") if "skipped" in r]
    assert [(r["step"], r["batch"]) for r in skipped] == [(4, 3)]
    assert (
        "loss spike" in skipped[0]["skipped"] and "9.0 standard deviations" in skipped[0]["skipped"]
    )
    _, ref = run(tmp_path, "ref", "steps=5", "guard.skip_batches=[3]")
    assert same(hit, ref)


def test_non_finite_weights_are_never_saved(tmp_path):
    from swax import SwaxConfig, SwaxLM
    from swax.train.checkpoint import Checkpoints

    model = SwaxLM(SwaxConfig.preset("tiny", d_model=32, n_layers=2, n_heads=2, window=16))
    opt = torch.optim.AdamW(model.parameters())
    checkpoints = Checkpoints(tmp_path)
    checkpoints.write(1, model, opt, {"loader": {}})
    with torch.no_grad():
        model.embed.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="not saving step 2: the weights hold non-finite"):
        checkpoints.write(2, model, opt, {"loader": {}})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]
    load_checkpoint(list_checkpoints(tmp_path)[0], model, opt)
    assert torch.isfinite(model.embed.weight).all()


def test_a_monitor_that_cannot_fit_its_episodes_is_refused_before_training(tmp_path):
    """seq_len 32 leaves no room for a needle episode at min_distance 16: one error naming the
    keys, before the first step (no checkpoint, no metrics)."""
    from swax.core.errors import ConfigError

    cfg = load_train_config(
        None, [*SMALL, f"run_dir={tmp_path / 'm'}", "steps=4", "log.laziness_every=2"]
    )
    with pytest.raises(
        ConfigError,
        match=r"log.laziness_every=2: the monitor's episodes do not "
        r"fit: episode length \d+ too short.*raise seq_len \(now 32\)",
    ):
        train(cfg)
    assert not (tmp_path / "m" / "checkpoints").exists()
    assert not (tmp_path / "m" / "metrics.jsonl").exists()

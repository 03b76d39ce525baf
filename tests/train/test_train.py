"""Training runs: resume exactness, NaN stop, atomic checkpoints, accumulation, extending a run.

The helpers (small_cfg, stop_at, ...) are tests/train/runs.py's, importable from here too."""

import json
import math
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.core.errors import ConfigError
from swax.state import DEFAULT_WINDOW
from swax.train import (
    TrainingError,
    load_train_config,
    train,
)
from swax.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from tests.train.runs import SMALL, Stop, losses, small_cfg, stop_at  # noqa: F401 (re-exported)

# ------------------------------------------------------------------------------ runs


def test_resume_reproduces_uninterrupted_losses(tmp_path):
    full = train(small_cfg(tmp_path, "steps=12", "checkpoint.every=4", name="a"))
    assert (tmp_path / "a" / "model" / "config.json").is_file()

    class Stop(Exception):
        pass

    def stop_at_7(step, record):
        if step == 7:
            raise Stop

    with pytest.raises(Stop):
        train(
            small_cfg(tmp_path, "steps=12", "checkpoint.every=4", name="b"), on_step_end=stop_at_7
        )
    assert latest_checkpoint(tmp_path / "b").name == "step_000004"
    resumed = train(small_cfg(tmp_path, "steps=12", "checkpoint.every=4", "resume=true", name="b"))
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(1, 13))
    assert [a[s] for s in range(1, 13)] == [b[s] for s in range(1, 13)]  # exactly
    assert resumed["final_val_loss"] == full["final_val_loss"]
    # the exported models are identical
    ma = SwaxLM.from_pretrained(tmp_path / "a" / "model")
    mb = SwaxLM.from_pretrained(tmp_path / "b" / "model")
    for (n, p), (_, q) in zip(ma.state_dict().items(), mb.state_dict().items()):
        assert torch.equal(p, q), n
    assert len(list_checkpoints(tmp_path / "b")) == 2  # keep=2


def test_training_forwards_skip_the_id_check(tmp_path, monkeypatch):
    """The loader checks the ids once, so the training steps' forwards do not (the check reads
    the ids' min and max: a host sync per micro-batch); a model used directly still checks."""
    calls = {"forward": 0, "check": 0}
    forward, check = SwaxLM.forward, SwaxLM.check_token_ids

    def counted_forward(self, *a, **k):
        calls["forward"] += 1
        return forward(self, *a, **k)

    def counted_check(self, ids):
        calls["check"] += 1
        return check(self, ids)

    monkeypatch.setattr(SwaxLM, "forward", counted_forward)
    monkeypatch.setattr(SwaxLM, "check_token_ids", counted_check)
    train(small_cfg(tmp_path, "steps=3", "log.val_every=2"))
    assert calls["forward"] >= 3 and calls["check"] == 0, calls
    model = SwaxLM(SwaxConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2))
    model(torch.tensor([[1, 2, 3]]))
    assert calls["check"] == 1  # the default: every forward checks
    model.check_ids = False
    model(torch.tensor([[1, 2, 3]]))
    model(torch.tensor([[1, 2, 3]]), check_ids=True)  # a call can ask for it
    assert calls["check"] == 2


@pytest.fixture
def restore_threads():
    """Tests that set torch's thread count in this process put it back."""
    from swax.core import threads as T

    saved = torch.get_num_threads(), T._applied, T._note, T._setting
    yield
    torch.set_num_threads(saved[0])
    T._applied, T._note, T._setting = saved[1:]


def test_resume_under_auto_threads_reuses_the_runs_count(
    tmp_path, monkeypatch, capfd, restore_threads
):
    """threads=auto picks by load, so a resume could pick another count and sum in another
    order: the checkpoint records the count in use and a resume under auto takes it again
    (pinned, with a note); a count named on resume wins. auto is stubbed: 2, then 1."""
    import swax.core.threads as T

    seen = []

    def record(step, rec):
        seen.append((step, torch.get_num_threads()))

    def stop_at_5(step, rec):
        record(step, rec)
        if step == 5:
            raise KeyboardInterrupt

    def run(*extra, on_step_end=record):
        args = [a for a in SMALL if a != "threads=1"]
        cfg = load_train_config(None, [*args, f"run_dir={tmp_path / 'r'}", "steps=8", *extra])
        return train(cfg, on_step_end=on_step_end)

    monkeypatch.setattr(T, "auto_threads", lambda share=1: (2, "auto (test): 2"))
    with pytest.raises(KeyboardInterrupt):
        run("threads=auto", "checkpoint.every=4", on_step_end=stop_at_5)
    state = json.loads((latest_checkpoint(tmp_path / "r") / "trainer.json").read_text())
    assert state["threads"] == 2 and latest_checkpoint(tmp_path / "r").name == "step_000004"
    monkeypatch.setattr(T, "auto_threads", lambda share=1: (1, "auto (test): 1"))
    capfd.readouterr()
    seen.clear()
    run("threads=auto", "checkpoint.every=4", "resume=true")
    err = capfd.readouterr().err
    assert "note: threads=auto: resuming with the 2 thread(s) the run used at step 4" in err
    assert "threads 2 (threads=auto: the run's count at step 4)" in err  # the header
    assert seen == [(s, 2) for s in range(5, 9)]
    seen.clear()  # a count given on resume is taken as it is
    run("threads=1", "checkpoint.every=4", "resume=true", "steps=9")
    assert seen == [(9, 1)] and "note: threads=auto" not in capfd.readouterr().err


def test_existing_run_is_never_overwritten(tmp_path):
    train(small_cfg(tmp_path, "steps=2", name="r"))
    before = (tmp_path / "r" / "model" / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(small_cfg(tmp_path, "steps=2", name="r"))
    assert (tmp_path / "r" / "model" / "model.safetensors").read_bytes() == before
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(small_cfg(tmp_path, "steps=2", "resume=true", name="empty"))


def test_nan_loss_stops_and_keeps_last_checkpoint(tmp_path, monkeypatch):
    import swax.train.step as T

    real = T.F.cross_entropy
    calls = {"n": 0}

    def ce(*a, **k):
        out = real(*a, **k)
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 5:
                return out * float("nan")
        return out

    monkeypatch.setattr(T.F, "cross_entropy", ce)
    with pytest.raises(TrainingError, match=r"loss is nan at step 5.*step_000004"):
        train(
            small_cfg(tmp_path, "steps=10", "checkpoint.every=2", "guard.max_rollbacks=0", name="n")
        )
    ck = latest_checkpoint(tmp_path / "n")
    assert ck.name == "step_000004"
    assert not (tmp_path / "n" / "model").exists()
    model = SwaxLM(SwaxConfig.preset("tiny", d_model=32, n_layers=2, n_heads=2, window=32))
    opt = torch.optim.AdamW(model.parameters())
    assert load_checkpoint(ck, model, opt)["step"] == 4


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    """The process dies (os._exit) half-way through writing its second checkpoint."""
    run = tmp_path / "k"
    code = textwrap.dedent(f"""
        import os, sys
        import swax.train.checkpoint as C
        from swax.train import load_train_config, train
        real = C._write_files
        count = [0]
        def dying(tmp, model_sd, optim_sd, state):
            count[0] += 1
            if count[0] == 2:
                from safetensors.torch import save_file
                save_file({{k: v.contiguous() for k, v in model_sd.items()}},
                          str(tmp / "model.safetensors"))
                os._exit(9)
            real(tmp, model_sd, optim_sd, state)
        C._write_files = dying
        train(load_train_config(None, {SMALL!r} + ["run_dir={run}", "steps=8",
                                                    "checkpoint.every=2"]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 9, r.stderr
    assert latest_checkpoint(run).name == "step_000002"
    assert (run / "checkpoints" / "step_000004.tmp").is_dir()
    summary = train(small_cfg(tmp_path, "steps=8", "checkpoint.every=2", "resume=true", name="k"))
    assert summary["steps"] == 8
    assert not (run / "checkpoints" / "step_000004.tmp").exists()


def test_grad_accumulation_matches_full_batch(tmp_path):
    a = train(small_cfg(tmp_path, "steps=3", name="ga1"))
    b = train(small_cfg(tmp_path, "steps=3", "optim.grad_accum=2", name="ga2"))
    la, lb = losses(tmp_path / "ga1"), losses(tmp_path / "ga2")
    for s in (1, 2, 3):
        assert abs(la[s] - lb[s]) < 1e-5
    assert abs(a["final_val_loss"] - b["final_val_loss"]) < 1e-5


def test_per_layer_window_and_activation_checkpointing(tmp_path):
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=4, n_heads=2, vocab_size=50))
    ids = torch.randint(0, 50, (2, 40))
    same = model(ids, window=(8, None, 8, None))
    assert torch.equal(same, model(ids, window=8))
    assert not torch.allclose(model(ids, window=(8, None, 16, None)), same)
    with pytest.raises(ValueError, match="one entry per layer"):
        model(ids, window=(8, 8))
    # an entry may be DEFAULT_WINDOW: that layer's window is config.window (128 here)
    mixed = model(ids, window=(DEFAULT_WINDOW, None, 16, None))
    assert torch.equal(mixed, model(ids, window=(model.config.window, None, 16, None)))
    with pytest.raises(ValueError, match="window must be >= 1"):
        model(ids, window=(0, None, 8, None))
    loss = model(ids, window=8).logsumexp(-1).mean()
    g1 = torch.autograd.grad(loss, list(model.parameters()))
    model.gradient_checkpointing = True
    loss = model(ids, window=8).logsumexp(-1).mean()
    g2 = torch.autograd.grad(loss, list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g2))
    # and the option trains end to end, with per-layer draws
    train(
        small_cfg(
            tmp_path,
            "steps=2",
            "activation_checkpointing=true",
            "window.per_layer=true",
            "model.n_layers=4",
            name="pl",
        )
    )


def _stop_at(n):
    class Stop(Exception):
        pass

    def hook(step, record):
        if step == n:
            raise Stop

    return Stop, hook


def test_resume_auto_starts_fresh_then_resumes_exactly(tmp_path):
    """resume=auto: an empty folder trains exactly as a fresh run; after a stop it continues
    from the newest checkpoint and ends with the uninterrupted run's weights; a folder holding
    a run without a checkpoint is refused."""
    args = ("steps=10", "checkpoint.every=3", "resume=auto")
    train(small_cfg(tmp_path, "steps=10", "checkpoint.every=3", name="ref"))
    Stop, hook = _stop_at(5)
    with pytest.raises(Stop):
        train(small_cfg(tmp_path, *args, name="auto"), on_step_end=hook)
    assert latest_checkpoint(tmp_path / "auto").name == "step_000003"
    again = train(small_cfg(tmp_path, *args, name="auto"))
    assert again["steps_run"] == 7
    ref, got = losses(tmp_path / "ref"), losses(tmp_path / "auto")
    assert [ref[s] for s in range(1, 11)] == [got[s] for s in range(1, 11)]
    ma = SwaxLM.from_pretrained(tmp_path / "ref" / "model").state_dict()
    mb = SwaxLM.from_pretrained(tmp_path / "auto" / "model").state_dict()
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    train(small_cfg(tmp_path, "steps=2", name="nockpt"))
    shutil.rmtree(tmp_path / "nockpt" / "checkpoints")  # a run (model/) without checkpoints
    with pytest.raises(ConfigError, match="resume=auto: .* no intact checkpoint"):
        train(small_cfg(tmp_path, "steps=2", "checkpoint.every=100", "resume=auto", name="nockpt"))


# ------------------------------------------------------------------------------ extending a run


def lrs(run_dir):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["lr"] for r in rows if "lr" in r}


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_extending_a_finished_run_never_raises_the_learning_rate(tmp_path, capsys, schedule):
    """steps=8, then resume=true steps=11: the schedule was laid over 8 steps and is not
    re-stretched (re-stretching put step 9's rate above step 8's); the added steps keep the
    rate the plan ended with. Steps 1-8 are the finished run's, unchanged."""
    base = [f"optim.schedule={schedule}", "checkpoint.every=4"]
    train(small_cfg(tmp_path, "steps=8", *base, name="r"))
    before = lrs(tmp_path / "r")
    capsys.readouterr()
    out = train(small_cfg(tmp_path, "steps=11", "resume=true", *base, name="r"))
    err = capsys.readouterr().err
    lr = lrs(tmp_path / "r")
    assert [lr[s] for s in range(1, 9)] == [before[s] for s in range(1, 9)]
    assert lr[9] <= lr[8] and lr[9] == lr[10] == lr[11] == before[8], lr
    assert "extending the run past its plan of 8 steps" in err
    # the closing line: the whole run's time, and this invocation's share apart
    assert "in all (3 steps in" in err and "this time)" in err
    assert math.isfinite(out["final_val_loss"])


def test_shortening_a_run_says_where_it_stops_in_its_plan(tmp_path, capsys):
    """steps=8 stopped at 4, resumed with steps=6: the plan stays 8 steps, the run stops at
    step 6 with the plan's rate there (above the plan's end), and says so."""

    with pytest.raises(Stop):
        train(
            small_cfg(tmp_path, "steps=8", "checkpoint.every=4", name="r"), on_step_end=stop_at(4)
        )
    full = train(small_cfg(tmp_path, "steps=8", "checkpoint.every=4", name="ref"))
    capsys.readouterr()
    train(small_cfg(tmp_path, "steps=6", "resume=true", "checkpoint.every=4", name="r"))
    err = capsys.readouterr().err
    lr, ref = lrs(tmp_path / "r"), lrs(tmp_path / "ref")
    assert lr[6] == ref[6] > ref[8]  # the plan's rate at step 6, not its end
    assert (
        f"steps=6 is shorter than the run's plan of 8 steps: it stops at step 6 with the "
        f"plan's learning rate there ({ref[6]:.3g})" in err
    )
    assert full["steps"] == 8


def test_resuming_with_fewer_steps_than_done_is_refused(tmp_path):
    """It would save the later step's weights as a checkpoint of an earlier step."""
    train(small_cfg(tmp_path, "steps=6", "checkpoint.every=3", name="r"))
    before = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match=r"steps=2 is below the step step_000006 holds \(6\)"):
        train(small_cfg(tmp_path, "steps=2", "resume=true", "checkpoint.every=3", name="r"))
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir()) == before


def test_extension_window_stays_long(tmp_path):
    """A stochastic run extended past its plan: the added steps are in the long-window anneal,
    not drawn again."""
    base = ["window.kind=stochastic", "window.p_short=1.0", "checkpoint.every=4"]
    train(small_cfg(tmp_path, "steps=8", *base, name="s"))
    train(small_cfg(tmp_path, "steps=12", "resume=true", *base, name="s"))
    rows = [json.loads(ln) for ln in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    window = {r["step"]: r["window"] for r in rows if "window" in r}
    assert window[1] == "8"  # p_short = 1: short before the anneal
    assert [window[s] for s in range(9, 13)] == ["32"] * 4

"""Training: schedules, config loading, resume exactness, NaN stop, atomic checkpoints, CLI."""

import json
import math
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from swax import SwaxConfig, SwaxLM
from swax.core.errors import ConfigError
from swax.state import DEFAULT_WINDOW
from swax.train import (
    FixedWindow,
    StochasticWindow,
    TrainingError,
    load_train_config,
    lr_at,
    train,
)
from swax.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

SMALL = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "seq_len=64",
    "batch_size=4",
    "window.short=8",
    "window.long=32",
    "log.val_batches=2",
    "log.every=1",
    "log.val_every=0",
    "optim.warmup_steps=2",
    "threads=1",
]


def small_cfg(tmp_path, *extra, name="run"):
    return load_train_config(None, [*SMALL, f"run_dir={tmp_path / name}", *extra])


class Stop(Exception):
    """Raised by :func:`stop_at`'s hook: a run interrupted after a chosen step."""


def stop_at(n):
    """An ``on_step_end`` hook that stops the run after step ``n``."""

    def hook(step, record):
        if step == n:
            raise Stop

    return hook


def losses(run_dir):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


# ------------------------------------------------------------------------------ schedules


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_stochastic_window_frequency(p):
    n = 20000
    sched = StochasticWindow(128, 2048, p, anneal_frac=0.0, total_steps=n, seed=3)
    frac = sum(sched(s) == 128 for s in range(n)) / n
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(frac - p) < 5 * sd, (frac, p)
    assert {sched(s) for s in range(n)} == {128, 2048}


def test_stochastic_window_anneal_and_determinism():
    sched = StochasticWindow(128, 2048, 0.9, anneal_frac=0.1, total_steps=1000, seed=0)
    assert sched.anneal_start == 900
    assert all(sched(s) == 2048 for s in range(900, 1000))
    assert sum(sched(s) == 128 for s in range(900)) > 700
    again = StochasticWindow(128, 2048, 0.9, anneal_frac=0.1, total_steps=1000, seed=0)
    assert [sched(s) for s in range(900)] == [again(s) for s in range(900)]
    assert [sched(s) for s in range(50)] == [sched(s) for s in range(50)]  # asked twice
    other = StochasticWindow(128, 2048, 0.9, anneal_frac=0.1, total_steps=1000, seed=1)
    assert [sched(s) for s in range(900)] != [other(s) for s in range(900)]
    assert FixedWindow(64)(5) == 64


def test_per_layer_windows_are_independent_draws():
    sched = StochasticWindow(8, 64, 0.5, anneal_frac=0.0, total_steps=4000, seed=0, per_layer=3)
    draws = [sched(s) for s in range(4000)]
    assert all(len(d) == 3 for d in draws)
    for j in range(3):
        assert abs(sum(d[j] == 8 for d in draws) / 4000 - 0.5) < 0.05
    assert sum(len(set(d)) > 1 for d in draws) > 1000  # layers disagree often


def test_per_layer_draws_go_to_the_layers_that_take_a_window():
    """window.per_layer on "SXSA": the schedule draws one window per sliding-window layer and
    the model config lays them out (SwaxConfig.layer_windows); X and A layers get None."""
    from swax.train.schedules import PerLayerWindows, window_schedule

    cfg = load_train_config(
        None,
        [
            "window.per_layer=true",
            "model.layer_pattern=SXSA",
            "window.short=8",
            "window.long=32",
            "steps=100",
        ],
    )
    sched = window_schedule(cfg, cfg.model)
    assert isinstance(sched, PerLayerWindows) and sched.long == 32
    draws = [sched(s) for s in range(90)]
    for d in draws:
        assert len(d) == 4 and d[1] is None and d[3] is None and {d[0], d[2]} <= {8, 32}
    assert any(d[0] != d[2] for d in draws)  # the two S layers draw apart
    assert sched(95) == (32, None, 32, None)  # the anneal: the long window
    step = 7
    a, b = sched.sched(step)
    assert sched(step) == (a, None, b, None)
    # one S layer: one draw for the whole model
    one = load_train_config(
        None, ["window.per_layer=true", "model.layer_pattern=SXA", "model.n_layers=3"]
    )
    assert isinstance(window_schedule(one, one.model), StochasticWindow)


def _rank_windows(rank, world, port, out):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    sched = StochasticWindow(128, 2048, 0.5, 0.1, 500, seed=11)
    mine = torch.tensor([sched(s) for s in range(500)])
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        torch.save(torch.stack(gathered), out)
    dist.destroy_process_group()


def test_stochastic_window_identical_across_ranks(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "w.pt"
    mp.spawn(_rank_windows, args=(2, port, str(out)), nprocs=2, join=True)
    w = torch.load(out)
    assert torch.equal(w[0], w[1])
    assert (w[0] == 128).any() and (w[0] == 2048).any()


def test_lr_schedules_hand_computed():
    # warmup: linear to lr over 10 steps
    assert lr_at(0, 100, 1.0, 10, "cosine") == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10, "cosine") == pytest.approx(1.0)
    # cosine: halfway between warmup end (10) and the last step (99) is the mean of lr, min_lr
    assert lr_at(10, 100, 1.0, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_at(99, 100, 1.0, 10, "cosine", 0.1) == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert lr_at(int(mid), 100, 1.0, 10, "cosine", 0.1) == pytest.approx(
        0.1 + 0.45 * (1 + math.cos(math.pi * (int(mid) - 10) / 89))
    )
    # wsd: flat until the last 20 steps, then linear to min
    assert lr_at(79, 100, 1.0, 10, "wsd", 0.1, 0.2) == pytest.approx(1.0)
    assert lr_at(80, 100, 1.0, 10, "wsd", 0.1, 0.2) == pytest.approx(1.0 - 0.9 / 20)
    assert lr_at(99, 100, 1.0, 10, "wsd", 0.1, 0.2) == pytest.approx(0.1)
    assert lr_at(50, 100, 1.0, 10, "constant") == 1.0


# ------------------------------------------------------------------------------ config


def test_tiny_yaml_is_the_default():
    assert load_train_config("configs/tiny.yaml") == load_train_config(None)


def test_overrides_and_errors(tmp_path):
    cfg = load_train_config(
        "configs/tiny.yaml",
        ["optim.lr=3e-4", "window.p_short=0.75", "model.layer_pattern=SD", "resume=false"],
    )
    assert cfg.optim.lr == 3e-4 and cfg.window.p_short == 0.75
    assert isinstance(cfg.model, SwaxConfig) and cfg.model.layer_pattern == "SD"
    assert cfg.model == SwaxConfig.preset("tiny", layer_pattern="SD")
    assert cfg.model.window == cfg.window.long
    with pytest.raises(ConfigError, match="optim.lrr"):
        load_train_config(None, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match="steps: expected an integer"):
        load_train_config(None, ["steps=many"])
    with pytest.raises(ConfigError, match="window.long=1024 is larger than seq_len=512"):
        load_train_config(None, ["window.long=1024"])
    with pytest.raises(ConfigError, match="window.short must be a positive integer, got 0"):
        load_train_config(None, ["window.short=0"])
    with pytest.raises(ConfigError, match="unknown config key model.widht"):
        load_train_config(None, ["model.widht=3"])
    with pytest.raises(ConfigError, match="model.preset: unknown preset 'huge'"):
        load_train_config(None, ["model.preset=huge"])
    with pytest.raises(ConfigError, match="model.d_model must be a positive integer, got 0"):
        load_train_config(None, ["model.d_model=0"])
    with pytest.raises(ConfigError, match="model: unknown layer letter 'Q'"):
        load_train_config(None, ["model.layer_pattern=SQ"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_train_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_train_config(None, ["steps"])
    for p in ("configs/small.yaml", "configs/swax-1.4b.yaml", "configs/swax-7b.yaml"):
        load_train_config(p)  # every shipped config is valid


def test_overrides_are_read_by_the_fields_type(tmp_path, capsys):
    """key=value is read as the field's type, not as YAML 1.1 (where 010 is octal 8 and off is
    false): an int field takes 010 as 10, a str field keeps "010", a Literal "off" stays
    "off"; bools, null and YAML flow lists still read as before."""
    cfg = load_train_config(
        None,
        [
            "seed=010",  # YAML 1.1: 8
            f"run_dir={tmp_path / '010'}",
            "data.val_source=010",  # a str | None field: the string
            "log.wandb=off",  # YAML 1.1: false
            "compile=false",
            "activation_checkpointing=True",
            "resume=auto",
            "threads=auto",
            "model.head_dim=null",
            "model.mlstm_fgate_bias_init=[3, 6.5]",
            "optim.lr=3e-4",
            "steps=1e3",
        ],
    )
    assert cfg.seed == 10 and cfg.data.val_source == "010" and cfg.run_dir.endswith("/010")
    assert cfg.log.wandb == "off" and cfg.compile is False and cfg.activation_checkpointing
    assert cfg.resume == "auto" and cfg.threads == "auto" and cfg.model.head_dim is None
    assert cfg.model.mlstm_fgate_bias_init == (3.0, 6.5)
    assert cfg.optim.lr == 3e-4 and cfg.steps == 1000
    assert load_train_config(None, ["threads=02", "resume=no"]).threads == 2
    for override, message in [
        ("seed=ten", "seed: expected an integer, got 'ten'"),
        ("steps=2.5", "steps: expected an integer, got '2.5'"),
        ("compile=maybe", "compile: expected true or false, got 'maybe'"),
        ("log.wandb=of", "log.wandb: expected one of ['off', 'offline', 'online'], got 'of'"),
        ("model.head_dim=x", "model.head_dim: expected an integer, or null, got 'x'"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_train_config(None, [override])
        assert str(e.value) == message
    rc = cli("train", f"run_dir={tmp_path / 'r'}", "seed=ten")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["swax: error: seed: expected an integer, got 'ten'"], err


# every numeric key outside its range, or not finite, is an error naming the dotted key (some
# were accepted silently: val_batches=-1 reported a validation loss of 0, min_lr_ratio=-2 gave
# a negative learning rate; threads=-3 and lr=nan crashed in torch without the key)
@pytest.mark.parametrize(
    "override,key",
    [
        ("log.val_batches=-1", "log.val_batches"),
        ("log.val_batches=0", "log.val_batches"),
        ("log.val_every=-1", "log.val_every"),
        ("log.every=0", "log.every"),
        ("optim.min_lr_ratio=-2", "optim.min_lr_ratio"),
        ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio"),
        ("optim.weight_decay=-5", "optim.weight_decay"),
        ("optim.eps=-1", "optim.eps"),
        ("optim.eps=0", "optim.eps"),
        ("optim.beta1=1.5", "optim.beta1"),
        ("optim.beta2=1", "optim.beta2"),
        ("optim.beta1=-0.1", "optim.beta1"),
        ("optim.lr=nan", "optim.lr"),
        ("optim.lr=inf", "optim.lr"),
        ("optim.lr=-0.001", "optim.lr"),
        ("optim.decay_frac=2", "optim.decay_frac"),
        ("optim.grad_clip=-1", "optim.grad_clip"),
        ("optim.grad_clip=nan", "optim.grad_clip"),
        ("optim.warmup_steps=-1", "optim.warmup_steps"),
        ("optim.grad_accum=0", "optim.grad_accum"),
        ("threads=-3", "threads"),
        ("seed=-1", "seed"),
        ("steps=0", "steps"),
        ("batch_size=-4", "batch_size"),
        ("window.p_short=nan", "window.p_short"),
        ("window.anneal_frac=-0.5", "window.anneal_frac"),
        ("window.fixed=0", "window.fixed"),
        ("checkpoint.every=-1", "checkpoint.every"),
        ("checkpoint.keep=0", "checkpoint.keep"),
        ("data.val_fraction=nan", "data.val_fraction"),
        ("data.val_fraction=1", "data.val_fraction"),
        ("data.synthetic.fraction=inf", "data.synthetic.fraction"),
        ("data.synthetic.min_distance=-1", "data.synthetic.min_distance"),
        ("data.synthetic.value_digits=19", "data.synthetic.value_digits"),
        ("data.synthetic.mqar_noise=-2", "data.synthetic.mqar_noise"),
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    value = override.split("=", 1)[1]
    with pytest.raises(ConfigError, match=rf"^{key} must be .*, got -?{value.lstrip('-')}"):
        load_train_config(None, [override])


def test_train_cli_bad_value_is_one_line(tmp_path, capsys):
    # threads=-3 reached torch.set_num_threads: a RuntimeError traceback
    rc = cli("train", f"run_dir={tmp_path / 'r'}", *SMALL, "steps=1", "threads=-3")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["swax: error: threads must be auto or an integer >= 0, got -3"], err
    assert not (tmp_path / "r").exists()


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


# ------------------------------------------------------------------------------ CLI


def cli(*args):
    from swax.cli import main

    return main(list(args))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["data.source=/no/such/corpus"], "/no/such/corpus"),
        (["optim.lrr=1"], "optim.lrr"),
        (["window.long=4096"], "window.long=4096"),
        (["window.short=0"], "window.short"),
        (["data.source={small}", "seq_len=4096"], "4096"),
    ],
)
def test_train_cli_bad_input_one_line(tmp_path, capsys, args, needle):
    small = tmp_path / "small.txt"
    small.write_text("In the beginning God created the heaven and the earth.\n" * 20)
    args = [a.format(small=small) for a in args]
    rc = cli("train", f"run_dir={tmp_path / 'r'}", "steps=1", *args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("swax: error:") and needle in err[0], err


@pytest.mark.skipif(torch.cuda.is_available(), reason="flash may run on CUDA")
def test_train_cli_named_attention_backend_that_cannot_run(tmp_path, capsys):
    rc = cli("train", *SMALL, f"run_dir={tmp_path / 'r'}", "steps=1", "model.attn_backend=flash")
    err = capsys.readouterr().err.strip().splitlines()  # the run's header, then the error
    assert rc == 2 and [ln for ln in err if "error" in ln] == err[-1:], err
    assert err[-1] == (
        "swax: error: model.attn_backend 'flash' is not available: needs CUDA; set "
        "model.attn_backend=auto to fall back"
    )


def test_train_cli_empty_dataset(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("   \n")
    rc = cli("train", f"run_dir={tmp_path / 'r'}", f"data.source={tmp_path / 'empty.txt'}")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "empty" in err[0], err


def test_train_cli_and_plot_run(tmp_path, capsys):
    run = tmp_path / "c"
    assert cli("train", *SMALL, f"run_dir={run}", "steps=3") == 0
    out = capsys.readouterr().out
    assert "validation loss" in out and "(trained)" in out
    saved = load_train_config(run / "config.yaml")
    assert saved.steps == 3 and saved.seq_len == 64
    assert cli("plot-run", str(run)) == 0
    png = run / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli("plot-run", str(tmp_path / "none")) == 2
    # resuming the finished run trains nothing and says so, keeping the run's throughput
    first = json.loads((run / "summary.json").read_text())
    assert first["steps_run"] == 3 and first["tok_s"] > 0
    capsys.readouterr()
    assert cli("train", *SMALL, f"run_dir={run}", "steps=3", "resume=true") == 0
    out = capsys.readouterr().out
    assert "throughput: no steps to train (the run had already finished its 3)" in out
    again = json.loads((run / "summary.json").read_text())
    assert again["steps_run"] == 0 and again["tok_s"] == first["tok_s"]


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


def test_the_model_section_is_a_swax_config_with_a_preset(tmp_path):
    """model: {preset, fields} is a SwaxConfig: the preset's fields, the others overriding
    them; no preset is the tiny one; the model's window is window.long when left out."""
    cfg = load_train_config(
        None, ["model.preset=small", "model.d_model=64", "window.long=256", "window.short=64"]
    )
    assert cfg.model == SwaxConfig.preset("small", d_model=64, window=256)
    yaml_file = tmp_path / "m.yaml"
    yaml_file.write_text("model:\n  layer_pattern: SD\n  n_layers: 2\nwindow:\n  long: 64\n")
    cfg = load_train_config(yaml_file, ["model.d_model=96"])
    assert cfg.model == SwaxConfig.preset(
        "tiny", layer_pattern="SD", n_layers=2, d_model=96, window=64
    )
    # a window the model section sets must be the long window
    assert load_train_config(None, ["model.window=128"]).model.window == 128
    with pytest.raises(ConfigError, match=r"model.window=64 differs from window.long=128"):
        load_train_config(None, ["model.window=64"])
    with pytest.raises(ConfigError, match=r"model.window=256 differs from window.long=64"):
        load_train_config(
            None, ["model.preset=125m", "model.window=256", "window.long=64", "window.short=16"]
        )
    # built in Python, the same rule
    from swax.train.config import TrainConfig, WindowConfig

    with pytest.raises(ConfigError, match=r"model.window=2048 differs from window.long=128"):
        TrainConfig(model=SwaxConfig.preset("125m"))
    TrainConfig(
        model=SwaxConfig.preset("125m", window=512), window=WindowConfig(long=512), seq_len=512
    )


def test_train_help_keys_list_the_models_fields_and_preset():
    from swax.train.config import train_config_keys

    rows = {k: (d, doc) for k, d, doc in train_config_keys()}
    keys = list(rows)
    assert keys.index("model.preset") + 1 == keys.index("model.vocab_size")
    assert keys.index("seed") < keys.index("model.preset") < keys.index("data.source")
    assert rows["model.d_model"][0] == "128" and rows["model.layer_pattern"][0] == "SX"
    assert "model" not in rows and "1.4b" in rows["model.preset"][1]
    # swax train --help lists every one of them
    import argparse

    from swax.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    epilog = sub.choices["train"].epilog
    assert all(f"  {k} " in epilog for k in keys)


def test_resume_compares_a_preset_field_by_field(tmp_path):
    """A run's config.yaml holds every field of its model; a model section given again on
    resume (a preset and overrides, as in the YAML the run started from) is compared with it
    field by field; an old config.yaml (preset + overrides) still resumes."""
    first = ["steps=2", "checkpoint.every=1", "model.preset=tiny"]
    train(small_cfg(tmp_path, *first, name="p"))
    saved = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())
    assert "preset" not in saved["model"] and saved["model"]["d_model"] == 32
    assert saved["model"]["window"] == 32 and saved["model"]["layer_pattern"] == "SX"
    again = small_cfg(tmp_path, *first, "resume=true", "steps=3", name="p")
    assert again.model.d_model == 32 and again.steps == 3
    with pytest.raises(ConfigError, match=r"model.d_model=128 \(of model.preset=tiny\) differs"):
        load_train_config(None, [f"run_dir={tmp_path / 'p'}", "resume=true", "model.preset=tiny"])
    with pytest.raises(ConfigError, match=r"model.n_layers=6 \(of model.preset=small\)"):
        load_train_config(
            None,
            [f"run_dir={tmp_path / 'p'}", "resume=true", "model.preset=small", "model.d_model=32"],
        )
    # the config.yaml of a run from before the typed model section: preset + overrides
    old = dict(
        saved,
        model={"preset": "tiny", "d_model": 32, "n_layers": 2, "n_heads": 2, "layer_pattern": "SX"},
    )
    (tmp_path / "p" / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    cfg = load_train_config(None, [f"run_dir={tmp_path / 'p'}", "resume=true", "steps=3"])
    assert cfg.model == again.model
    assert train(cfg)["steps_run"] == 1


def test_resume_reads_the_runs_config_and_names_a_disagreeing_key(tmp_path):
    """`resume=true` with only run_dir continues the run with its own settings (here a
    seq_len, window and steps that differ from the defaults); keys that may change (steps) are
    taken, any other key that disagrees is one error naming both values."""
    first = ["steps=4", "checkpoint.every=2", "seq_len=96", "window.long=48"]
    train(small_cfg(tmp_path, *first, name="r"))
    cfg = load_train_config(None, [f"run_dir={tmp_path / 'r'}", "resume=true", "steps=6"])
    assert (cfg.seq_len, cfg.window.long, cfg.steps, cfg.model.d_model) == (96, 48, 6, 32)
    assert train(cfg)["steps_run"] == 2
    with pytest.raises(ConfigError, match=r"seq_len=64 differs .* has seq_len=96"):
        load_train_config(None, [f"run_dir={tmp_path / 'r'}", "resume=true", "seq_len=64"])
    same = load_train_config(None, [f"run_dir={tmp_path / 'r'}", "resume=true", "seq_len=96"])
    assert same.seq_len == 96  # a key given again with the run's value is fine


def test_a_run_shorter_than_its_warmup_is_warned_about(tmp_path, capfd):
    train(small_cfg(tmp_path, "steps=3", "optim.warmup_steps=6", name="w"))
    err = capfd.readouterr().err
    assert "warning: optim.warmup_steps=6 >= steps=3: the learning rate only rises" in err
    train(small_cfg(tmp_path, "steps=3", "optim.warmup_steps=1", name="ok"))
    assert "warmup_steps" not in capfd.readouterr().err


def test_wandb_logger_offline_with_a_stand_in_module(tmp_path, monkeypatch, capfd):
    """log.wandb=offline: a W&B run in run_dir, no network, every metrics record logged at
    its step, the same W&B run id on resume; without the package, one warning."""
    import types

    calls = {"init": [], "log": [], "finish": 0}

    class Run:
        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finish"] += 1

    fake = types.ModuleType("wandb")
    fake.util = types.SimpleNamespace(generate_id=lambda: "abc123")
    fake.init = lambda **kw: calls["init"].append(kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    train(small_cfg(tmp_path, "steps=4", "checkpoint.every=2", "log.wandb=offline", name="w"))
    (kw,) = calls["init"]
    assert kw["mode"] == "offline" and kw["dir"] == str(tmp_path / "w") and kw["id"] == "abc123"
    logged: dict = {}
    for step, data in calls["log"]:  # several records may share a step (loss, validation)
        logged.setdefault(step, {}).update(data)
    written = [json.loads(ln) for ln in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    for rec in written:
        for key, value in rec.items():
            if key != "step" and value is not None:
                assert logged[rec["step"]][key] == value
    assert calls["finish"] == 1
    fake.util.generate_id = lambda: "other"  # a resumed run keeps its W&B run
    train(
        small_cfg(
            tmp_path, "steps=6", "checkpoint.every=2", "log.wandb=offline", "resume=true", name="w"
        )
    )
    assert calls["init"][1]["id"] == "abc123"
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    capfd.readouterr()
    train(small_cfg(tmp_path, "steps=1", "log.wandb=offline", name="nowandb"))
    assert "log.wandb=offline but the wandb package is not installed" in capfd.readouterr().err


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


# ------------------------------------------------------------------------------ CLI habits


def test_dashed_spellings_of_config_keys():
    from swax.cli.main import _dashed_overrides, build_parser

    p = build_parser()
    got = _dashed_overrides(
        p,
        [
            "train",
            "--steps=10",
            "--optim.lr",
            "3e-4",
            "--seq-len",
            "64",
            "--threads",
            "1",
            "x.yaml",
            "--model.d_model=32",
            "--help",
        ],
    )
    assert got == [
        "train",
        "steps=10",
        "optim.lr=3e-4",
        "seq_len=64",
        "--threads",
        "1",
        "x.yaml",
        "model.d_model=32",
        "--help",
    ]
    assert _dashed_overrides(p, ["generate", "--steps=3"]) == ["generate", "--steps=3"]


def test_dashed_spelling_reaches_the_config(tmp_path, capsys):
    rc = cli("train", f"--run-dir={tmp_path / 'r'}", *SMALL, "--steps", "abc")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["swax: error: steps: expected an integer, got 'abc'"], err


def test_misspelled_key_gets_a_suggestion(capsys):
    rc = cli("train", "optim.lrr=3e-4")
    err = capsys.readouterr().err
    assert rc == 2 and "unknown config key optim.lrr; did you mean optim.lr?" in err
    rc = cli("train", "--stepz", "3")
    assert rc == 2 and "did you mean steps?" in capsys.readouterr().err


def test_type_error_names_the_accepted_values(capsys):
    rc = cli("train", "resume=maybe")
    err = capsys.readouterr().err
    assert rc == 2 and "resume: expected true or false, or 'auto', got 'maybe'" in err
    assert "Union" not in err


def test_yaml_error_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\noptim:\n  lr: [1, 2\nseed: 1\n")
    rc = cli("train", str(bad))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "(line 4, column" in err[0], err


def test_train_help_lists_every_key_with_the_models(capsys):
    with pytest.raises(SystemExit):
        cli("train", "--help")
    out = capsys.readouterr().out
    for key in ("model.d_model", "model.layer_pattern", "model.preset", "optim.lr", "steps"):
        assert f"\n  {key} " in out, key
    assert "[128]" in out.split("model.d_model", 1)[1].splitlines()[0]  # the tiny preset's


@pytest.mark.parametrize(
    "argv,usage",
    [
        (["data", "prepare", "--help"], "--out DIR"),
        (["eval", "convert-tasks", "--help"], "--task NAME"),
    ],
)
def test_required_options_are_shown_and_checked_as_required(argv, usage, capsys):
    with pytest.raises(SystemExit):
        cli(*argv)
    head = capsys.readouterr().out.split("\n\n")[0]
    assert usage in head and f"[{usage}" not in head, head
    with pytest.raises(SystemExit) as e:
        cli(*argv[:-1], "src")
    assert e.value.code == 2
    assert f"required: {usage.split()[0]}" in capsys.readouterr().err


def test_model_option_takes_a_run_folder(tmp_path, capsys):
    train(small_cfg(tmp_path, "steps=1", name="r"))
    capsys.readouterr()
    assert cli("info", "--model", str(tmp_path / "r")) == 0
    assert "parameters" in capsys.readouterr().out


def test_train_header_reads_as_text(tmp_path, capsys):
    """The run's first lines: the window schedule in words (not a Python repr), the threads
    and where the count came from, and what the MFU is measured against."""
    args = [
        "train",
        f"run_dir={tmp_path / 'r'}",
        *SMALL,
        "steps=2",
        "window.kind=stochastic",
        "window.short=8",
        "window.long=32",
        "window.p_short=0.5",
        "threads=1",
    ]
    assert cli(*args) == 0
    err = capsys.readouterr().err
    head = err.splitlines()[0]
    assert "window stochastic: 8 with p 0.5, else 32; 32 from step 2 (last 10%)" in head, head
    assert "Window(" not in err and "threads 1 (as asked)" in head
    mfu = [ln for ln in err.splitlines() if ln.startswith("MFU: the model's FLOP/s over ")]
    assert len(mfu) == 1 and "GFLOP/s" in mfu[0] and "matmul" in mfu[0], err


def test_window_schedules_describe_themselves():
    from swax.train.schedules import FixedWindow, StochasticWindow

    assert FixedWindow(64).describe() == "fixed 64"
    # 1000 steps, last 10 %: steps 901-1000 (1-based) are long
    s = StochasticWindow(16, 128, 0.75, 0.1, 1000)
    assert s.describe() == "stochastic: 16 with p 0.75, else 128; 128 from step 901 (last 10%)"
    assert s(899) in (16, 128) and s(900) == 128
    assert "drawn per layer" in StochasticWindow(16, 128, 0.5, 0.0, 10, per_layer=2).describe()
    assert "from step" not in StochasticWindow(16, 128, 0.5, 0.0, 10).describe()


def test_window_config_names_the_window_a_run_trains_with():
    from swax.config import WindowConfig

    # hand-written: fixed uses `fixed`, or `long` when None; stochastic trains with `short` too
    assert WindowConfig(kind="fixed", short=8, long=32).fixed_window == 32
    assert WindowConfig(kind="fixed", short=8, long=32, fixed=24).fixed_window == 24
    assert WindowConfig(kind="fixed", short=8, long=32).train_window == 32
    assert WindowConfig(kind="fixed", short=8, long=32, fixed=4).train_window == 4
    assert WindowConfig(kind="stochastic", short=8, long=32, fixed=4).train_window == 8
    # the schedule a fixed run builds draws that same window at every step
    from swax.train.config import TrainConfig
    from swax.train.schedules import window_schedule

    cfg = TrainConfig(
        model=SwaxConfig.preset("tiny", window=32),
        window=WindowConfig(kind="fixed", short=8, long=32, fixed=24),
    )
    sched = window_schedule(cfg, cfg.model)
    assert {sched(s) for s in range(0, cfg.steps, max(1, cfg.steps // 10))} == {24}

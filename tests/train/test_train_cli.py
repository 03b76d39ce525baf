"""`swax train` on the command line: bad input in one line, backends, plot-run, warnings, W&B,
and the CLI habits (dashed keys, suggestions, help, the header)."""

import json
import sys

import pytest
import torch

from swax.train import (
    load_train_config,
    train,
)
from tests.train.runs import SMALL, cli, small_cfg

# ------------------------------------------------------------------------------ CLI


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

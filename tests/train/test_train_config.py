"""The training config: the tiny default, overrides and their errors, bounds, the model section
as a SwaxConfig with a preset, and resume against a run's saved config."""

import pytest
import yaml

from swax import SwaxConfig
from swax.core.errors import ConfigError
from swax.train import (
    load_train_config,
    train,
)
from tests.train.runs import SMALL, cli, small_cfg

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

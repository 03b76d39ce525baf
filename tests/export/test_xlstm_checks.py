"""swax import / export xlstm: what is refused (one line, exit 2, nothing written), the 7B
layout mapped on shapes alone, and the xLSTM pieces held to transformers' own: the MLP width,
the initialisation, the preset."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.export.xlstm import map_tensors
from swax.export.xlstm_config import swax_config_from_xlstm
from swax.layers.mlp import swiglu_hidden_dim
from tests.cli.test_cli import assert_one_line_error, run_inprocess
from tests.export.xlstm_helpers import tiny_xlstm, transformers_or_skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("xlstm-checks")
    tiny_xlstm().save_pretrained(root / "src")
    return root / "src"


def variant(folder, tmp_path, config=None, drop=None, files=None):
    """A copy of ``folder`` with config keys changed, a tensor dropped or files added."""
    out = tmp_path / "variant"
    shutil.copytree(folder, out)
    if config:
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**cfg, **config}))
    if drop:
        from safetensors.torch import load_file, save_file

        sd = load_file(str(out / "model.safetensors"))
        del sd[drop]
        save_file(sd, str(out / "model.safetensors"))
    for name, text in (files or {}).items():
        (out / name).write_bytes(text)
    return out


@pytest.mark.parametrize(
    "change,needles",
    [
        (dict(config={"use_bias": True}), ["use_bias=True", "not supported"]),
        (dict(config={"add_out_norm": False}), ["add_out_norm=False"]),
        (dict(config={"slstm_at": [1]}), ["unknown xLSTM config field 'slstm_at'"]),
        (dict(config={"model_type": "llama"}), ["model_type 'llama'"]),
        (dict(config={"num_blocks": 3}), ["num_blocks=3", "num_hidden_layers=2"]),
        (dict(config={"output_logit_soft_cap": -1.0}), ["output_logit_soft_cap=-1.0"]),
        (dict(config={"head_dim": 7}), ["head_dim=7"]),
        (dict(drop="lm_head.weight"), ["no tensor lm_head.weight"]),
        (dict(config={"num_hidden_layers": 1, "num_blocks": 1}), ["does not map", "blocks.1"]),
        (dict(config={"hidden_size": 256, "embedding_dim": 256}), ["shape"]),
    ],
)
def test_import_refusals(folder, tmp_path, capsys, change, needles):
    src = variant(folder, tmp_path, **change)
    out = tmp_path / "out"
    assert_one_line_error(run_inprocess(capsys, "import", "xlstm", str(src), str(out)), *needles)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["variant"]  # no temporary folder left


def test_ignore_field_lets_a_harmless_key_through(folder, tmp_path, capsys):
    src = variant(folder, tmp_path, config={"force_bos_token_insert": True})
    out = tmp_path / "out"
    r = run_inprocess(
        capsys, "import", "xlstm", str(src), str(out), "--ignore-field", "force_bos_token_insert"
    )
    assert r.returncode == 0, r.stderr
    assert SwaxLM.from_pretrained(out).config.layer_pattern == "X"


def test_import_refuses_missing_and_pickled_sources_and_keeps_out(folder, tmp_path, capsys):
    r = run_inprocess(capsys, "import", "xlstm", str(tmp_path / "nope"), str(tmp_path / "o"))
    assert_one_line_error(r, "does not exist")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(folder / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    r = run_inprocess(capsys, "import", "xlstm", str(pickled), str(tmp_path / "o"))
    assert_one_line_error(r, "pickled .bin checkpoints are not read")
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_inprocess(capsys, "import", "xlstm", str(folder), str(out))
    assert_one_line_error(r, "not empty", "nothing was overwritten")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    r = run_inprocess(
        capsys, "import", "xlstm", str(folder), str(tmp_path / "o"), "--add-swa", "--heads", "3"
    )
    assert_one_line_error(r, "--heads 3")


@pytest.mark.parametrize(
    "fields,needles",
    [
        (dict(layer_pattern="SX"), ["'SX'", "other layers than mLSTM"]),
        (dict(layer_pattern="X", mlstm_conv_size=4), ["mlstm_conv_size=4"]),
        (dict(layer_pattern="X"), ["no logit cap"]),
        (dict(layer_pattern="X", logit_soft_cap=30.0, gate_soft_cap=0.0), ["gate_soft_cap=0"]),
    ],
)
def test_export_refusals(tmp_path, capsys, fields, needles):
    SwaxLM(SwaxConfig(d_model=64, n_layers=2, n_heads=2, **fields)).save_pretrained(tmp_path / "m")
    r = run_inprocess(capsys, "export", "xlstm", str(tmp_path / "m"), str(tmp_path / "out"))
    assert_one_line_error(r, "transformers' xLSTM cannot express this model", *needles)
    assert not (tmp_path / "out").exists()


def meta_shapes(tr, **kw) -> tuple[dict, dict]:
    """(config dict, name -> shape) of transformers' xLSTMForCausalLM built on the meta device
    (no memory, no weights), xLSTM 7B's config by default."""
    cfg = tr.xLSTMConfig(**kw)
    with torch.device("meta"):
        model = tr.xLSTMForCausalLM(cfg)
    return cfg.to_dict(), {n: tuple(t.shape) for n, t in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["single", "fused"])
def test_7b_layout_maps_every_tensor(mode, monkeypatch):
    """xLSTM 7B's config (transformers' defaults) and tensors, on the meta device: every tensor
    maps one to one onto SwaxConfig.preset("xlstm-7b") (483 in the single layout), with equal
    shapes and 6.865B parameters on both sides."""
    tr = transformers_or_skip()
    if mode == "fused":  # transformers' fused initialisation crashes (its bug, not swax's)
        monkeypatch.setattr(tr.xLSTMPreTrainedModel, "_init_weights", lambda self, m: None)
    hf, shapes = meta_shapes(tr, weight_mode=mode)
    cfg = swax_config_from_xlstm(hf)
    assert cfg == SwaxConfig.preset("xlstm-7b")
    with torch.device("meta"):
        swax = SwaxLM(cfg)
    swax_shapes = {k: tuple(v.shape) for k, v in swax.state_dict().items()}
    slots = map_tensors(hf, cfg, shapes, swax_shapes)
    assert set(slots) == set(swax_shapes) and len(swax_shapes) == 483
    assert {src for src, _ in slots.values()} == set(shapes)
    assert len(shapes) == (483 if mode == "single" else 32 * 9 + 3)
    total = sum(math.prod(s) for s in shapes.values())
    assert total == swax.num_parameters() == 6_865_424_896


@pytest.mark.parametrize("d", [768, 1536, 2048, 2112, 4096])
def test_xlstm_mlp_rounding_is_transformers(d):
    tr = transformers_or_skip()
    _, shapes = meta_shapes(tr, hidden_size=d, num_hidden_layers=1, num_heads=4, vocab_size=64)
    theirs = shapes["backbone.blocks.0.ffn.proj_up.weight"][0]
    assert swiglu_hidden_dim(d, 2.667, 64, "xlstm") == theirs
    cfg = SwaxConfig.preset("xlstm-7b", d_model=d, n_layers=1, n_heads=4, recurrent_heads=4)
    with torch.device("meta"):
        assert SwaxLM(cfg).blocks[0].mlp.up.out_features == theirs


def test_init_xlstm_is_transformers_init():
    """init=xlstm draws what transformers' xLSTM initialisation draws: the same tensors zero,
    the same constants (gate biases, norms), normal tensors of the same standard deviation
    (within 5 %: the sample's own spread is below 1.5 % at these sizes)."""
    tr = transformers_or_skip()
    kw = dict(vocab_size=512, hidden_size=256, num_hidden_layers=3, num_heads=4)
    torch.manual_seed(0)
    theirs = tr.xLSTMForCausalLM(tr.xLSTMConfig(**kw))
    hf = theirs.config.to_dict()
    cfg = swax_config_from_xlstm(hf)
    assert cfg.init == "xlstm"
    torch.manual_seed(0)
    ours = SwaxLM(cfg)
    sd, tsd = ours.state_dict(), theirs.state_dict()
    shapes = {n: tuple(t.shape) for n, t in tsd.items()}
    slots = map_tensors(hf, cfg, shapes, {k: tuple(v.shape) for k, v in sd.items()})
    for name, (src, _) in slots.items():
        a, b = sd[name], tsd[src]
        if b.numel() < 1000 or b.std() == 0:  # biases, norms, zero weights: equal
            assert torch.equal(a, b.reshape(a.shape)), name
        else:
            assert float(a.mean().abs()) < 4 * float(b.std()) / math.sqrt(b.numel()) + 1e-3
            assert float(a.std()) == pytest.approx(float(b.std()), rel=0.05), name

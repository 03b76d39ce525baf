"""swax import xlstm / swax export xlstm against transformers' own xLSTMForCausalLM.

The reference is transformers' implementation (NX-AI's xLSTM 7B architecture), built tiny by
transformers itself and run in float64 for the error bound (xlstm_helpers): swax's float32
logits may be at most NOISE_FACTOR times as far from it as transformers' own float32 logits,
and within the acceptance bound 1e-4 of them.
"""

from __future__ import annotations

import json

import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.data import load_model_tokenizer
from tests.cli.test_cli import run_inprocess
from tests.export.xlstm_helpers import (
    VOCAB,
    assert_float32_close,
    fuse,
    max_err,
    tiny_xlstm,
    transformers_or_skip,
    write_tokenizer,
)

T = 150  # two chunks of 64 and a remainder: transformers' chunkwise and recurrent kernels


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(transformers model, its folder in the single layout with a tokenizer, the fused
    folder, a sharded folder)."""
    root = tmp_path_factory.mktemp("xlstm")
    model = tiny_xlstm()
    model.save_pretrained(root / "single")
    write_tokenizer(root / "single")
    fuse(root / "single", root / "fused")
    model.save_pretrained(root / "sharded", max_shard_size="200KB")
    return model, root


def ids(batch=2, length=T, seed=5):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def imported(capsys, src, out, *extra):
    r = run_inprocess(capsys, "import", "xlstm", str(src), str(out), "--threads", "1", *extra)
    assert r.returncode == 0, r.stderr
    return SwaxLM.from_pretrained(out)


@pytest.fixture(scope="module")
def reference(source):
    """transformers' logits on ids(): (float32, float64)."""
    model, _ = source
    x = ids()
    with torch.no_grad():
        ref32 = model(x).logits
        ref64 = model.double()(x).logits  # transformers casts the logits to float32 at the end
        model.float()
    return ref32, ref64


def test_import_logits_equal(source, reference, tmp_path, capsys):
    """single layout, with its tokenizer carried along"""
    _, root = source
    sw = imported(capsys, root / "single", tmp_path / "swax")
    assert sw.config.layer_types == "XX" and sw.config.logit_soft_cap == 30.0
    with torch.no_grad():
        got = sw(ids())
    diff = assert_float32_close(got, reference[1], reference[0])
    print(f"import single: max |dlogits| = {diff:.2e}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "swax" / name).read_bytes() == (root / "single" / name).read_bytes()
    tok = load_model_tokenizer(tmp_path / "swax")
    assert tok.decode(tok.encode("héllo")) == "héllo"


def test_import_fused_layout(source, reference, tmp_path, capsys, monkeypatch):
    """The fused layout, checked against transformers' own fused forward (its fused-weight
    initialisation crashes, a transformers bug: switched off while it loads the weights)."""
    tr = transformers_or_skip()
    _, root = source
    sw = imported(capsys, root / "fused", tmp_path / "swax")
    monkeypatch.setattr(tr.xLSTMPreTrainedModel, "_init_weights", lambda self, m: None)
    theirs = tr.xLSTMForCausalLM.from_pretrained(root / "fused").eval()
    assert theirs.config.weight_mode == "fused"
    with torch.no_grad():
        got, fused32 = sw(ids()), theirs(ids()).logits
    diff = assert_float32_close(got, reference[1], fused32)
    print(f"import fused: max |dlogits| = {diff:.2e}")


def test_import_sharded(source, reference, tmp_path, capsys):
    _, root = source
    assert (root / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((root / "sharded").glob("*.safetensors"))) > 1
    sw = imported(capsys, root / "sharded", tmp_path / "swax")
    with torch.no_grad():
        assert_float32_close(sw(ids()), reference[1], reference[0])


def test_import_greedy_tokens_equal(source, tmp_path, capsys):
    """64 greedy tokens: transformers' generate (its cache, one recurrent step per token) and
    swax's (chunked prefill, then its decode step)."""
    model, root = source
    sw = imported(capsys, root / "single", tmp_path / "swax")
    prompt = ids(batch=2, length=20, seed=7)
    with torch.no_grad():
        theirs = model.generate(prompt, max_new_tokens=64, do_sample=False, use_cache=True)
    ours = sw.generate(prompt, max_new_tokens=64, compile=False)
    assert theirs.shape == ours.shape == (2, 84)
    assert torch.equal(theirs, ours)


def test_import_bfloat16(source, tmp_path, capsys):
    """--dtype bfloat16 writes bfloat16 weights (half the bytes); loaded into float32 they are
    the source's weights rounded once."""
    _, root = source
    sw = imported(capsys, root / "single", tmp_path / "bf", "--dtype", "bfloat16")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "bf" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"}
    w = sw.embed.weight
    assert torch.equal(w, w.bfloat16().float())


def test_export_loads_without_remote_code(source, reference, tmp_path, capsys):
    """import, then export back: transformers' AutoModelForCausalLM loads the folder (model_type
    xlstm, no remote code) and computes the same logits."""
    tr = transformers_or_skip()
    _, root = source
    sw = imported(capsys, root / "single", tmp_path / "swax")
    r = run_inprocess(capsys, "export", "xlstm", str(tmp_path / "swax"), str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    back = tr.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(back).__name__ == "xLSTMForCausalLM"
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "xlstm"
    with torch.no_grad():
        theirs, ours = back(ids()).logits, sw(ids())
    assert_float32_close(theirs, reference[1], reference[0])
    diff = max_err(theirs, ours)
    assert diff <= 1e-4
    print(f"export: max |dlogits| = {diff:.2e}")
    tok = tr.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.decode(tok("héllo").input_ids) == "héllo"


def test_export_of_a_swax_model(tmp_path, capsys):
    """A model swax built (tied embeddings, its own MLP rounding, 96 wide: transformers' cache
    needs multiples of 64, so the export sets use_cache off) loads in transformers with equal
    logits, and transformers' float64 forward bounds both."""
    tr = transformers_or_skip()
    torch.manual_seed(0)
    cfg = SwaxConfig(d_model=96, n_layers=2, n_heads=2, layer_pattern="X", logit_soft_cap=30.0)
    model = SwaxLM(cfg.replace(init_std=0.1)).eval()
    model.save_pretrained(tmp_path / "swax")
    r = run_inprocess(capsys, "export", "xlstm", str(tmp_path / "swax"), str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    theirs = tr.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert theirs.config.use_cache is False
    x = torch.randint(0, 257, (2, 90), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, ref32 = model(x), theirs(x).logits
        ref64 = theirs.double()(x).logits
    assert_float32_close(ours, ref64, ref32)


def test_add_swa_equal_at_step_0_then_trains(source, reference, tmp_path, capsys):
    """--add-swa: an SWA block after each mLSTM block, its output and MLP down projections
    zero, so the logits are the source's (bit for bit those of the plain import); then swax
    train init_from= trains it with a stochastic window and the new blocks move."""
    _, root = source
    plain = imported(capsys, root / "single", tmp_path / "plain")
    sw = imported(capsys, root / "single", tmp_path / "swa", "--add-swa", "--window", "32")
    assert sw.config.layer_types == "XSXS" and sw.config.window == 32
    with torch.no_grad():
        got = sw(ids(), window=8)
        assert torch.equal(got, plain(ids()))
    assert_float32_close(got, reference[1], reference[0])
    assert not sw.blocks[1].mixer.o_proj.weight.detach().any()
    run = tmp_path / "run"
    args = [f"init_from={tmp_path / 'swa'}", f"run_dir={run}", "steps=4", "seq_len=64"]
    args += ["batch_size=2", "window.kind=stochastic", "window.short=8", "window.long=32"]
    args += ["log.val_every=0", "log.val_batches=1", "checkpoint.every=0", "log.every=1"]
    r = run_inprocess(capsys, "train", *args, "optim.warmup_steps=0", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "weights from" in r.stderr
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines if "loss" in x]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    trained = SwaxLM.from_pretrained(run / "model")
    assert trained.config.window == 32 and trained.config.layer_types == "XSXS"
    assert trained.blocks[1].mixer.o_proj.weight.detach().any()
    assert trained.blocks[3].mlp.down.weight.detach().any()

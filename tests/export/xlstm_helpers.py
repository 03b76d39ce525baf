"""Tiny transformers xLSTM models for the interop tests, built by transformers itself (no hub).

Weights: transformers' own initialisation zeroes the gate weights, which would leave the
gates untested, so every tensor is redrawn: matrices Normal(0, 0.05), the embedding and head
Normal(0, 0.5), norms 1 + Normal(0, 0.1), input-gate biases -2 + Normal(0, 1), forget-gate
biases 4 + Normal(0, 1). At these scales float32 round-off moves the logits by ~1e-5 (measured
against transformers' own float64 forward), well inside the acceptance bound of 1e-4.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

VOCAB = 300  # above the byte tokenizer's 257: swax train's default data fits
TINY = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_heads=2)
"""0.5 · 128 = 64: transformers' xLSTM cache works (it needs multiples of 64)."""
ACCEPT = 1e-4
"""The issue's acceptance bound on max |Δlogits| (float32)."""
NOISE_FACTOR = 8
"""swax's float32 error may be this many times transformers' own float32 error (both against
transformers' float64 forward) before the test fails."""
FLOOR = 2e-6
"""An absolute floor for that bound, for inputs where transformers' own error happens to be
tiny: a few float32 ulps of logits of size ~20."""


def transformers_or_skip():
    return pytest.importorskip("transformers", reason="needs transformers (pip install '.[test]')")


def randomise(model, seed: int = 1) -> None:
    """Redraw every tensor of a transformers xLSTM (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1 + 0.1 * r)
            elif "igate_preact.bias" in name:
                p.copy_(-2 + r)
            elif "fgate_preact.bias" in name:
                p.copy_(4 + r)
            elif "embeddings" in name or "lm_head" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.05 * r)


def tiny_xlstm(seed: int = 1, **kw):
    """A tiny xLSTMForCausalLM (weight_mode single) with redrawn weights, in eval mode."""
    tr = transformers_or_skip()
    torch.manual_seed(0)
    cfg = tr.xLSTMConfig(**{**TINY, "eos_token_id": None, **kw})
    model = tr.xLSTMForCausalLM(cfg).eval()
    randomise(model, seed)
    return model


def write_tokenizer(folder: Path) -> None:
    """A tokenizer.json (byte-level BPE without merges) and its tokenizer_config.json."""
    from swax.export import BYTE_EOT_TOKEN, byte_level_hf_tokenizer

    byte_level_hf_tokenizer().save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": BYTE_EOT_TOKEN}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def fuse(single: Path, out: Path) -> None:
    """The folder ``single`` (weight_mode single) rewritten in the fused layout, the way
    transformers' fused xLSTMLayer splits its projections: qkv_opreact = [q, k, v, o],
    ifgate_preact = [i, f], proj_up_gate_z = [gate, z]."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(single / "model.safetensors"))
    fused = {}
    for name, t in sd.items():
        if name.endswith("mlstm_layer.q.weight"):
            p = name[: -len("q.weight")]
            parts = ("q", "k", "v", "ogate_preact")
            fused[p + "qkv_opreact.weight"] = torch.cat([sd[f"{p}{x}.weight"] for x in parts])
            for kind in ("weight", "bias"):
                i, f = sd[f"{p}igate_preact.{kind}"], sd[f"{p}fgate_preact.{kind}"]
                fused[f"{p}ifgate_preact.{kind}"] = torch.cat([i, f])
        elif name.endswith("ffn.proj_up_gate.weight"):
            p = name[: -len("proj_up_gate.weight")]
            fused[p + "proj_up_gate_z.weight"] = torch.cat([t, sd[p + "proj_up.weight"]])
        elif not any(s in name for s in (".k.", ".v.", "gate_preact", "proj_up.weight")):
            fused[name] = t
    out.mkdir(parents=True)
    save_file(fused, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((single / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "weight_mode": "fused"}))


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_float32_close(got: torch.Tensor, ref64: torch.Tensor, ref32: torch.Tensor) -> float:
    """``got`` (swax, float32) within NOISE_FACTOR x transformers' own float32 error of
    transformers' float64 logits ``ref64`` (+ FLOOR), and within the acceptance bound; returns
    max |got - ref32|."""
    own, err = max_err(ref32, ref64), max_err(got, ref64)
    assert err <= NOISE_FACTOR * own + FLOOR, (err, own)
    diff = max_err(got, ref32)
    assert diff <= ACCEPT, diff
    print(
        f"|swax - f64| {err:.2e}, |transformers f32 - f64| {own:.2e}, |swax - transformers| "
        f"{diff:.2e}"
    )
    return diff

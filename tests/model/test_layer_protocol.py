"""A new layer kind decodes without touching the decode code (docs/design.md, "A layer kind").

A toy mixer (a per-channel decaying sum, its state one (B, d) tensor) is registered as a new
letter the way the design note says: a module with ``forward`` and ``step``, an entry in
``config.LAYER_KINDS`` and one in ``model.MIXERS``. Greedy generation, eager and traced, must
then give the tokens that recomputing the whole forward at every step gives (the naive
reference, which never uses a state), and the traced step the eager step's tokens for 256 steps.
"""

import inspect
import re

import pytest
import torch
from torch import nn

import swax.decode as swax_decode
from swax import SwaxConfig, SwaxLM
from swax.config import LAYER_KINDS, LayerKind
from swax.generate import generate, generate_batch
from swax.layers.base import TokenMixer
from swax.model import MIXERS, Mixer

VOCAB = 53


class ToyDecay(TokenMixer):
    """h_t = decay * h_{t-1} + W_in x_t, y_t = W_out h_t; state (h,)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.inp = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.decay = nn.Parameter(torch.empty(d_model))

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.inp.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)
        self.decay.uniform_(0.5, 0.95)

    def forward(self, x, window=None, state=None, return_state=False, doc_ids=None):
        if x.shape[1] == 1 and state is not None:
            y, new = self.forward_one(x, state, 0, window)
            return (y, new) if return_state else y
        h = x.new_zeros(x.shape[0], x.shape[2]) if state is None else state[0]
        u, ys = self.inp(x), []
        for t in range(x.shape[1]):
            h = self.decay * h + u[:, t]
            ys.append(h)
        y = self.out(torch.stack(ys, 1))
        return (y, (h,)) if return_state else y

    def step(self, x, buffers, pos):
        (h,) = buffers
        h.copy_(self.decay * h + self.inp(x))
        return self.out(h)


@pytest.fixture
def toy_kind(monkeypatch):
    monkeypatch.setitem(LAYER_KINDS, "T", LayerKind("toy decay", windowed=False))
    monkeypatch.setitem(
        MIXERS, "T", Mixer("toy decay", ToyDecay, lambda cfg: {"d_model": cfg.d_model}, False)
    )
    monkeypatch.setattr(swax_decode, "BACKEND", "aot_eager")  # traced, not inductor-compiled
    torch.manual_seed(0)
    cfg = SwaxConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_layers=2,
        n_heads=4,
        window=8,
        chunk_size=16,
        layer_pattern="ST",
        init_std=0.5,
    )
    return SwaxLM(cfg).eval()


def naive_greedy(model, ids, n):
    seq = ids
    for _ in range(n):
        with torch.no_grad():
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return seq


def test_a_toy_layer_kind_generates_like_the_naive_forward(toy_kind):
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    want = naive_greedy(toy_kind, ids, 24)
    assert torch.equal(generate(toy_kind, ids, 24, compile=False), want)
    assert torch.equal(generate(toy_kind, ids, 24, compile=True), want)
    assert len(set(want[0, 11:].tolist())) >= 5  # not one token repeated
    prompts = [ids[0, :5].tolist(), ids[1].tolist()]  # mixed lengths, one static batch
    got = generate_batch(toy_kind, prompts, 12, compile=True)
    assert got == [
        naive_greedy(toy_kind, torch.tensor([p]), 12)[0, len(p) :].tolist() for p in prompts
    ]


def test_a_toy_layer_kind_traced_matches_eager_for_256_steps(toy_kind):
    ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    eager, s_eager = generate(toy_kind, ids, 256, compile=False, return_state=True)
    comp, s_comp = generate(toy_kind, ids, 256, compile=True, return_state=True)
    assert torch.equal(comp, eager)
    assert toy_kind.__dict__["_swax_decode_steps"]  # it did go through a traced step
    (h_e,), (h_c,) = s_eager.layers[1], s_comp.layers[1]
    # decay <= 0.95: each step's rounding (2^-24 relative) is summed geometrically, <= 20 of them
    assert torch.allclose(h_c, h_e, rtol=20 * 2**-24, atol=20 * 2**-24 * h_e.abs().max().item())


def test_the_decode_module_names_no_layer_kind():
    """decode.py goes through the mixers' protocol only: no layer letters, no layer classes."""
    src = inspect.getsource(swax_decode)
    assert not re.search(r"""["'][SXDA]["']""", src)
    for name in ("layer_types", "AttentionState", "MLSTMLayer", "GatedDeltaNet", "MIXERS"):
        assert name not in src, name

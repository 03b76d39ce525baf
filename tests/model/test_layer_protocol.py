"""A new layer kind decodes without touching the decode code (docs/design.md, "A layer kind").

A toy mixer (a per-channel decaying sum, its state one (B, d) tensor) is registered as a new
letter the way the design note says: a TokenMixer with ``reset_parameters``, ``sequence`` and
``step``, and one entry in ``config.LAYER_KINDS``. Greedy generation, eager and traced, must
then give the tokens that recomputing the whole forward at every step gives (the naive
reference, which never uses a state), and the traced step the eager step's tokens for 256 steps.
"""

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import swax
import swax.decode as swax_decode
import swax.decode.steps as decode_steps
from swax import SwaxConfig, SwaxLM
from swax.config import LAYER_KINDS, LayerKind
from swax.core.errors import ConfigError
from swax.generate import generate, generate_batch
from swax.layers.base import TokenMixer
from swax.state import map_tensors

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

    def sequence(self, x, window, state, return_state, doc_ids):
        h = x.new_zeros(x.shape[0], x.shape[2]) if state is None else state[0]
        u, ys = self.inp(x), []
        for t in range(x.shape[1]):
            h = self.decay * h + u[:, t]
            ys.append(h)
        return self.out(torch.stack(ys, 1)), (h,)

    def step(self, x, buffers, pos):
        (h,) = buffers
        h.copy_(self.decay * h + self.inp(x))
        return self.out(h)


def small_cfg(pattern: str, n_layers: int, chunk_size: int, **extra) -> SwaxConfig:
    """A small model's config: vocabulary VOCAB, width 32, 4 heads, window 8."""
    return SwaxConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_heads=4,
        window=8,
        layer_pattern=pattern,
        n_layers=n_layers,
        chunk_size=chunk_size,
        **extra,
    )


@pytest.fixture
def toy_kind(monkeypatch):
    kind = LayerKind("toy decay", False, ToyDecay, lambda cfg: {"d_model": cfg.d_model})
    monkeypatch.setitem(LAYER_KINDS, "T", kind)
    monkeypatch.setattr(decode_steps, "BACKEND", "aot_eager")  # traced, not inductor-compiled
    torch.manual_seed(0)
    cfg = small_cfg("ST", 2, 16, init_std=0.5)
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
    assert swax_decode.Decoder.step_cache.keys(toy_kind)  # it did go through a traced step
    (h_e,), (h_c,) = s_eager.layers[1], s_comp.layers[1]
    # decay <= 0.95: each step's rounding (2^-24 relative) is summed geometrically, <= 20 of them
    assert torch.allclose(h_c, h_e, rtol=20 * 2**-24, atol=20 * 2**-24 * h_e.abs().max().item())


def test_the_decode_package_names_no_layer_kind():
    """swax.decode goes through the mixers' protocol only: no layer letters, no layer
    classes, in any of its modules."""
    files = sorted(Path(swax_decode.__file__).parent.glob("*.py"))
    assert len(files) > 1
    for path in files:
        src = path.read_text()
        assert not re.search(r"""["'][SXDA]["']""", src), path.name
        for name in ("layer_types", "AttentionState", "MLSTMLayer", "GatedDeltaNet", "LAYER_KINDS"):
            assert name not in src, (path.name, name)


# ------------------------------------------------------------------------------ one path each

KINDS = [("S", {}), ("X", {}), ("X", {"mlstm_conv_size": 4}), ("D", {}), ("A", {})]


@pytest.mark.parametrize("kind, extra", KINDS, ids=[k + str(bool(e)) for k, e in KINDS])
def test_a_blocks_single_token_step_is_its_forward_on_the_last_token(kind, extra):
    """Block.step (what the decode runs) on the buffers of a prefix equals Block.forward of the
    whole sequence at its last position, for every layer kind. In float64, where what is left is
    float32 rounding in a few places (recurrent states are float32 whatever the input dtype, and
    RoPE rotates in float32), amplified by the layers that follow: 64 units of float32 at the
    output's scale."""
    from swax.model import Block

    torch.manual_seed(0)
    cfg = small_cfg(kind, 1, 4, init_std=0.3, **extra)
    block = Block(cfg, kind).to_empty(device="cpu").double()
    block.reset_parameters(0.3, 0.2)
    block = block.double()
    x = torch.randn(3, 11, 32, dtype=torch.float64)
    w = 8 if kind == "S" else None
    with torch.no_grad():
        full, _ = block(x, w)
        _, state = block(x[:, :-1], w, return_state=True)
        buffers = block.mixer.decode_buffers(state, 16)
        pos = torch.full((3,), 10, dtype=torch.long)
        one = block.step(x[:, -1], buffers, pos)
    scale = full[:, -1].abs().max().item()
    assert (one - full[:, -1]).abs().max().item() <= 64 * 2.0**-24 * scale


def test_no_layer_computes_its_projections_in_two_places():
    """Each mixer calls each of its linear projections, and its convolution, at one place of its
    source (the function that sequence and step share)."""
    from swax.model import mixer_class

    cfg = SwaxConfig(d_model=32, n_heads=4, mlstm_conv_size=4)
    for letter, kind in LAYER_KINDS.items():
        cls = mixer_class(letter)
        layer = cls(**kind.args(cfg))
        src = "".join(
            inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("swax.layers")
        )
        names = [n for n, m in layer.named_children() if isinstance(m, nn.Linear)]
        assert names, letter
        for name in names:  # called, or through gate_linear (in float32)
            calls = re.findall(rf"self\.{name}\(|gate_linear\(self\.{name},", src)
            assert len(calls) == 1, (letter, name)
        assert len(re.findall(r"causal_conv1d\(", src)) <= 1, letter


# ------------------------------------------------------------------------------ what a letter is

RECURRENT = {"X", "D"}
"""What the letters stand for, written down here as the reference the registry must answer."""
ROPE = {"S": True, "X": False, "D": False, "A": None}  # None: as full_attn_rope says
GROWS = {"A"}


def test_the_registry_answers_what_each_kind_is():
    for letter, kind in LAYER_KINDS.items():
        assert kind.recurrent == (letter in RECURRENT), letter
        assert kind.state_grows == (letter in GROWS), letter
        for full_rope in (True, False):
            cfg = SwaxConfig(d_model=32, n_heads=4, full_attn_rope=full_rope)
            want = full_rope if ROPE[letter] is None else ROPE[letter]
            assert kind.uses_rope(cfg) == want, (letter, full_rope)


def numel(layer_state) -> int:
    """Elements of one layer's state (a tuple of tensors, or an AttentionState)."""
    count = []
    map_tensors(layer_state, lambda t: count.append(t.numel()))
    return sum(count)


@pytest.mark.parametrize("full_rope", [True, False])
def test_the_registry_matches_the_layers_it_builds(full_rope):
    """Held to the built model: the mixers' own rope flag, a decode state that grows with the
    context (prefill of 20 and of 40 tokens, window 8), the probe's reset."""
    from swax.probes.episodes import reset_recurrent_state

    torch.manual_seed(0)
    cfg = small_cfg("SXDA", 4, 8, full_attn_rope=full_rope)
    model = SwaxLM(cfg).eval()
    with torch.no_grad():
        _, short = model(torch.randint(0, VOCAB, (1, 20)), return_state=True)
        _, long = model(torch.randint(0, VOCAB, (1, 40)), return_state=True)
    reset = reset_recurrent_state(model, long)
    for i, (letter, block) in enumerate(zip(cfg.layer_types, model.blocks)):
        kind = LAYER_KINDS[letter]
        assert getattr(block.mixer, "rope", False) == kind.uses_rope(cfg), letter
        sizes = [numel(s.layers[i]) for s in (short, long)]
        assert (sizes[1] > sizes[0]) == kind.state_grows, (letter, sizes)
        assert (reset.layers[i] is None) == kind.recurrent, letter
        assert reset.layers[i] is None or reset.layers[i] is long.layers[i]


def test_rope_needs_an_even_head_width_only_where_a_kind_uses_it():
    odd = dict(d_model=32, n_heads=4, head_dim=9, n_layers=2)  # attention heads 9 wide
    SwaxConfig(layer_pattern="XD", **odd)
    SwaxConfig(layer_pattern="A", full_attn_rope=False, **odd)
    for pattern in ("S", "A", "XA"):
        with pytest.raises(ConfigError, match="must be even for RoPE"):
            SwaxConfig(layer_pattern=pattern, **odd)


def test_a_new_kind_says_what_it_is(toy_kind, monkeypatch):
    """A toy kind registered as recurrent is reset by the recurrent-reset probe; registered as
    not, it keeps its state: the probe asks the registry, not a list of letters."""
    from swax.probes.episodes import reset_recurrent_state

    with torch.no_grad():
        _, state = toy_kind(torch.randint(0, VOCAB, (1, 6)), return_state=True)
    assert reset_recurrent_state(toy_kind, state).layers[1] is state.layers[1]
    monkeypatch.setitem(LAYER_KINDS, "T", LAYER_KINDS["T"]._replace(recurrent=True))
    reset = reset_recurrent_state(toy_kind, state)
    assert reset.layers[1] is None and reset.layers[0] is state.layers[0]


def letter_tests(path) -> list[str]:
    """Places in ``path`` that stand for what layer letters are: a membership test
    (``"S" in pattern``, ``k in ("X", "D")``, ``k in "XD"``) or a collection of letters
    (``RECURRENT_KINDS = ("X", "D")``): what the registry should be asked instead."""

    def letters(node) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
            return all(letters(e) for e in node.elts)
        text = node.value if isinstance(node, ast.Constant) else None
        return isinstance(text, str) and bool(text) and set(text) <= set("SXDA")

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            if letters(node.left) or letters(node.comparators[0]):
                found.add(node.lineno)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
            if letters(node):
                found.add(node.lineno)
    return [f"{path.name}:{line}" for line in sorted(found)]


def test_no_module_tests_layer_letters():
    package = Path(swax.__file__).parent
    found = [hit for p in sorted(package.rglob("*.py")) for hit in letter_tests(p)]
    assert found == [], "ask swax.config.LAYER_KINDS instead: " + ", ".join(found)

"""One pick per token: swax.sampling is the one module that turns logits into token ids.

A source check finds any pick outside it (a draw anywhere in the package, an argmax, top-k or
softmax in the modules that generate); the behavioural checks hold the decode step's picks to
:func:`swax.sampling.sample_next`, the prefill's pick, given the same logits and generator.
"""

import ast
from pathlib import Path

import pytest
import torch

import swax
from swax import SwaxConfig, SwaxLM
from swax.decode import Decoder, StaticState, capacity_for, decode_logits
from swax.generate import prefill
from swax.sampling import Sampling, sample_next

PACKAGE = Path(swax.__file__).parent
DRAWS = {"multinomial", "bernoulli", "poisson"}
"""Calls that draw a token: only swax/sampling.py may make one."""
PICKS = {"argmax", "topk", "softmax", "sort"} | DRAWS
"""Calls that pick a token from logits: none in the modules that generate."""
GENERATING = ("generate.py", "decode.py", "decode/", "model.py", "cli/generate.py")
"""The modules that produce tokens (decode.py or the decode package, whichever there is)."""


def calls_in(path: Path) -> list[tuple[str, int]]:
    """(name, line) of every call of an attribute or a name in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name:
                out.append((name, node.lineno))
    return out


def test_no_token_is_picked_outside_sampling():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "sampling.py":
            continue
        names = PICKS if rel.startswith(GENERATING) else DRAWS
        found += [f"swax/{rel}:{line} {name}" for name, line in calls_in(path) if name in names]
    assert found == [], "picks outside swax/sampling.py: " + ", ".join(found)


def test_the_source_check_finds_a_pick(tmp_path):
    """The check above is not vacuous: it sees the picks written the ways decode wrote them."""
    src = tmp_path / "step.py"
    src.write_text(
        "def f(logits, g):\n    a = logits.argmax(-1)\n    return torch.multinomial(a, 1, g)\n"
    )
    assert calls_in(src) == [("argmax", 2), ("multinomial", 3)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = SwaxConfig(
        vocab_size=61, d_model=32, n_layers=2, n_heads=4, window=8, chunk_size=16, init_std=0.5
    )
    return SwaxLM(cfg).eval()


@pytest.mark.parametrize(
    "sampling",
    [Sampling(), Sampling(0.8), Sampling(1.0, 5), Sampling(1.2, None, 0.9), Sampling(0.7, 9, 0.8)],
    ids=["greedy", "temperature", "top_k", "top_p", "top_k_top_p"],
)
def test_decode_picks_what_sample_next_picks(model, sampling):
    """The eager decode step's ids, step after step, are sample_next's on the step's logits
    (computed apart on a copy of the buffers) with a twin of the generator."""
    ids = torch.randint(0, 61, (3, 11), generator=torch.Generator().manual_seed(1))
    logits, state = prefill(model, ids, window=8)
    gen, twin = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    args = (sampling.temperature, sampling.top_k, sampling.top_p)
    first = sample_next(logits, *args, generator=gen)
    decoder = Decoder.start(model, [(state, range(3))], first, sampling, False, 20, gen)
    ref = StaticState.from_parts(model, [(state, range(3))], capacity_for(11 + 20))
    got, want = first, sample_next(logits, *args, generator=twin)
    for _ in range(20):
        assert torch.equal(got, want)
        with torch.no_grad():
            step_logits = decode_logits(model, ref.layers, want, ref.pos)
        got, want = decoder.advance(got), sample_next(step_logits, *args, generator=twin)
    assert torch.equal(got, want)
    assert len(set(decoder.static.pos.tolist())) == 1

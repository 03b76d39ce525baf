"""The compiled decode step (swax.decode) against the eager decode, its reference.

The eager path (``compile=False``) is checked against naive recomputation and the naive ops in
tests/model/test_generate.py and the op tests; here the compiled fixed-shape step must give the same
tokens (greedy and seeded sampling), the same final state within float32 rounding, and batched
decoding of prompts of different lengths must give each prompt the tokens it gets alone.

An inductor compile costs tens of seconds here (each test process has a cold inductor cache,
tests/conftest.py), so the fast tier traces the step with torch.compile's ``aot_eager`` backend
(dynamo's full graph and AOT autograd, without inductor's C++ code: seconds), in one
configuration shared by its tests (the ``sx_traced`` model at batch 4, greedy); the slow tier
compiles with inductor, as users get it, for every pattern and the sampling modes.
"""

import copy
import gc
import logging
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import swax.decode.steps as decode_steps
from swax import SwaxConfig, SwaxLM
from swax import decode as swax_decode
from swax.decode import Decoder, StepCache
from swax.decode.cache import step_key
from swax.generate import generate, generate_batch
from swax.layers.attention import AttentionState
from swax.ops.registry import FailureRecord
from swax.sampling import Sampling
from tests.helpers import FLOOR, NOISE_FACTOR, U32, rel_err

VOCAB = 61
STEPS = 256


def small_model(pattern: str, seed: int = 0) -> SwaxLM:
    torch.manual_seed(seed)
    cfg = SwaxConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,  # grouped-query attention in the S and A layers
        window=8,
        chunk_size=16,
        layer_pattern=pattern,
        init_std=0.5,  # varied tokens (at 0.02 a random model repeats one token forever)
    )
    return SwaxLM(cfg).eval()


@pytest.fixture(scope="module")
def sx():
    return small_model("SX")


@pytest.fixture
def aot_eager(monkeypatch):
    """Steps compiled while this fixture is active use the aot_eager backend."""
    monkeypatch.setattr(decode_steps, "BACKEND", "aot_eager")


@pytest.fixture(scope="module")
def sx_traced():
    """The SX model whose compiled steps come from aot_eager (its own object: the compiled
    steps are kept per model, and the inductor tests must not find these)."""
    return small_model("SX")


def state_tensors(state) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor of a SwaxState, layer by layer."""
    out = []
    for i, layer in enumerate(state.layers):
        if isinstance(layer, AttentionState):
            out += [(f"layer {i} k", layer.k), (f"layer {i} v", layer.v)]
        else:
            out += [(f"layer {i} state[{j}]", t) for j, t in enumerate(layer)]
    return out


def state_noise_floors(model, ids: torch.Tensor, draws: int = 2) -> list[float]:
    """For each tensor of the state after ``ids`` (one teacher-forced pass): the normwise change
    of its float64 value when every parameter of a float64 copy of the model is perturbed by
    one float32 rounding (relative 2^-24): how far float32 rounding alone moves it (as
    helpers.model_noise_floor does for one output)."""
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        ref = [t for _, t in state_tensors(model64(ids, return_state=True)[1])]
    g = torch.Generator().manual_seed(0)
    worst = [0.0] * len(ref)
    for _ in range(draws):
        m = copy.deepcopy(model64)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + U32 * (2 * torch.rand(p.shape, generator=g, dtype=torch.float64) - 1))
            got = [t for _, t in state_tensors(m(ids, return_state=True)[1])]
        worst = [max(w, rel_err(a, e)) for w, a, e in zip(worst, got, ref)]
    return worst


def check_compiled_matches_eager(model, ids, steps=STEPS):
    """Same tokens for ``steps`` greedy steps; every final state tensor of the compiled path
    within 2 x NOISE_FACTOR x its float32 noise floor (+ FLOOR) of the eager one (two float32
    computations, each within NOISE_FACTOR of the exact value)."""
    eager, s_eager = generate(model, ids, steps, compile=False, return_state=True)
    comp, s_comp = generate(model, ids, steps, compile=True, return_state=True)
    assert torch.equal(comp, eager)
    assert min(len(set(r)) for r in eager[:, ids.shape[1] :].tolist()) >= 10  # not one token
    assert s_comp.pos == s_eager.pos == ids.shape[1] + steps - 1
    floors = state_noise_floors(model, eager[:, :-1])  # the ids both states consumed
    for (name, a), (_, e), floor in zip(state_tensors(s_comp), state_tensors(s_eager), floors):
        assert a.shape == e.shape, name
        err, bound = rel_err(a, e), 2 * NOISE_FACTOR * floor + FLOOR
        assert err <= bound, f"{name}: {err:.3e} > {bound:.3e} (floor {floor:.3e})"


def test_traced_greedy_matches_eager_sx(sx_traced, aot_eager):
    ids = torch.randint(0, VOCAB, (4, 13), generator=torch.Generator().manual_seed(1))
    check_compiled_matches_eager(sx_traced, ids)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["SX", "SD", "SA", "XS"])
def test_compiled_greedy_matches_eager(pattern):
    """Inductor. SD: Gated DeltaNet; SA: full attention over a capacity buffer (prompt longer
    than the window); XS: a recurrent layer first."""
    assert swax_decode.compile_backend() == "inductor"  # the slow tier compiles for real
    model = small_model(pattern, seed=2)
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(3))
    check_compiled_matches_eager(model, ids)


def test_fast_tier_traces_with_aot_eager(monkeypatch):
    """$SWAX_COMPILE_BACKEND picks the backend (conftest sets aot_eager outside the slow tier)."""
    assert swax_decode.compile_backend() == "aot_eager"
    monkeypatch.delenv("SWAX_COMPILE_BACKEND")
    assert swax_decode.compile_backend() == swax_decode.BACKEND == "inductor"


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0.8), dict(temperature=1.0, top_k=5), dict(temperature=1.2, top_p=0.9)],
    ids=["temperature", "top_k", "top_p"],
)
def test_seeded_sampling_matches_eager(sx, sampling):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    eager = generate(sx, ids, 64, seed=11, compile=False, **sampling)
    comp = generate(sx, ids, 64, seed=11, compile=True, **sampling)
    assert torch.equal(comp, eager)
    assert not torch.equal(eager, generate(sx, ids, 64, compile=False))  # it did sample


def alone(model, prompt, n, eos):
    """The new ids ``generate`` gives ``prompt`` alone (eager), cut after eos."""
    new = generate(model, prompt[None], n, eos_token_id=eos, compile=False)[0, len(prompt) :]
    new = new.tolist()
    return new[: new.index(eos) + 1] if eos in new else new


def mixed_prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in (7, 1, 30, 12)]


def stopping_token(model, prompts, n) -> int:
    """A token that ends some prompt's generation part-way (not before its 4th new token) and
    never appears in another's: rows stopping early are masked while others go on."""
    gens = [alone(model, p, n, None) for p in prompts]
    for t in range(VOCAB):
        first = [g.index(t) if t in g else None for g in gens]
        if any(f is not None and 3 <= f < n - 5 for f in first) and None in first:
            return t
    raise AssertionError("no token stops one prompt early and not another")


def check_batch_matches_alone(model, prompts, n, compile):
    eos = stopping_token(model, prompts, n)
    refs = [alone(model, p, n, eos) for p in prompts]
    assert any(len(r) < n for r in refs) and any(len(r) == n for r in refs)
    assert generate_batch(model, prompts, n, eos_token_id=eos, compile=compile) == refs


def test_batch_of_mixed_lengths_matches_each_alone(sx_traced, aot_eager):
    """4 prompts (7, 1, 30 and 12 tokens: under, at and over the window of 8) decoded together
    at per-row positions by the traced step (the batch of the test above: no new trace)."""
    check_batch_matches_alone(sx_traced, mixed_prompts(), 40, compile=True)


def test_batch_without_compile_matches_each_alone(sx):
    check_batch_matches_alone(sx, mixed_prompts(), 40, compile=False)


@pytest.mark.slow
def test_batch_with_full_attention_matches_each_alone():
    """Inductor; per-row positions in the A layers' capacity buffers; a batch padded from 3
    rows to 4."""
    model = small_model("SA", seed=2)
    check_batch_matches_alone(model, mixed_prompts()[:3], 40, compile=True)


def test_failed_compile_falls_back_to_eager_with_one_warning(monkeypatch, caplog):
    model = small_model("SX", seed=6)

    def broken(self, model, static, tok, values):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(swax_decode.StepRunner, "warm_up", broken)
    monkeypatch.setattr(Decoder, "step_cache", StepCache(failures=FailureRecord()))
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(7))
    with caplog.at_level(logging.WARNING, logger="swax"):
        a = generate(model, ids, 20, compile=True)
        b = generate(model, ids, 20, compile=True)  # no second attempt, no second warning
    warnings = [r for r in caplog.records if "compiling the decode step failed" in r.message]
    assert len(warnings) == 1 and "no C compiler" in warnings[0].message
    assert torch.equal(a, generate(model, ids, 20, compile=False)) and torch.equal(a, b)


def test_automatic_compile_skips_short_generations_on_the_cpu(monkeypatch):
    model = small_model("SX", seed=6)

    def unexpected(self, model, static, tok, values):
        raise AssertionError("compiled a short generation")

    monkeypatch.setattr(swax_decode.StepRunner, "warm_up", unexpected)
    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(8))
    generate(model, ids, 16)  # compile=None: 16 tokens, eager
    assert not Decoder.step_cache.keys(model)


@pytest.mark.parametrize(
    "prompts, kwargs, match",
    [
        ([], {}, "non-empty list"),
        (torch.tensor([[1, 2]]), {}, "non-empty list"),
        ([[1, 2], []], {}, "prompt 1"),
        ([[1, 2], [[1]]], {}, "prompt 1"),
        ([[1, VOCAB]], {}, "outside 0"),
        ([[1.5, 2.0]], {}, "prompt 0"),
        ([[1, 2]], {"batch_size": 0}, "batch_size"),
        ([[1, 2]], {"compile": "yes"}, "compile must be"),
        ([[1, 2]], {"max_new_tokens": -1}, "max_new_tokens"),
        ([[1, 2]], {"stop_strings": ["x"]}, "detokenize function"),
    ],
)
def test_generate_batch_rejects_bad_input(sx, prompts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_batch(sx, prompts, **kwargs)


def test_generate_rejects_bad_compile_flag(sx):
    with pytest.raises(ValueError, match="compile must be"):
        generate(sx, torch.tensor([[1, 2]]), 4, compile=1)


def _no_compile(monkeypatch, calls=None, fail=None, **cache_args) -> StepCache:
    """StepRunner.warm_up without compiling (the cache's logic is what is tested): counts the
    configurations it is asked for, and raises ``fail(batch)`` for those it returns one. The
    decoders use a fresh StepCache(**cache_args) with a failure record of its own, returned."""

    def warm_up(self, model, static, tok, values):
        if calls is not None:
            calls.append(tok.shape[0])
        err = fail(tok.shape[0]) if fail is not None else None
        if err is not None:
            raise err
        self.compile_s = 0.5

    monkeypatch.setattr(swax_decode.StepRunner, "warm_up", warm_up)
    cache = StepCache(failures=FailureRecord(), **cache_args)
    monkeypatch.setattr(Decoder, "step_cache", cache)
    return cache


def test_the_step_cache_is_bounded_least_recently_used_first(monkeypatch):
    model = small_model("SX", seed=6)
    calls = []
    cache = _no_compile(monkeypatch, calls, max_steps=3)

    def batch(b):  # a batch of b rows: a configuration of its own
        generate(model, torch.arange(1, 1 + 3 * b).view(b, 3), 4, compile=True)

    for b in (1, 2, 3):
        batch(b)
    batch(1)  # a hit
    assert calls == [1, 2, 3]
    batch(4)
    assert len(cache.keys(model)) == 3 and calls == [1, 2, 3, 4]
    kept = [key.batch for key in cache.keys(model)]  # oldest first
    assert kept == [3, 1, 4]  # 2, the least recently used, went
    assert swax_decode.compile_seconds(model) == 4 * 0.5  # evictions do not unsay the cost


def test_sampling_values_share_one_compiled_step(monkeypatch):
    """Temperature and top-p values are inputs of the step, not parts of its key: only the
    sampling mode (greedy; temperature; with a nucleus; each top-k's k, a shape) makes a
    configuration."""
    model = small_model("SX", seed=6)
    calls = []
    _no_compile(monkeypatch, calls)
    ids = torch.tensor([[1, 2, 3]])
    for t in (0.5, 0.7, 1.3):
        generate(model, ids, 4, temperature=t, seed=0, compile=True)
    assert len(calls) == 1
    for t, p in ((0.9, 0.3), (0.5, 0.9), (1.2, 0.6)):
        generate(model, ids, 4, temperature=t, top_p=p, seed=0, compile=True)
    assert len(calls) == 2
    for t, p in ((0.9, 0.3), (0.5, 0.95)):
        generate(model, ids, 4, temperature=t, top_k=5, top_p=p, seed=0, compile=True)
    generate(model, ids, 4, temperature=0.9, top_k=7, seed=0, compile=True)  # another k
    generate(model, ids, 4, compile=True)  # greedy
    assert len(calls) == 5


def test_traced_sampling_with_new_values_matches_eager(sx_traced, aot_eager):
    """One traced step (mode: top-k 20 + top-p) given other temperatures and nuclei draws what
    the eager step draws with those values (seeded)."""
    ids = torch.randint(0, VOCAB, (4, 9), generator=torch.Generator().manual_seed(3))
    for t, p in [(0.8, 0.9), (1.7, 0.5), (0.3, 0.99)]:
        kw = dict(temperature=t, top_k=20, top_p=p, seed=11)
        comp = generate(sx_traced, ids, 24, compile=True, **kw)
        assert torch.equal(comp, generate(sx_traced, ids, 24, compile=False, **kw)), (t, p)
    keys = Decoder.step_cache.keys(sx_traced)
    assert sum(1 for key in keys if key.mode == (20, True)) == 1


def test_a_failed_compile_disables_only_its_configuration(monkeypatch, caplog):
    model = small_model("SX", seed=6)
    calls = []
    cache = _no_compile(
        monkeypatch, calls, fail=lambda b: RuntimeError("inductor") if b == 2 else None
    )
    one, two = torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2, 3], [4, 5, 6]])
    with caplog.at_level(logging.WARNING, logger="swax"):
        generate(model, two, 4, compile=True)
        generate(model, two, 4, compile=True)  # no second attempt for batch 2
        generate(model, one, 4, compile=True)  # batch 1 still compiles
    assert calls == [2, 1]
    warned = [r.message for r in caplog.records if "failed" in r.message]
    assert len(warned) == 1 and "for batch 2" in warned[0]
    assert [key.batch for key in cache.keys(model)] == [1]


def test_out_of_memory_is_reported_and_tried_again(monkeypatch, caplog):
    model = small_model("SX", seed=6)
    calls = []
    first = []

    def fail(batch):
        first.append(batch)
        return torch.OutOfMemoryError("CUDA out of memory") if len(first) == 1 else None

    cache = _no_compile(monkeypatch, calls, fail=fail)
    with caplog.at_level(logging.WARNING, logger="swax"):
        generate(model, torch.tensor([[1, 2, 3]]), 4, compile=True)
        generate(model, torch.tensor([[1, 2, 3]]), 4, compile=True)
    assert calls == [1, 1]  # not marked failed: tried again, and kept
    assert any("out of memory compiling the decode step" in r.message for r in caplog.records)
    assert len(cache.keys(model)) == 1


def test_the_step_cache_is_held_by_the_decoder_not_the_model(monkeypatch):
    """The compiled steps live in one StepCache, Decoder.step_cache or one given to
    Decoder.start, never in the model (its __dict__ is as it was)."""
    model = small_model("SX", seed=6)
    before = dict(model.__dict__)
    cache = _no_compile(monkeypatch)
    generate(model, torch.tensor([[1, 2, 3]]), 4, compile=True)
    assert model.__dict__.keys() == before.keys()
    assert [key.batch for key in cache.keys(model)] == [1]
    own = StepCache(failures=FailureRecord())
    with torch.no_grad():
        _, state = model(torch.tensor([[1, 2, 3], [4, 5, 6]]), return_state=True)
    first = torch.tensor([7, 8])
    Decoder.start(model, [(state, range(2))], first, Sampling(), True, 4, step_cache=own)
    assert [key.batch for key in own.keys(model)] == [2]
    assert [key.batch for key in cache.keys(model)] == [1]  # the default cache untouched


def test_the_step_cache_keeps_no_model_alive(aot_eager):
    """A model its user dropped goes, its traced step with it: the cache holds models weakly
    and no runner (nor dynamo's graph of the step's code object) holds one."""
    cache = StepCache(failures=FailureRecord())
    model = small_model("SX", seed=6)
    first, nxt = torch.tensor([4]), torch.tensor([5])
    with torch.no_grad():  # as generate runs it
        _, state = model(torch.tensor([[1, 2, 3]]), return_state=True)
        d = Decoder.start(model, [(state, range(1))], first, Sampling(), True, 4, step_cache=cache)
        eager = Decoder.start(model, [(state, range(1))], first, Sampling(), False, 4)
        assert isinstance(d.runner, swax_decode.StepRunner)  # traced, not the eager step
        assert torch.equal(d.advance(nxt), eager.advance(nxt))
    assert len(cache.keys(model)) == 1
    gone = weakref.ref(model)
    del model, state, d, eager
    gc.collect()
    assert gone() is None


def test_one_failure_record_for_kernels_and_decode_steps(monkeypatch):
    """The decode steps note failed compiles in the op registry's record (one per process),
    under the configuration: another model of the same configuration does not try again."""
    from swax.ops import registry

    assert Decoder.step_cache.failures is registry.FAILURES
    calls = []
    cache = _no_compile(monkeypatch, calls, fail=lambda b: RuntimeError("no C compiler"))
    ids = torch.tensor([[1, 2, 3]])
    generate(small_model("SX", seed=6), ids, 4, compile=True)
    model = small_model("SX", seed=7)
    generate(model, ids, 4, compile=True)
    assert calls == [1]
    with torch.no_grad():
        _, state = model(ids, return_state=True)
    static = swax_decode.StaticState.from_parts(model, [(state, range(1))], 256)
    key = step_key(model, static, None)
    assert "no C compiler" in cache.failures.why(key.configuration())
    assert key.configuration()[:2] == ("decode step", "cpu")


def test_new_weight_tensors_make_a_new_key_on_cuda_only(monkeypatch):
    """A CUDA graph reads fixed addresses: a model given new tensors (assign=True, a move, a
    cast) must not find the old graph. The key is tested on the CPU; the replay on a GPU is in
    the gpu tier."""
    model = small_model("SX", seed=6)
    before_cpu = swax_decode.weights_key(model, "cpu")
    before_cuda = swax_decode.weights_key(model, "cuda")
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(fresh, assign=True)
    assert swax_decode.weights_key(model, "cpu") == before_cpu  # inductor reads them at call
    assert swax_decode.weights_key(model, "cuda") != before_cuda
    kept = swax_decode.weights_key(model, "cuda")
    model.load_state_dict({k: v.clone() for k, v in fresh.items()})  # in place: same storage
    assert swax_decode.weights_key(model, "cuda") == kept


def test_new_buffers_make_a_new_key_on_cuda_too():
    """Weights held as buffers (swax.quant's int8 matrices and scales) are part of the key."""
    model = small_model("SX", seed=6)
    model.register_buffer("extra", torch.zeros(3))
    before = swax_decode.weights_key(model, "cuda")
    model.extra = torch.zeros(3)  # a new tensor in the buffer's place
    assert swax_decode.weights_key(model, "cuda") != before


class _HostToDevice(TorchDispatchMode):
    """Records every op that reads a CPU tensor and writes a tensor on another device."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = torch.utils._pytree.tree_leaves
        ins = [t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.device.type == "cpu" for t in ins) and any(t.device.type != "cpu" for t in outs):
            self.ops.append(str(func))
        return out


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA", "XS"])
@pytest.mark.parametrize("sampling", [None, (0.8, 5, 0.9)])
def test_the_step_copies_nothing_from_the_host(pattern, sampling):
    """A CUDA graph cannot capture a copy from pageable host memory: the eager step (what
    CudaGraphRunner captures when inductor fails) must build everything on the device. Shown
    on the meta device, which stands for any non-CPU one here."""
    model = small_model(pattern)
    _, state = model(torch.randint(0, VOCAB, (2, 5)), return_state=True)
    static = swax_decode.StaticState.from_parts(model, [(state, range(2))], 256)
    meta = model.to("meta")
    layers = [tuple(t.to("meta") for t in bufs) for bufs in static.layers]
    s = swax_decode.Sampling(*(sampling or (0.0, None, None)))
    values, tok = s.values("meta"), torch.zeros(2, dtype=torch.long, device="meta")
    pos = static.pos.to("meta")
    with torch.no_grad(), _HostToDevice() as spy:
        swax_decode.decode_step(meta, layers, tok, pos, s.mode, values)
    assert spy.ops == []


def test_an_eager_batch_decodes_no_padding_rows(monkeypatch):
    """Padding rows only spare compiles: a batch that decodes eagerly (compile=None below the
    token threshold, or compile=False) steps its real rows only."""
    model = small_model("SX", seed=6)
    rows = []
    step = decode_steps.decode_step

    def counting(model, layers, tok, *rest):
        rows.append(tok.shape[0])
        return step(model, layers, tok, *rest)

    monkeypatch.setattr(decode_steps, "decode_step", counting)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    alone = [generate_batch(model, [p], 6, compile=False)[0] for p in prompts]
    rows.clear()
    assert generate_batch(model, prompts, 6) == alone  # compile=None: 18 tokens, eager
    assert set(rows) == {3}  # not 4 (the next power of two a compiled batch is padded to)
    rows.clear()
    got = generate_batch(model, prompts * 6, 6, batch_size=16, compile=False)
    assert got == alone * 6 and sorted(set(rows)) == [2, 16]  # 18 prompts: 16, then 2

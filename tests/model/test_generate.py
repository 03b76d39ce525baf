"""Generation: chunked prefill, decode, sampling, stopping."""

import math

import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.generate import generate, generate_batch, prefill, truncate_at_stop
from swax.sampling import sample_next
from tests.helpers import NOISE_FACTOR, assert_within_noise, model_noise_floor


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = SwaxConfig(
        vocab_size=61,
        d_model=32,
        n_layers=4,
        n_heads=4,
        window=8,
        chunk_size=16,
        layer_pattern="SX",
    )
    return SwaxLM(cfg).eval()


def naive_greedy(model, ids, n, window):
    """Reference: recompute the full forward over the growing sequence at every step."""
    seq = ids
    for _ in range(n):
        with torch.no_grad():
            nxt = model(seq, window=window)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    return seq


@pytest.mark.parametrize("prefill_chunk", [1, 5, 2048])
def test_greedy_equals_naive_recomputation(model, prefill_chunk):
    ids = torch.randint(0, 61, (2, 23))
    out = generate(model, ids, max_new_tokens=15, window=8, prefill_chunk_size=prefill_chunk)
    assert torch.equal(out, naive_greedy(model, ids, 15, 8))


def test_prefill_returns_last_logits_only(model):
    ids = torch.randint(0, 61, (1, 40))
    logits, state = prefill(model, ids, window=8, chunk_size=7)
    with torch.no_grad():
        full = model(ids, window=8)[:, -1]
    assert logits.shape == (1, 61)
    floor, _ = model_noise_floor(model, lambda m: m(ids, window=8)[:, -1])
    assert_within_noise([logits], [floor], [full], ["prefill vs full"], 2 * NOISE_FACTOR)
    assert state.pos == 40


def test_generation_checks_the_prompt_ids_once(model, monkeypatch):
    """Prefill checks the whole prompt once (not per chunk) and the eager decode steps feed
    back the model's own samples unchecked; a bad prompt id is still named."""
    calls = []
    check = SwaxLM.check_token_ids
    monkeypatch.setattr(
        SwaxLM, "check_token_ids", lambda self, ids: (calls.append(ids.shape), check(self, ids))
    )
    ids = torch.randint(0, 61, (2, 23))
    out = generate(model, ids, 6, window=8, prefill_chunk_size=5, compile=False)
    assert calls == [(2, 23)] and out.shape == (2, 29)
    with pytest.raises(ValueError, match="token id 61 is out of range for vocab_size 61"):
        generate(model, torch.tensor([[1, 2, 61, 3]]), 2, prefill_chunk_size=2)


def test_sampling_is_seeded(model):
    ids = torch.randint(0, 61, (2, 10))
    a = generate(model, ids, 20, temperature=1.0, seed=7)
    b = generate(model, ids, 20, temperature=1.0, seed=7)
    c = generate(model, ids, 20, temperature=1.0, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_top_k_one_and_tiny_top_p_are_greedy(model):
    ids = torch.randint(0, 61, (2, 10))
    greedy = generate(model, ids, 12)
    assert torch.equal(generate(model, ids, 12, temperature=1.5, top_k=1, seed=1), greedy)
    assert torch.equal(generate(model, ids, 12, temperature=1.5, top_p=1e-6, seed=1), greedy)


def test_sample_next_respects_top_k_and_top_p():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]]).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    k2 = sample_next(logits, 1.0, top_k=2, generator=g)
    assert set(k2.tolist()) == {3, 4}
    # probabilities of 4, 3, 2 ... are 0.636, 0.234, 0.086: top_p=0.8 keeps {4, 3}
    p = sample_next(logits, 1.0, top_p=0.8, generator=g)
    assert set(p.tolist()) == {3, 4}
    freq4 = (p == 4).float().mean().item()
    expected = 0.636 / (0.636 + 0.234)
    assert abs(freq4 - expected) < 0.03


def test_stop_sequences_and_eos(model):
    ids = torch.randint(0, 61, (1, 10))
    free = generate(model, ids, 12)[0, 10:].tolist()
    stop = free[3:5]
    out = generate(model, ids, 12, stop_sequences=[stop])[0, 10:].tolist()
    # stops right after the first occurrence of the stop sequence
    first = next(i for i in range(len(free) - 1) if free[i : i + 2] == stop)
    assert out == free[: first + 2]
    out = generate(model, ids, 12, eos_token_id=free[2])[0, 10:].tolist()
    assert out == free[: free.index(free[2]) + 1]


def test_stop_strings_with_decode(model):
    ids = torch.randint(0, 61, (1, 10))
    decode = lambda t: "".join(chr(97 + i % 26) for i in t)  # noqa: E731
    free = generate(model, ids, 12)[0, 10:].tolist()
    text = decode(free)
    stop = text[4:6]
    out = generate(model, ids, 12, stop_strings=[stop], detokenize=decode)[0, 10:].tolist()
    assert stop in decode(out) and len(out) <= len(free)
    assert truncate_at_stop(decode(out), [stop]) == text[: text.find(stop)]
    with pytest.raises(ValueError, match="need a detokenize function"):
        generate(model, ids, 3, stop_strings=["x"])


def test_the_former_decode_keyword_still_works_with_a_warning(model):
    """decode= (renamed detokenize=: swax.decode is the decode step) is kept one release: the
    same ids, one DeprecationWarning pointing at the caller."""
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(3))
    text = lambda t: "".join(chr(97 + i % 26) for i in t)  # noqa: E731
    stop = text(generate(model, ids, 12)[0, 10:].tolist())[4:6]
    want = generate(model, ids, 12, stop_strings=[stop], detokenize=text)
    prompts = [ids[0].tolist(), ids[1, :4].tolist()]
    batch = generate_batch(model, prompts, 12, stop_strings=[stop], detokenize=text)
    with pytest.warns(DeprecationWarning, match="now detokenize=") as caught:
        got = generate(model, ids, 12, stop_strings=[stop], decode=text)
        got_batch = generate_batch(model, prompts, 12, stop_strings=[stop], decode=text)
        via_model = model.generate(ids, 12, stop_strings=[stop], decode=text)
    assert torch.equal(got, want) and torch.equal(via_model, want) and got_batch == batch
    assert [w.filename for w in caught][:2] == [__file__] * 2
    with pytest.raises(ValueError, match="detokenize= only"):
        generate(model, ids, 3, stop_strings=["x"], detokenize=text, decode=str)


def test_empty_stop_strings_and_sequences_are_ignored(model):
    ids = torch.randint(0, 61, (1, 10))
    free = generate(model, ids, 8)
    decode = lambda t: "".join(chr(97 + i % 26) for i in t)  # noqa: E731
    assert torch.equal(generate(model, ids, 8, stop_strings=[""], detokenize=decode), free)
    assert torch.equal(generate(model, ids, 8, stop_sequences=[[]]), free)


def test_batch_rows_stop_independently(model):
    ids = torch.randint(0, 61, (2, 10))
    free = generate(model, ids, 10)
    eos = int(free[0, 12])
    out = generate(model, ids, 10, eos_token_id=eos, pad_token_id=0)
    row0 = out[0, 10:].tolist()
    cut = row0.index(eos)
    assert all(t == 0 for t in row0[cut + 1 :])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(prefill_chunk_size=0), "chunk size"),
    ],
)
def test_generate_errors(model, kw, match):
    ids = torch.randint(0, 61, (1, 5))
    kw = {"max_new_tokens": 3, **kw}
    with pytest.raises(ValueError, match=match):
        generate(model, ids, **kw)


def test_continue_from_returned_state(model):
    ids = torch.randint(0, 61, (1, 12))
    full = generate(model, ids, 10)
    first, state = generate(model, ids, 5, return_state=True)
    assert state.pos == 12 + 5 - 1  # as documented: the last generated id is not consumed
    # the state has consumed the prompt and the first 4 generated tokens: feed the 5th
    rest = generate(model, first[:, -1:], 5, state=state)
    assert torch.equal(torch.cat([first, rest[:, 1:]], 1), full)


@pytest.mark.parametrize(
    "t, k, p", [(0.7, 5, None), (1.3, None, 0.8), (0.9, 6, 0.7), (1.0, 80, 0.5)]
)
def test_sampling_probs_equal_a_hand_written_reference(t, k, p):
    """The distribution the step draws from, against the rules written out in float64 python:
    softmax(logits / t); keep the k largest; of those, keep a token while the mass before it
    (in descending order) is below p; renormalise."""
    from swax.sampling import sampling_probs

    logits = torch.randn(3, 61, generator=torch.Generator().manual_seed(2)) * 3
    got = sampling_probs(logits, t, k, p)
    for row, probs in zip(logits.double().tolist(), got.tolist()):
        order = sorted(range(61), key=lambda i: -row[i])[: k or 61]
        z = [row[i] / t for i in order]
        m = max(z)
        e = [math.exp(v - m) for v in z]
        s = sum(e)
        kept, before = [], 0.0
        for i, v in zip(order, e):
            if p is not None and before >= p:
                break
            kept.append((i, v))
            before += v / s
        total = sum(v for _, v in kept)
        want = [0.0] * 61
        for i, v in kept:
            want[i] = v / total
        # float32: the division, exp, sum and renormalisation round each probability (<= 1) by
        # a few units of 2^-24; 16 x 2^-23 leaves room for them
        assert max(abs(a - b) for a, b in zip(probs, want)) <= 16 * 2**-23

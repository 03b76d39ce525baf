"""'Inside window W' has one meaning: the position that predicts an answer attends to its value
under the attention op's own mask. The generator's near/far split is checked against that mask,
computed here by running ``sliding_window_attention`` itself (uniform scores, one-hot values:
a key is visible from a query exactly when its column of the output is non-zero), never from
the generator's distance formula."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from swax.core.errors import SwaxError
from swax.data import SyntheticConfig
from swax.data.episode import draw_distance
from swax.data.mqar import make_mqar_episode
from swax.data.synthetic import make_episode
from swax.data.tokenizer import ByteTokenizer
from swax.ops import sliding_window_attention

WINDOWS = (8, 16, 32, 64, 128)
LENGTHS = (64, 256, 1024)


@functools.cache
def visible(length: int, window: int) -> np.ndarray:
    """(T, T) bool: query t sees key s under the op's sliding-window mask."""
    z = torch.zeros(1, 1, length, 4)
    eye = torch.eye(length)[None, None]
    out = sliding_window_attention(z, z, eye, window=window)[0, 0]
    return (out > 0).numpy()


def mqar_answers(ep) -> list[tuple[int, int]]:
    """(reader, value position) of every answer, read off the tokens: the query key's pair in
    the block, its value right after it; the reader is the query key itself."""
    lo, hi = ep.needle_span
    out = []
    for q0, _ in ep.question_spans:
        key = ep.tokens[q0]
        k = next(p for p in range(lo, hi, 2) if ep.tokens[p] == key)
        out.append((q0, k + 1))
    return out


def needle_answers(ep, tok) -> list[tuple[int, int]]:
    """(reader, first value token) of the first answer of a needle episode: the value's bytes
    found in the queried needle's span."""
    (a0, a1), (n0, n1) = ep.answer_spans[0], ep.needle_span
    value = ep.tokens[a0:a1]
    span = ep.tokens[n0:n1]
    at = next(i for i in range(len(span) - len(value), -1, -1) if span[i : i + len(value)] == value)
    return [(a0 - 1, n0 + at)]


def _share_beyond(eps, answers, length, window) -> tuple[int, int, int]:
    """(episodes with every answer beyond W, with every answer inside, mixed)."""
    mask = visible(length, window)
    far = near = mixed = 0
    for ep in eps:
        seen = [bool(mask[r, v]) for r, v in answers(ep)]
        # the generator's own record agrees with the op's mask
        assert [rc <= window for rc in ep.reaches[: len(seen)]] == seen
        far += not any(seen)
        near += all(seen)
        mixed += any(seen) and not all(seen)
    return far, near, mixed


def _check_share(far, near, mixed, n, share):
    assert mixed == 0, "an episode is neither near nor far"
    if share == 0:
        assert far == 0
    else:  # binomial(n, share): 5 standard deviations
        sd = (n * share * (1 - share)) ** 0.5
        assert abs(far - n * share) <= 5 * sd, (far, n * share)


# W < T (no far distance otherwise); 4 pairs and 2 queries span 10 tokens, more than W = 8
CASES = [(w, t, p) for w in WINDOWS for t in LENGTHS for p in (1, 4) if w < t and (p == 1 or w > 8)]


@pytest.mark.parametrize(("window", "length", "pairs"), CASES)
def test_mqar_far_share_is_the_share_beyond_the_window(window, length, pairs):
    n = 1500
    for share in (0.0, 0.1, 0.5):
        cfg = SyntheticConfig(
            task="mqar",
            mqar_first_id=128,
            num_needles=pairs,
            num_queries=min(pairs, 2),
            min_distance=1,
            far_share=share,
            far_from=window,
        )
        rng = np.random.default_rng([window, length, pairs, int(share * 100)])
        eps = [make_mqar_episode(rng, length, cfg) for _ in range(n)]
        _check_share(*_share_beyond(eps, mqar_answers, length, window), n, share)


@pytest.mark.parametrize("window", (64, 128))
@pytest.mark.parametrize("length", (256, 1024))
def test_needle_far_share_is_the_share_beyond_the_window(window, length):
    tok = ByteTokenizer()
    hay = np.frombuffer(b"and the earth was without form, and void. " * 40, np.uint8)
    n = 1000
    for share in (0.0, 0.3):
        cfg = SyntheticConfig(compact=True, min_distance=1, far_share=share, far_from=window)
        rng = np.random.default_rng([window, length, int(share * 100)])
        eps = [make_episode(rng, tok, hay.astype(np.int64), length, cfg) for _ in range(n)]
        answers = functools.partial(needle_answers, tok=tok)
        _check_share(*_share_beyond(eps, answers, length, window), n, share)


def test_a_window_no_episode_fits_inside_is_an_error():
    # one pair: the value is at least distance + 2 back; min_distance 8 needs W >= 10
    cfg = SyntheticConfig(task="mqar", mqar_first_id=128, min_distance=8, far_share=0.0, far_from=9)
    with pytest.raises(SwaxError, match="far_from=9"):
        make_mqar_episode(np.random.default_rng(0), 64, cfg)
    ok = SyntheticConfig(task="mqar", mqar_first_id=128, min_distance=8, far_share=0.0, far_from=10)
    assert make_mqar_episode(np.random.default_rng(0), 64, ok).reaches == [10]


def test_reach_range_places_the_first_answer_in_it():
    cfg = SyntheticConfig(task="mqar", mqar_first_id=128, min_distance=0)
    rng = np.random.default_rng(3)
    mask_in, mask_out = visible(256, 33), visible(256, 32)
    for _ in range(300):
        ep = make_mqar_episode(rng, 256, cfg, reach_range=(33, 64))
        ((r, v),) = mqar_answers(ep)
        assert visible(256, 64)[r, v] and not mask_out[r, v]  # 32 < reach <= 64
        assert mask_in[r, v] == (ep.reaches[0] <= 33)


def test_power_law_is_heavy_tailed():
    cfg = SyntheticConfig(task="mqar", mqar_first_id=128, min_distance=8, distance_law="power")
    rng = np.random.default_rng(0)
    d = np.array([draw_distance(rng, cfg, 1007) for _ in range(4000)])
    # P(d) ∝ (d - 7)^-1 over [8, 1007]: P(d < 16) = H(8) / H(1000) = 2.718 / 7.485 = 0.363
    assert abs((d < 16).mean() - 0.363) < 5 * (0.363 * 0.637 / 4000) ** 0.5
    assert d.min() >= 8 and d.max() <= 1007

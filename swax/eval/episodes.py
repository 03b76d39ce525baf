"""Retrieval accuracy on synthetic key–value episodes at any length (a compact NIAH).

The episodes are those of :mod:`swax.data.synthetic` — needles ("{key}:{value}." in the compact
format, RULER's sentence otherwise) scattered through natural text at random depths, then one or
more questions, each followed by its answer — drawn with **evaluation keys**, disjoint from the
keys seen in training. The structure is RULER's niah_multikey / niah_multiquery; the compact
format makes it learnable by models small enough to train on a CPU.

An answer counts as correct when every one of its tokens is the model's top prediction given the
true context. For a greedy decoder this is the same as generating the answer exactly (if the
first wrong token is the top prediction, greedy decoding goes astray there too), and it needs one
forward pass per episode, done in chunks with the state carried so memory stays bounded.

Alongside accuracy, the mean negative log-likelihood of the answer tokens (nats per token) is
reported: a continuous measure that shows partial use of the needle before answers become exact
(uniform guessing of a digit costs ln 10 = 2.30 nats).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch

from ..data.config import SyntheticConfig
from ..data.synthetic import make_episode

DEPTH_BINS = 10


@torch.no_grad()
def _top1(
    model, ids: torch.Tensor, window, positions: list[int], chunk: int
) -> dict[int, tuple[int, float]]:
    """The model's top prediction at the given positions of ``ids`` (1, T) and the
    log-probability there of the next true token, chunk by chunk."""
    want = sorted(set(positions))
    out, state, j = {}, None, 0
    for c in range(0, ids.shape[1], chunk):
        x = ids[:, c : c + chunk]
        hi = c + x.shape[1]
        mine = []
        while j < len(want) and want[j] < hi:
            mine.append(want[j])
            j += 1
        if not mine and hi < ids.shape[1]:
            _, state = model(x, window=window, state=state, return_state=True, logits_to_keep=1)
            continue
        logits, state = model(x, window=window, state=state, return_state=True)
        for p in mine:
            row = logits[0, p - c].float()
            lp = (
                float(torch.log_softmax(row, -1)[ids[0, p + 1]])
                if p + 1 < ids.shape[1]
                else float("nan")
            )
            out[p] = (int(row.argmax()), lp)
    return out


def episode_accuracy(
    model,
    tokenizer,
    haystack_tokens,
    lengths,
    samples: int,
    cfg: SyntheticConfig,
    window=None,
    seed: int = 1234,
    chunk: int = 2048,
    split: str = "eval",
    progress: bool = True,
) -> dict[int, dict]:
    """Accuracy (0–100) of exact answers for each length, with counts by needle depth and by
    distance between needle and question.

    Returns {length: {"acc", "n", "nll" (mean nats per answer token), "by_depth": {bin:
    [correct, total]}, "by_distance": {upper bound: [correct, total]}}}.
    """
    from tqdm import tqdm

    w = model.config.window if window is None else window
    device = model.embed.weight.device
    hay = np.asarray(haystack_tokens)
    results = {}
    bar = tqdm(
        total=len(lengths) * samples,
        desc="episodes",
        unit="episode",
        disable=not progress,
        dynamic_ncols=True,
    )
    for length in lengths:
        correct = total = 0
        nll_sum, nll_n = 0.0, 0
        by_depth: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        by_dist: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for s in range(samples):
            rng = np.random.default_rng([seed, length, s])
            ep = make_episode(rng, tokenizer, hay, length, cfg, split=split)
            ids = torch.tensor([ep["tokens"]], device=device)
            positions = [p - 1 for a0, a1 in ep["answer_spans"] for p in range(a0, a1)]
            top = _top1(model, ids, w, positions, chunk)
            context = ep["question_spans"][0][0]
            for j, (a0, a1) in enumerate(ep["answer_spans"]):
                ok = all(top[p - 1][0] == ep["tokens"][p] for p in range(a0, a1))
                nll_sum -= sum(top[p - 1][1] for p in range(a0, a1))
                nll_n += a1 - a0
                needle = ep["needle_positions"][j]
                depth = min(DEPTH_BINS - 1, int(DEPTH_BINS * needle / max(context, 1)))
                dist = ep["question_spans"][j][0] - needle
                bucket = 2 ** max(0, math.ceil(math.log2(max(dist, 1))))
                for table, key in ((by_depth, depth), (by_dist, bucket)):
                    table[key][0] += ok
                    table[key][1] += 1
                correct += ok
                total += 1
            bar.update(1)
        results[length] = {
            "acc": 100.0 * correct / max(total, 1),
            "n": total,
            "nll": nll_sum / max(nll_n, 1),
            "by_depth": dict(by_depth),
            "by_distance": dict(sorted(by_dist.items())),
        }
    bar.close()
    return results

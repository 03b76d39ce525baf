"""Retrieval accuracy on synthetic key–value episodes at any length (a compact NIAH).

The episodes are those of :mod:`swax.data.synthetic` — needles ("{key}:{value}." in the compact
format, RULER's sentence otherwise) scattered through natural text at random depths, then one or
more questions, each followed by its answer — drawn with **evaluation keys**, disjoint from the
keys seen in training; or the MQAR episodes of :mod:`swax.data.mqar` (key–value pairs of
dedicated token ids queried again after a stretch of filler) when ``cfg.task == "mqar"``.

An answer counts as correct when every one of its tokens is the model's top prediction given the
true context. For a greedy decoder this is the same as generating the answer exactly (if the
first wrong token is the top prediction, greedy decoding goes astray there too), and it needs one
forward pass per episode, done in chunks with the state carried so memory stays bounded.
Episodes of one length are evaluated ``batch_size`` at a time.

Alongside accuracy, the mean negative log-likelihood of the answer tokens (nats per token) is
reported: a continuous measure that shows partial use of the needle before answers become exact
(uniform guessing of a digit costs ln 10 = 2.30 nats).

**Which memory carries the answer** (:func:`episode_accuracy` ``reset_recurrent=True``): the
recurrent layers' state (mLSTM, Gated DeltaNet) is reset to empty right before the first
question, so only attention can still bring the needle to the question; combined with a window
shorter than the needle–question distance, neither can. (A reset right after the needle would
not do: for W more tokens the attention layers still see the needle and hand it to the
recurrent layers above them.)
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np
import torch

from swax.config import LAYER_KINDS
from swax.core.progress import progress_bar
from swax.data.config import SyntheticConfig
from swax.data.mqar import resolve_mqar_ids
from swax.data.synthetic import make_episode

DEPTH_BINS = 10


def reset_recurrent_state(model, state):
    """``state`` with the recurrent layers' memory emptied (a fresh start for them: the layers
    whose kind is ``recurrent`` in :data:`swax.config.LAYER_KINDS`, mLSTM and Gated DeltaNet);
    attention layers keep their keys and values. A new state object: the argument is not
    modified."""
    kinds = model.config.layer_types
    layers = tuple(None if LAYER_KINDS[k].recurrent else s for k, s in zip(kinds, state.layers))
    return dataclasses.replace(state, layers=layers)


@torch.no_grad()
def _top1(
    model,
    ids: torch.Tensor,
    window,
    positions: list[int],
    chunk: int,
    reset_at: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's top prediction at ``positions`` of every row of ``ids`` (B, T), and the
    log-probability there of the next true token, chunk by chunk with the state carried.
    ``reset_at`` (per row, equal for all rows): the recurrent layers' state is emptied after
    that many tokens. Returns (top1, logp), each (B, len(positions))."""
    T = ids.shape[1]
    want = sorted(set(positions))
    cuts = sorted({*range(0, T, chunk), *(reset_at or [])} - {T})
    bounds = [*cuts, T]
    found: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    state = None
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if state is not None and reset_at and lo in reset_at:
            state = reset_recurrent_state(model, state)
        x = ids[:, lo:hi]
        mine = [p for p in want if lo <= p < hi]
        if not mine and hi < T:  # nothing to read here: skip the T×vocab logits
            _, state = model(x, window=window, state=state, return_state=True, logits_to_keep=1)
            continue
        logits, state = model(x, window=window, state=state, return_state=True)
        for p in mine:
            row = logits[:, p - lo].float()
            nxt = ids[:, p + 1] if p + 1 < T else None
            lp = (
                torch.log_softmax(row, -1).gather(1, nxt[:, None])[:, 0]
                if nxt is not None
                else torch.full((ids.shape[0],), float("nan"))
            )
            found[p] = (row.argmax(-1), lp)
    top = torch.stack([found[p][0] for p in positions], 1)
    logp = torch.stack([found[p][1] for p in positions], 1)
    return top, logp


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
    batch_size: int = 16,
    reset_recurrent: bool = False,
    reach_range: tuple[int, int] | None = None,
    keep_answers: bool = False,
) -> dict[int, dict]:
    """Accuracy (0–100) of exact answers for each length, with counts by needle depth and by
    distance between needle and question.

    ``window``: the attention window of the S layers (None = full attention, as everywhere in
    swax). ``reset_recurrent``: empty the recurrent layers' state right before the first
    question, so that only attention can carry the needle to it (see the module docstring).
    Episode ``s`` of length ``n`` is drawn with ``np.random.default_rng([seed, n, s])``, so every
    model sees the same episodes. ``reach_range`` (lo, hi): the nearest answer of every episode
    needs a window in [lo, hi] to be seen by attention (see
    :func:`swax.data.episode.draw_distance`). ``keep_answers``: the result also lists every
    answer as ``[reach, correct, nll]`` under ``"answers"`` (the distance buckets read it).

    Returns {length: {"acc", "n", "nll" (mean nats per answer token), "by_depth": {bin:
    [correct, total]}, "by_distance": {upper bound: [correct, total]}}}.
    """
    device = model.embed.weight.device
    # MQAR ids after the tokenizer's vocabulary unless the model has no room there
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is not None:
        cfg = resolve_mqar_ids(cfg, vocab, getattr(model.config, "vocab_size", None))
    hay = np.asarray(haystack_tokens)
    results = {}
    bar = progress_bar(len(lengths) * samples, "episodes", "episode", enabled=progress)
    for length in lengths:
        eps = [
            make_episode(
                np.random.default_rng([seed, length, s]),
                tokenizer,
                hay,
                length,
                cfg,
                split=split,
                reach_range=reach_range,
            )
            for s in range(samples)
        ]
        tally = _Tally()
        for b in range(0, samples, batch_size):
            group = eps[b : b + batch_size]
            tally.add_group(model, group, window, chunk, device, reset_recurrent)
            bar.update(len(group))
        results[length] = tally.result()
        if not keep_answers:
            del results[length]["answers"]
    bar.close()
    return results


class _Tally:
    """Correct answers, answer log-likelihood and the depth/distance tables of one length."""

    def __init__(self):
        self.correct = self.total = 0
        self.nll_sum, self.nll_n = 0.0, 0
        self.by_depth: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        self.by_dist: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        self.answers: list[list] = []  # [reach, correct, nll] per answer

    def add_group(self, model, group: list[dict], window, chunk, device, reset: bool) -> None:
        # episodes of one length share their answer positions only for MQAR; read the union
        positions = sorted(
            {p - 1 for ep in group for a0, a1 in ep.answer_spans for p in range(a0, a1)}
        )
        col = {p: j for j, p in enumerate(positions)}
        ids = torch.tensor([ep.tokens for ep in group], device=device)
        reset_at = None
        if reset:
            ends = {ep.question_spans[0][0] for ep in group}
            if len(ends) > 1:  # different cut points: one row at a time
                for ep in group:
                    self.add_group(model, [ep], window, chunk, device, reset)
                return
            reset_at = sorted(ends)
        top, logp = _top1(model, ids, window, positions, chunk, reset_at)
        for r, ep in enumerate(group):
            context = ep.question_spans[0][0]
            for j, (a0, a1) in enumerate(ep.answer_spans):
                cols = [col[p - 1] for p in range(a0, a1)]
                ok = all(int(top[r, c]) == ep.tokens[p] for c, p in zip(cols, range(a0, a1)))
                nll = -float(logp[r, cols].sum())
                self.nll_sum += nll
                self.nll_n += a1 - a0
                self.answers.append([ep.reaches[j], bool(ok), nll / (a1 - a0)])
                needle = ep.needle_positions[j]
                depth = min(DEPTH_BINS - 1, int(DEPTH_BINS * needle / max(context, 1)))
                dist = ep.question_spans[j][0] - needle
                bucket = 2 ** max(0, math.ceil(math.log2(max(dist, 1))))
                for table, key in ((self.by_depth, depth), (self.by_dist, bucket)):
                    table[key][0] += ok
                    table[key][1] += 1
                self.correct += ok
                self.total += 1

    def result(self) -> dict:
        return {
            "acc": 100.0 * self.correct / max(self.total, 1),
            "n": self.total,
            "nll": self.nll_sum / max(self.nll_n, 1),
            "by_depth": dict(self.by_depth),
            "by_distance": dict(sorted(self.by_dist.items())),
            "answers": self.answers,
        }

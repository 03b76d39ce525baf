"""Multi-query associative recall (MQAR) episodes: the retrieval task small models learn.

Zoology (Arora et al., 2023) and the xLSTM paper train recall on sequences of key-value pairs
whose keys are queried again later. An episode of exactly ``length`` tokens::

    [filler ...][k1 v1 k2 v2 ... kN vN][filler ... (distance) ...][kσ1 vσ1 kσ2 vσ2 ... kσQ vσQ]

- keys, values and filler tokens come from three dedicated, disjoint ranges of token ids
  (``SyntheticConfig.mqar_first_id`` onwards: ``mqar_keys`` keys, then ``mqar_values`` values,
  then ``mqar_noise`` filler tokens), so every token's role is unambiguous (with
  ``mqar_distractors`` a share of the filler is value tokens, so that the answer is not the only
  value in the context and must be looked up by its key); with
  ``mqar_noise = 0`` the filler is a slice of the corpus text instead); by default the three
  ranges start right after the tokenizer's vocabulary, so no text can emit an episode id
  (:func:`resolve_mqar_ids`; the model's vocabulary grows to hold them), and ids set inside the
  vocabulary are checked against the training text (:func:`check_text_ids`);
- N = ``num_needles`` distinct keys, each with a value drawn uniformly (values may repeat);
- Q = ``num_queries`` of the keys (a random order) are asked at the end: the query key, then its
  value, which is the answer (with ``answers_only`` only the answers are training targets);
- the distance between the end of the pair block and the first query is drawn uniformly in
  [min_distance, max_distance] like the needle episodes' (or as a near/far mixture with
  ``far_share``, see :func:`~swax.data.episode.draw_distance`), so lengths beyond the training
  length put the pairs beyond any fixed window.

The result is an :class:`~swax.data.episode.Episode` like the needle episodes', so the loader
and :func:`swax.probes.episodes.episode_accuracy` treat both tasks alike. There is no train/eval key
split (the keys are a handful of symbols); evaluation episodes differ by their seed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from swax.core.errors import SwaxError
from swax.data.config import SyntheticConfig
from swax.data.episode import Episode, draw_distance

LEGACY_FIRST_ID = 128
"""The key range's first id before episode ids moved past the tokenizer's vocabulary: an
evaluation of a model whose vocabulary has no room after the tokenizer's ids (it was never
trained on episodes) reads episodes there, as it did then."""


def mqar_span(cfg: SyntheticConfig) -> int:
    """How many ids the keys, the values and the filler take together."""
    return cfg.mqar_keys + cfg.mqar_values + cfg.mqar_noise


def resolve_mqar_ids(
    cfg: SyntheticConfig, tokenizer_vocab: int, model_vocab: int | None = None
) -> SyntheticConfig:
    """``cfg`` with ``mqar_first_id`` set: unset means the first id after the tokenizer's
    vocabulary (``tokenizer_vocab``), where no text can emit an episode id. ``model_vocab``:
    a model that is to read the episodes; when its vocabulary has no room after the
    tokenizer's ids (a model trained without episodes), the ids are the legacy ones
    (:data:`LEGACY_FIRST_ID`). A config that sets the id, or is not MQAR, is returned as is."""
    if cfg.task != "mqar" or cfg.mqar_first_id is not None:
        return cfg
    first = int(tokenizer_vocab)
    if model_vocab is not None and model_vocab < first + mqar_span(cfg):
        first = LEGACY_FIRST_ID
    return dataclasses.replace(cfg, mqar_first_id=first)


def mqar_ids(
    cfg: SyntheticConfig, tokenizer_vocab: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of the keys, the values and the filler (empty when the filler is text).
    An unset ``mqar_first_id`` needs ``tokenizer_vocab`` (see :func:`resolve_mqar_ids`)."""
    k0 = cfg.mqar_first_id
    if k0 is None:
        if tokenizer_vocab is None:
            raise SwaxError(
                "data.synthetic.mqar_first_id is unset (after the tokenizer's vocabulary): "
                "the MQAR ids need the tokenizer's vocabulary size"
            )
        k0 = int(tokenizer_vocab)
    v0 = k0 + cfg.mqar_keys
    n0 = v0 + cfg.mqar_values
    return np.arange(k0, v0), np.arange(v0, n0), np.arange(n0, n0 + cfg.mqar_noise)


def mqar_vocab_needed(cfg: SyntheticConfig, tokenizer_vocab: int) -> int:
    """The smallest vocabulary that holds the tokenizer's ids and the episode ids."""
    k0 = cfg.mqar_first_id if cfg.mqar_first_id is not None else tokenizer_vocab
    return max(int(tokenizer_vocab), k0 + mqar_span(cfg))


def mqar_overhead(cfg: SyntheticConfig) -> int:
    """Tokens of an MQAR episode besides its filler, plus min_distance."""
    return 2 * cfg.num_needles + 2 * cfg.num_queries + cfg.min_distance


SCAN_CHUNK = 1 << 24
"""Tokens read at a time by :func:`text_id_clashes` (a shard set is read shard by shard)."""


def text_id_clashes(cfg: SyntheticConfig, tokens, tokenizer_vocab: int) -> dict[int, tuple]:
    """{episode id: (count, first position)} for every key, value or filler id of the
    (resolved) ``cfg`` that also occurs in the token stream ``tokens`` (an array or a
    memory-mapped shard set). Ids at or above ``tokenizer_vocab`` are not looked for: no text
    encodes to them. The stream is read in chunks of :data:`SCAN_CHUNK` tokens."""
    ids = np.concatenate(mqar_ids(cfg))
    ids = ids[ids < tokenizer_vocab]
    if not len(ids):
        return {}
    top = int(ids.max()) + 1
    counts = np.zeros(top, np.int64)
    first: dict[int, int] = {}
    want = np.zeros(top, bool)
    want[ids] = True
    for at in range(0, len(tokens), SCAN_CHUNK):
        chunk = np.asarray(tokens[at : at + SCAN_CHUNK]).astype(np.int64, copy=False)
        low = chunk[chunk < top]
        counts += np.bincount(low, minlength=top)[:top]
        for i in np.flatnonzero(want & (counts > 0)):
            if int(i) not in first:
                first[int(i)] = at + int(np.flatnonzero(chunk == i)[0])
    return {int(i): (int(counts[i]), first[int(i)]) for i in ids if counts[i] > 0}


def check_text_ids(cfg: SyntheticConfig, tokens, tokenizer, where: str = "the training text"):
    """Raise one line naming every episode id of the resolved ``cfg`` that ``tokens`` (the
    text the model trains on) also holds: a model would learn it from the text as well, and a
    model without memory would answer by the text's bigrams."""
    keys, values, noise = (set(r.tolist()) for r in mqar_ids(cfg))
    k0 = cfg.mqar_first_id
    eot = getattr(tokenizer, "eot_id", None)
    if eot in keys | values | noise:
        raise SwaxError(
            f"data.synthetic: episode ids {k0}..{k0 + mqar_span(cfg) - 1} include the "
            f"tokenizer's end-of-text id {eot}, which separates every document; leave "
            "data.synthetic.mqar_first_id unset (ids after the tokenizer's "
            f"{tokenizer.vocab_size}) or pick ids the text does not hold"
        )
    clashes = text_id_clashes(cfg, tokens, tokenizer.vocab_size)
    if not clashes:
        return

    def role(i):
        return "key" if i in keys else "value" if i in values else "filler"

    def shown(i):
        if getattr(tokenizer, "name", "") == "byte":
            return f"byte 0x{i:02X}"
        return repr(tokenizer.decode([i]))

    parts = [
        f"{role(i)} id {i} ({shown(i)}) {n:,} times, first at token {at:,}"
        for i, (n, at) in sorted(clashes.items())
    ]
    raise SwaxError(
        f"data.synthetic: episode ids {k0}..{k0 + mqar_span(cfg) - 1} clash with {where} "
        f"({'; '.join(parts)}); leave data.synthetic.mqar_first_id unset (ids after the "
        f"tokenizer's {tokenizer.vocab_size}) or pick ids the text does not hold"
    )


def make_mqar_episode(
    rng: np.random.Generator,
    length: int,
    cfg: SyntheticConfig,
    haystack: np.ndarray | None = None,
    reach_range: tuple[int, int] | None = None,
    vocab_size: int | None = None,
) -> Episode:
    """One MQAR episode of exactly ``length`` tokens (see the module docstring);
    ``reach_range``: the nearest answer's reach drawn in it (see
    :func:`~swax.data.episode.draw_distance`); ``vocab_size``: the tokenizer's, where the ids
    start when ``mqar_first_id`` is unset."""
    n, q = cfg.num_needles, cfg.num_queries
    keys_ids, value_ids, noise_ids = mqar_ids(cfg, vocab_size)
    if n > len(keys_ids):
        raise SwaxError(
            f"MQAR episodes with {n} pairs need at least {n} keys, got mqar_keys={len(keys_ids)}"
        )
    keys = rng.choice(keys_ids, size=n, replace=False)
    values = rng.choice(value_ids, size=n, replace=True)
    asked = rng.permutation(n)[:q]  # which pairs are queried, in query order

    context = length - 2 * q  # filler + pairs, before the first query
    max_d = context - 2 * n
    if cfg.max_distance is not None:
        max_d = min(max_d, cfg.max_distance)
    if max_d < cfg.min_distance:
        raise SwaxError(
            f"episode length {length} too short: {n} MQAR pairs, {q} queries and "
            f"min_distance={cfg.min_distance} need {mqar_overhead(cfg)} tokens"
        )
    # query j (at context + 2j) reads the value of pair asked[j] (at start + 2 asked[j] + 1):
    # its reach is distance + 2n + 2j - 2 asked[j]
    extras = [2 * n + 2 * j - 2 * int(a) for j, a in enumerate(asked)]
    distance = draw_distance(rng, cfg, max_d, (min(extras), max(extras)), reach_range)
    start = context - distance - 2 * n  # first token of the pair block

    tokens = np.empty(length, dtype=np.int64)
    filler = context - 2 * n
    if len(noise_ids):
        fill = rng.choice(noise_ids, size=filler)
    else:
        if haystack is None or len(haystack) == 0:
            raise SwaxError("MQAR episodes with text filler (mqar_noise=0) need a haystack")
        at = int(rng.integers(len(haystack)))
        fill = np.take(np.asarray(haystack), np.arange(at, at + filler), mode="wrap")
    if cfg.mqar_distractors > 0:  # value tokens in the filler: the answer needs its key
        fill = np.array(fill, dtype=np.int64)
        hit = rng.random(filler) < cfg.mqar_distractors
        fill[hit] = rng.choice(value_ids, size=int(hit.sum()))
    tokens[:start] = fill[:start]
    tokens[start : start + 2 * n : 2] = keys
    tokens[start + 1 : start + 2 * n : 2] = values
    tokens[start + 2 * n : context] = fill[start:]
    tokens[context::2] = keys[asked]
    tokens[context + 1 :: 2] = values[asked]

    question_spans = [(context + 2 * j, context + 2 * j + 1) for j in range(q)]
    answer_spans = [(a + 1, a + 2) for a, _ in question_spans]
    # the pairs' positions, the queried ones first (in query order), as make_episode orders them
    order = list(asked) + [j for j in range(n) if j not in set(asked.tolist())]
    positions = [start + 2 * j for j in order]
    return Episode(
        tokens=tokens.tolist(),
        answer_spans=answer_spans,
        question_spans=question_spans,
        needle_span=(start, start + 2 * n),
        needle_positions=positions,
        distance=distance,
        depth=start / max(context - 2 * n, 1),
        keys=[int(keys[j]) for j in order],
        values=[int(values[j]) for j in order],
        reaches=[distance + e for e in extras],
    )

"""Synthetic retrieval episodes in the style of RULER's needle-in-a-haystack (niah_single).

An episode of exactly ``length`` tokens::

    [haystack ... distractor ... haystack][NEEDLE][haystack ... distractor ...][QUESTION][ANSWER]
                                                  |<------------ distance ---->|

- needle (full): "\\nOne of the special magic numbers for {key} is: {value}." with an
  adjective-noun key ("wakeful-abbey") and a 7-digit value, as in RULER;
- question: "\\nWhat is the special magic number for {key} mentioned in the provided text?
  The special magic number for {key} mentioned in the provided text is", answer " {value}";
- compact format for tiny models: needle "\\n{key}:{value}.", question "\\n?{key}:", answer
  "{value}", single-word keys and 4-digit values.

The haystack is a contiguous slice of natural-text tokens (end-of-text ids become a newline),
cut at token level so that the episode is exactly ``length`` tokens. The distance between the
queried needle's last token and the question's first token is drawn uniformly in
[min_distance, max_distance] (max_distance = as far as the episode allows when None). Distractor
needles carry other keys and sit at random places before or after the queried needle.

Keys come from wonderwords' adjective and noun lists (the lists RULER uses). Their nouns are
split by a stable hash into a training part and an evaluation part (about one in five), so
:func:`key_vocabulary` gives disjoint key sets for ``split="train"`` and ``split="eval"``.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from swax.core.errors import SwaxError
from swax.data.config import SyntheticConfig
from swax.data.episode import Episode, draw_distance, reach
from swax.data.mqar import make_mqar_episode, mqar_overhead

SPLITS = ("train", "eval")
EVAL_SHARE = 5
"""One noun in EVAL_SHARE (by hash) belongs to the evaluation keys."""
COMPACT_KEY_LEN = (3, 6)
"""Letters of the single-word keys of the compact format (shortest, longest)."""


def needle_text(key: str, value: str, compact: bool = False) -> str:
    if compact:
        return f"\n{key}:{value}."
    return f"\nOne of the special magic numbers for {key} is: {value}."


def question_text(key: str, compact: bool = False) -> str:
    if compact:
        return f"\n?{key}:"
    return (
        f"\nWhat is the special magic number for {key} mentioned in the provided text? "
        f"The special magic number for {key} mentioned in the provided text is"
    )


def answer_text(value: str, compact: bool = False) -> str:
    return value if compact else f" {value}"


# --------------------------------------------------------------------------------------------
# Keys


def _word_list(name: str) -> list[str]:
    try:
        text = resources.files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8")
    except (ImportError, FileNotFoundError, ModuleNotFoundError) as e:
        raise SwaxError(
            "synthetic retrieval episodes need the wonderwords package "
            f"(pip install wonderwords); cannot read its {name}"
        ) from e
    return [w.strip() for w in text.splitlines() if w.strip()]


def _is_eval_noun(noun: str) -> bool:
    return (
        hashlib.blake2b(b"swax-keys\0" + noun.encode(), digest_size=8).digest()[0] % EVAL_SHARE == 0
    )


@functools.cache
def _words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    banned = set(_word_list("profanitylist.txt"))
    ok = re.compile(r"[a-z]+").fullmatch

    def clean(words):
        return tuple(sorted({w for w in words if ok(w) and w not in banned}))

    return clean(_word_list("adjectivelist.txt")), clean(_word_list("nounlist.txt"))


@dataclass(frozen=True)
class KeyVocabulary:
    """The keys of one split: adjective-noun pairs ("wakeful-abbey"), or single nouns when
    ``compact``. Indexable and sized without building the millions of pairs."""

    split: str
    compact: bool
    adjectives: tuple[str, ...]
    nouns: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.nouns) if self.compact else len(self.adjectives) * len(self.nouns)

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(i)
        if self.compact:
            return self.nouns[i]
        a, n = divmod(i, len(self.nouns))
        return f"{self.adjectives[a]}-{self.nouns[n]}"

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if self.compact:
            return key in self._noun_set
        adj, _, noun = key.partition("-")
        return adj in self._adj_set and noun in self._noun_set

    @functools.cached_property
    def _noun_set(self) -> frozenset[str]:
        return frozenset(self.nouns)

    @functools.cached_property
    def _adj_set(self) -> frozenset[str]:
        return frozenset(self.adjectives)

    def sample(self, rng: np.random.Generator, k: int) -> list[str]:
        """``k`` distinct keys drawn uniformly."""
        if k > len(self):
            raise SwaxError(f"cannot draw {k} distinct keys from {len(self)} {self.split} keys")
        seen: dict[int, None] = {}
        while len(seen) < k:
            seen.setdefault(int(rng.integers(len(self))), None)
        return [self[i] for i in seen]

    @property
    def longest(self) -> str:
        """The longest key (in characters): used to check that episodes fit a length."""
        noun = max(self.nouns, key=len)
        return noun if self.compact else f"{max(self.adjectives, key=len)}-{noun}"


@functools.cache
def key_vocabulary(split: str = "train", compact: bool = False) -> KeyVocabulary:
    """The keys of ``split`` ("train" or "eval"); the two are disjoint (nouns are partitioned
    by a stable hash, about one in five for evaluation). ``compact``: single nouns of 3-6
    letters instead of adjective-noun pairs."""
    if split not in SPLITS:
        raise SwaxError(f"unknown key split {split!r} (expected 'train' or 'eval')")
    adjectives, nouns = _words()
    if compact:
        lo, hi = COMPACT_KEY_LEN
        nouns = tuple(n for n in nouns if lo <= len(n) <= hi)
    nouns = tuple(n for n in nouns if _is_eval_noun(n) == (split == "eval"))
    return KeyVocabulary(split=split, compact=compact, adjectives=adjectives, nouns=nouns)


# --------------------------------------------------------------------------------------------
# Episodes


def _values(rng: np.random.Generator, k: int, digits: int) -> list[str]:
    lo, hi = 10 ** (digits - 1), 10**digits  # first digit non-zero: exactly `digits` digits
    if k > hi - lo:
        raise SwaxError(f"cannot draw {k} distinct {digits}-digit values")
    seen: dict[int, None] = {}
    while len(seen) < k:
        seen.setdefault(int(rng.integers(lo, hi)), None)
    return [str(v) for v in seen]


def _haystack(rng, haystack: np.ndarray, n: int, eot_id: int, newline: int | None) -> np.ndarray:
    """``n`` consecutive tokens from a random place of ``haystack`` (wrapping around)."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    start = int(rng.integers(len(haystack)))
    out = np.take(haystack, np.arange(start, start + n), mode="wrap").astype(np.int64)
    if newline is not None:
        out[out == eot_id] = newline
    return out


def _fill(rng, hay: np.ndarray, needles: list[list[int]]) -> tuple[list[int], list[int]]:
    """``hay`` with ``needles`` inserted at uniformly random places; (tokens, needle starts)."""
    offsets = np.sort(rng.integers(0, len(hay) + 1, size=len(needles)))
    order = rng.permutation(len(needles))  # which needle goes to which place
    out: list[int] = []
    starts = [0] * len(needles)
    prev = 0
    for off, j in zip(offsets.tolist(), order.tolist()):
        out.extend(hay[prev:off].tolist())
        starts[j] = len(out)
        out.extend(needles[j])
        prev = off
    out.extend(hay[prev:].tolist())
    return out, starts


def episode_overhead(tokenizer, cfg: SyntheticConfig, split: str = "train") -> int:
    """Tokens of an episode besides the haystack with the longest key of ``split``, plus
    min_distance: an episode needs at least this many tokens (exactly so for byte-level)."""
    if cfg.task == "mqar":
        return mqar_overhead(cfg)
    key = key_vocabulary(split, cfg.compact).longest
    value = "9" * cfg.digits
    needle = len(tokenizer.encode(needle_text(key, value, cfg.compact)))
    qa = len(tokenizer.encode(question_text(key, cfg.compact))) + len(
        tokenizer.encode(answer_text(value, cfg.compact))
    )
    return needle * cfg.num_needles + qa * cfg.num_queries + cfg.min_distance


def make_episode(
    rng: np.random.Generator | int,
    tokenizer,
    haystack_tokens,
    length: int,
    cfg: SyntheticConfig | None = None,
    split: str = "train",
    reach_range: tuple[int, int] | None = None,
) -> Episode:
    """One retrieval episode of exactly ``length`` tokens (see the module docstring), as an
    :class:`~swax.data.episode.Episode`; with ``cfg.task == "mqar"`` an MQAR episode
    (:func:`swax.data.mqar.make_mqar_episode`).

    With ``cfg.num_queries = q`` the first q needles are queried one after the other at the end
    (question, answer, question, answer, ...); the distance rule applies to the first.
    Deterministic given the state of ``rng``. ``reach_range``: the first answer's reach (the
    window it needs) drawn in that range (:func:`~swax.data.episode.draw_distance`).

    The near/far rule (``far_share``) holds for every answer of an MQAR episode; here it holds
    for the first (the other queried needles sit at random places).
    """
    cfg = cfg or SyntheticConfig()
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    if cfg.task == "mqar":  # key-value pairs of dedicated ids (swax.data.mqar); no key split
        vocab = getattr(tokenizer, "vocab_size", None)
        return make_mqar_episode(rng, length, cfg, haystack_tokens, reach_range, vocab)
    hay_src = np.asarray(haystack_tokens)
    if hay_src.ndim != 1 or len(hay_src) == 0:
        raise SwaxError("synthetic episodes need a non-empty 1-D haystack of tokens")
    compact = cfg.compact
    keys = key_vocabulary(split, compact).sample(rng, cfg.num_needles)
    values = _values(rng, cfg.num_needles, cfg.digits)
    needles = [tokenizer.encode(needle_text(k, v, compact)) for k, v in zip(keys, values)]
    nq = cfg.num_queries
    qa = [
        (tokenizer.encode(question_text(k, compact)), tokenizer.encode(answer_text(v, compact)))
        for k, v in zip(keys[:nq], values[:nq])
    ]
    context = length - sum(len(q) + len(a) for q, a in qa)  # everything before the questions
    n0 = len(needles[0])
    others = sum(len(n) for n in needles[1:])
    max_d = context - n0 - others
    if cfg.max_distance is not None:
        max_d = min(max_d, cfg.max_distance)
    if max_d < cfg.min_distance:
        need = length - context + n0 + others + cfg.min_distance
        raise SwaxError(
            f"episode length {length} too short: {cfg.num_needles} needle(s), the "
            f"question and min_distance={cfg.min_distance} need {need} tokens"
        )
    # the first answer's first token is read at the question's last token; its value starts
    # `lead` tokens into the needle: reach = distance + n0 - lead + len(question)
    lead = _value_lead(tokenizer, keys[0], values[0], compact)
    extra = n0 - lead + len(qa[0][0])
    distance = draw_distance(rng, cfg, max_d, (extra, extra), reach_range)
    needle_start = context - distance - n0
    where, room = _place_distractors(rng, needles, needle_start, distance)
    hay = _haystack(rng, hay_src, room[0] + room[1], tokenizer.eot_id, _newline_id(tokenizer))
    before, starts_b = _fill(rng, hay[: room[0]], [needles[j] for j in where[0]])
    after, starts_a = _fill(rng, hay[room[0] :], [needles[j] for j in where[1]])
    tokens, question_spans, answer_spans = _ask(before + needles[0] + after, qa)
    assert len(before) == needle_start and len(tokens) == length, (len(tokens), length)
    positions = [0] * cfg.num_needles
    positions[0] = needle_start
    for j, s in zip(where[0], starts_b):
        positions[j] = s
    for j, s in zip(where[1], starts_a):
        positions[j] = needle_start + n0 + s  # after the queried needle
    return Episode(
        tokens=tokens,
        answer_spans=answer_spans,
        question_spans=question_spans,
        needle_span=(needle_start, needle_start + n0),
        needle_positions=positions,
        distance=distance,
        depth=needle_start / max(context - n0, 1),
        keys=keys,
        values=values,
        reaches=[
            reach(a0 - 1, positions[j] + _value_lead(tokenizer, keys[j], values[j], compact))
            for j, (a0, _) in enumerate(answer_spans)
        ],
    )


def _ask(tokens: list[int], qa: list[tuple[list[int], list[int]]]):
    """``tokens`` followed by each (question, answer) of ``qa``, and the spans of the questions
    and of the answers."""
    question_spans, answer_spans = [], []
    for q, a in qa:
        question_spans.append((len(tokens), len(tokens) + len(q)))
        tokens = tokens + q
        answer_spans.append((len(tokens), len(tokens) + len(a)))
        tokens = tokens + a
    return tokens, question_spans, answer_spans


def _value_lead(tokenizer, key: str, value: str, compact: bool) -> int:
    """Tokens of a needle before its value's first token (the needle's text up to the value,
    tokenized alone: exact for byte-level tokenizers, and for BPE where the value starts a new
    token, as digits after ": " or ":" do in GPT-2's)."""
    text = needle_text(key, value, compact)
    return len(tokenizer.encode(text[: text.rindex(value)]))


def _place_distractors(rng, needles, needle_start: int, distance: int):
    """Which side of the queried needle (0 before, 1 after) each distractor needle goes to,
    with probability proportional to the haystack room left on each side; returns the lists
    of distractor indices per side and the haystack tokens left per side. Everything fits
    before the queried needle by construction (needle_start >= the distractors' length)."""
    room = [needle_start, distance]
    where: list[list[int]] = [[], []]
    for j in range(1, len(needles)):
        size = len(needles[j])
        fits_after = room[1] >= size
        p_after = room[1] / (room[0] + room[1]) if fits_after and room[0] + room[1] else 0.0
        side = 1 if (fits_after and rng.random() < p_after) else 0
        where[side].append(j)
        room[side] -= size
    return where, room


def _newline_id(tokenizer) -> int | None:
    ids = tokenizer.encode("\n")
    return ids[0] if len(ids) == 1 else None

"""RULER's needle-in-a-haystack tasks: data generation and scoring, offline.

A re-implementation (own code) of the NIAH part of NVIDIA's RULER benchmark
(github.com/NVIDIA/RULER, ``scripts/``), written to produce the same prompts:

- **Task settings** (:data:`TASKS`): the eight ``niah_*`` entries of ``synthetic.yaml``
  (type_haystack, type_needle_k, type_needle_v, num_needle_k/v/q); ``num_needle_k`` is raised to
  ``num_needle_q`` as ``niah.py`` does at start-up.
- **Template, answer prefix, tokens to generate** (:data:`TEMPLATE`, :data:`ANSWER_PREFIX`,
  :data:`TOKENS_TO_GENERATE` = 128): ``data/synthetic/constants.py`` ``TASKS['niah']``, joined
  as ``prepare.py`` ``main`` does with the ``base`` model template of ``data/template.py``
  (``"{task_template}"``, no chat wrapper) followed by the answer prefix. The singular wording
  when ``num_needle_q * num_needle_v == 1`` ('Some'->'A', 'are all'->'is', 'are'->'is',
  'answers'->'answer', value type without its final 's') follows ``niah.py``
  ``generate_input_output``; so does cutting the formatted text at the last occurrence of the
  answer prefix's first 10 characters into ``input`` and ``answer_prefix``
  (``niah.py`` ``generate_samples``).
- **Needle and haystacks** (:data:`NEEDLE`, :data:`NOISE`): ``niah.py`` module level. The noise
  haystack repeats the noise paragraph, the ``needle`` haystack is made of distractor needles
  with random keys and values of the task's kinds; both join their sentences with newlines and
  insert the needles at indices ``random.sample(range(n), k)`` taken in decreasing order
  (``niah.py`` ``generate_input_output``). The essay haystack takes the first ``n``
  whitespace-separated words of a text (repeated when too short), splits them into sentences,
  and inserts the needles after ``int(S * depth / 100)`` of the ``S`` sentences, the depths
  drawn without replacement from :data:`DEPTHS` = 40 evenly spaced percentages
  (``np.round(np.linspace(0, 100, 40))``) and matched in increasing order to the needles,
  everything joined by single spaces (same function).
- **Keys and values**: adjective-noun words ``f"{adj}-{noun}"`` drawn uniformly from the
  product of wonderwords' ``adjectivelist.txt`` and ``nounlist.txt`` as read by
  ``wonderwords.random_word._get_words_from_text_file`` (``niah.py`` ``generate_random_word``);
  7-digit numbers ``randint(10**6, 10**7 - 1)`` (``generate_random_number``); UUIDs
  ``uuid.UUID(int=getrandbits(128), version=4)`` (``generate_random_uuid``). Needles are shuffled
  with a fresh ``random.Random(seed)`` as RULER does; the query joins several keys as
  "a, b, c, and d" and the references are the values of the queried keys in order.
- **Haystack size**: the largest haystack (in words for an essay, sentences otherwise) such that
  ``len(tokenize(input + answer_prefix)) + tokens_to_generate <= max_length`` in the tokenizer
  given (``niah.py`` ``generate_samples``); ``length`` in a record is that left-hand side.
- **Scoring**: :func:`string_match_all`, :func:`string_match_part` and :func:`postprocess_pred`
  follow ``eval/synthetic/constants.py`` and ``eval/evaluate.py`` ``postprocess_pred``.

Deviations, each for a stated reason:

- The haystack size is searched **per sample** (for that sample's keys, values and depths), and
  to one word or sentence. RULER searches once per task with one random draw and then lowers
  the size by 500 words (25 sentences) when a sample does not fit; at short lengths in a
  byte-level tokenizer that step is larger than the whole context (RULER would loop forever),
  and it leaves samples far below the target length. The search is guided by an additive
  estimate of each word's (sentence's) tokens and always checked on the exact token count of
  the full prompt, so a 131k-token prompt costs a handful of tokenizations.
- Randomness is drawn from a ``random.Random`` per sample seeded from (seed, task, length,
  sample index), so a sample does not depend on how many haystack sizes the search tried.
  Insertion indices in the noise and needle haystacks depend on the haystack size, as in RULER,
  and are drawn from their own seeded generator for each size.
- Keys within a sample are distinct, the values of a sample are distinct, and distractor
  needles never reuse a key of the sample (RULER leaves these to chance; a collision would make
  the answer ambiguous).
- Sentences are split by a small rule (a word ending in ``.``, ``!`` or ``?``, possibly followed
  by closing quotes or brackets, ends a sentence unless it is a common abbreviation or a single
  initial) instead of NLTK's punkt model, which needs a download.
- The essay haystack defaults to the King James Bible (chapter texts without their headings,
  :func:`swax.data.sources.kjv_documents`) instead of Paul Graham's essays, which RULER
  downloads; any local text can be passed instead.
- ``index`` is the sample's index (RULER's current ``niah.py`` overwrites it with the answer's
  character offset by reusing the loop variable).
- ``key_split="eval"`` (or ``"train"``) draws every adjective-noun key, distractors included,
  from :func:`swax.data.synthetic.key_vocabulary` instead of RULER's full word product.
"""

from __future__ import annotations

import functools
import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from swax.core.errors import SwaxError
from swax.data.jsonl import read_jsonl, write_jsonl
from swax.data.sources import kjv_documents
from swax.data.synthetic import key_vocabulary

__all__ = [
    "ANSWER_PREFIX",
    "DEPTHS",
    "NEEDLE",
    "NOISE",
    "TASKS",
    "TEMPLATE",
    "TOKENS_TO_GENERATE",
    "NiahTask",
    "generate_niah",
    "postprocess_pred",
    "read_jsonl",
    "string_match_all",
    "string_match_part",
    "write_jsonl",
]

# --------------------------------------------------------------------------------------------
# RULER's definitions

TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
"""``TASKS['niah']['template']`` of RULER's ``scripts/data/synthetic/constants.py``."""

ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
"""``TASKS['niah']['answer_prefix']`` of the same file."""

TOKENS_TO_GENERATE = 128
"""``TASKS['niah']['tokens_to_generate']``."""

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
"""The needle sentence of RULER's ``niah.py`` (the value type stays plural here)."""

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""The noise haystack's sentence of RULER's ``niah.py``."""

DEPTHS: tuple[int, ...] = tuple(
    int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)
)
"""Needle depths (percent) of the essay haystack: RULER's ``DEPTHS``."""

HAYSTACKS = ("noise", "essay", "needle")
NEEDLE_TYPES = ("words", "numbers", "uuids")


@dataclass(frozen=True)
class NiahTask:
    """One RULER NIAH task: its entry of ``synthetic.yaml``."""

    name: str
    type_haystack: str
    """noise (repeated sentences), essay (sentences of a text) or needle (distractor needles)."""
    type_needle_k: str
    """Kind of keys: words (adjective-noun), numbers (7 digits) or uuids."""
    type_needle_v: str
    """Kind of values: numbers or uuids (words also accepted, as in RULER)."""
    num_needle_k: int = 1
    """Keys with a needle in the context (raised to num_needle_q)."""
    num_needle_v: int = 1
    """Needles (values) per key."""
    num_needle_q: int = 1
    """Keys asked about in the question."""
    tokens_to_generate: int = TOKENS_TO_GENERATE

    @property
    def num_keys(self) -> int:
        """Keys actually placed: RULER's ``max(num_needle_k, num_needle_q)``."""
        return max(self.num_needle_k, self.num_needle_q)

    @property
    def num_needles(self) -> int:
        return self.num_keys * self.num_needle_v

    @property
    def singular(self) -> bool:
        """The question asks for a single value: RULER's singular wording."""
        return self.num_needle_q * self.num_needle_v == 1

    @property
    def value_word(self) -> str:
        """The value type as the template writes it ("number" or "numbers", ...)."""
        return self.type_needle_v[:-1] if self.singular else self.type_needle_v

    def prompt_template(self) -> str:
        """Template + answer prefix (``base`` model template) with RULER's singular wording,
        ``{type_needle_v}`` filled in; ``{context}`` and ``{query}`` are left to fill."""
        text = TEMPLATE + ANSWER_PREFIX
        if self.singular:
            for old, new in (
                ("Some", "A"),
                ("are all", "is"),
                ("are", "is"),
                ("answers", "answer"),
            ):
                text = text.replace(old, new)
        return text.replace("{type_needle_v}", self.value_word)

    def template(self) -> tuple[str, str]:
        """(template, answer prefix) as the model sees them, with ``{context}`` and ``{query}``
        placeholders: the prompt is ``template`` then (the model's) ``answer prefix``."""
        text = self.prompt_template()
        cut = text.rfind(ANSWER_PREFIX[:10])
        return text[:cut], text[cut:]


def _task(
    name: str, haystack: str, k_type: str, v_type: str, k: int = 1, v: int = 1, q: int = 1
) -> tuple[str, NiahTask]:
    return name, NiahTask(name, haystack, k_type, v_type, k, v, q)


TASKS: dict[str, NiahTask] = dict(
    [
        _task("niah_single_1", "noise", "words", "numbers"),
        _task("niah_single_2", "essay", "words", "numbers"),
        _task("niah_single_3", "essay", "words", "uuids"),
        _task("niah_multikey_1", "essay", "words", "numbers", k=4),
        _task("niah_multikey_2", "needle", "words", "numbers"),
        _task("niah_multikey_3", "needle", "uuids", "uuids"),
        _task("niah_multivalue", "essay", "words", "numbers", v=4),
        _task("niah_multiquery", "essay", "words", "numbers", q=4),
    ]
)
"""The eight NIAH tasks of RULER's ``scripts/synthetic.yaml``."""


# --------------------------------------------------------------------------------------------
# Keys and values


def _wonderwords(name: str) -> list[str]:
    try:
        from wonderwords import random_word
    except ImportError as e:
        raise SwaxError(
            "RULER's NIAH keys need the wonderwords package (pip install wonderwords)"
        ) from e
    return list(random_word._get_words_from_text_file(name))


@functools.cache
def _ruler_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """RULER's word keys are ``sorted(set(adj-noun for every adjective and noun))``; the
    distinct adjectives x distinct nouns give the same set (no two pairs coincide), so a key is
    drawn as one uniform index into that product."""
    return (
        tuple(sorted(set(_wonderwords("adjectivelist.txt")))),
        tuple(sorted(set(_wonderwords("nounlist.txt")))),
    )


class _WordKeys:
    """Adjective-noun keys, uniform over RULER's product or a swax key vocabulary."""

    def __init__(self, key_split: str | None):
        if key_split is None:
            self.adjs, self.nouns = _ruler_words()
            self.vocab = None
            self.size = len(self.adjs) * len(self.nouns)
        else:
            self.vocab = key_vocabulary(key_split)
            self.size = len(self.vocab)

    def draw(self, rng: random.Random) -> str:
        i = rng.randrange(self.size)
        if self.vocab is not None:
            return self.vocab[i]
        a, n = divmod(i, len(self.nouns))
        return f"{self.adjs[a]}-{self.nouns[n]}"


def _draw(kind: str, rng: random.Random, words: _WordKeys) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        return words.draw(rng)
    raise SwaxError(f"unknown needle type {kind!r} (expected one of {', '.join(NEEDLE_TYPES)})")


def _draw_distinct(kind: str, rng: random.Random, words: _WordKeys, taken: set[str]) -> str:
    while True:
        x = _draw(kind, rng, words)
        if x not in taken:
            taken.add(x)
            return x


# --------------------------------------------------------------------------------------------
# Haystacks

_CLOSERS = "\"')]’”»"
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e inc ltd co no vol fig cf u.s a.m p.m".split()
)


def _ends_sentence(word: str) -> bool:
    """Whether a sentence ends after ``word`` (a stand-in for punkt: final . ! ? possibly
    followed by closing quotes or brackets, except abbreviations and single initials)."""
    w = word.rstrip(_CLOSERS)
    if not w or w[-1] not in ".!?":
        return False
    if w[-1] == ".":
        core = w.lstrip("\"'([‘“«")[:-1]
        if core.lower() in _ABBREVIATIONS or (len(core) == 1 and core.isalpha()):
            return False
    return True


class _Counts:
    """Per-unit token counts (cumulative) of a haystack in one tokenizer: an additive estimate
    used to aim the search; the search itself counts the exact prompt."""

    def __init__(self, unit_counts: Callable[[int, int], np.ndarray]):
        self._more = unit_counts  # (start, stop) -> counts of units start..stop-1
        self.cum = np.zeros(1, dtype=np.int64)

    def _extend(self, n: int) -> None:
        have = len(self.cum) - 1
        if n > have:
            n = max(n, 2 * have, 64)
            c = np.maximum(self._more(have, n), 1)
            self.cum = np.concatenate([self.cum, self.cum[-1] + np.cumsum(c)])

    def __call__(self, n: int) -> int:
        self._extend(n)
        return int(self.cum[n])

    def largest(self, tokens: int) -> int:
        """Largest n with cum(n) <= tokens (0 when none)."""
        if tokens <= 0:
            return 0
        while self.cum[-1] <= tokens:
            self._extend(len(self.cum) * 2)
        return max(0, int(np.searchsorted(self.cum, tokens, side="right")) - 1)


class _Essay:
    """The words of a text (whitespace-normalised, repeated on demand) and where its sentences
    end; sentence boundaries of a prefix are those of the whole text inside the prefix."""

    def __init__(self, text: str):
        words = re.sub(r"\s+", " ", text).strip().split(" ")
        if words == [""]:
            raise SwaxError("the essay haystack text is empty")
        self.base = words
        self.base_ends = np.array(
            [i for i, w in enumerate(words) if _ends_sentence(w)], dtype=np.int64
        )
        self.words = list(words)
        self.ends = self.base_ends.copy()
        self._counts: dict[int, tuple[object, _Counts]] = {}

    def _ensure(self, n: int) -> None:
        while len(self.words) < n:
            offset = len(self.words)
            self.words.extend(self.base)
            self.ends = np.concatenate([self.ends, self.base_ends + offset])

    def counts(self, tokenizer) -> _Counts:
        key = id(tokenizer)
        if key not in self._counts:
            base = self.base
            uniq = sorted(set(base))
            lut = dict(
                zip(
                    uniq,
                    (len(t) for t in tokenizer.encode_batch([" " + w for w in uniq])),
                    strict=True,
                )
            )
            per_word = np.fromiter((lut[w] for w in base), dtype=np.int64, count=len(base))

            def more(start: int, stop: int) -> np.ndarray:
                return per_word[np.arange(start, stop) % len(per_word)]

            if len(self._counts) >= 4:
                self._counts.pop(next(iter(self._counts)))
            self._counts[key] = (tokenizer, _Counts(more))  # keeps the tokenizer (and id) alive
        return self._counts[key][1]

    def context(self, n: int, needles: Sequence[str], depths: Sequence[int]) -> str:
        """The first ``n`` words with ``needles[i]`` after ``int(S * (depth_i / 100))``
        sentences (depths sorted), as RULER joins them."""
        self._ensure(n)
        inner = int(np.searchsorted(self.ends, n - 1, side="left")) if n else 0
        num_sents = inner + 1 if n else 0

        def word_at(p: int) -> int:  # first word of sentence p (p == num_sents: n)
            return 0 if p == 0 else n if p >= num_sents else int(self.ends[p - 1]) + 1

        cuts = [0] + sorted(int(num_sents * (d / 100)) for d in depths) + [num_sents]
        parts: list[str] = []
        for i in range(1, len(cuts)):
            parts.append(" ".join(self.words[word_at(cuts[i - 1]) : word_at(cuts[i])]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        return " ".join(parts)


@functools.lru_cache(maxsize=4)
def _essay(text: str | None) -> _Essay:
    if text is None:
        text = "\n".join(doc.split("\n", 1)[-1] for doc in kjv_documents())  # drop headings
    return _Essay(text)


def _insert_lines(
    units: Sequence[str], needles: Sequence[str], rng: random.Random
) -> tuple[str, list[float]]:
    """RULER's noise/needle context: needles inserted at ``random.sample(range(n), k)`` taken in
    decreasing order, lines joined by newlines. Returns (context, depth of each needle)."""
    n = len(units)
    indexes = sorted(rng.sample(range(n), len(needles)), reverse=True)
    lines = list(units)
    for index, needle in zip(indexes, needles):
        lines.insert(index, needle)
    return "\n".join(lines), [round(100 * i / n, 2) for i in indexes]


# --------------------------------------------------------------------------------------------
# Generation


def _fit(count: Callable[[int], int], approx: _Counts, n_min: int, budget: int) -> int | None:
    """A haystack size n >= n_min with count(n) <= budget < count(n + 1) (None when n_min does
    not fit). Probes are aimed by the additive estimate ``approx`` corrected by the last exact
    count; after a few probes it falls back to galloping and bisection."""
    c = count(n_min)
    if c > budget:
        return None
    lo, hi = n_min, None

    def aim(n: int, cn: int) -> int:
        return approx.largest(budget - (cn - approx(n)))

    n = aim(n_min, c)
    for _ in range(6):
        if hi is not None and hi - lo <= 1:
            return lo
        n = max(n, lo + 1) if hi is None else min(max(n, lo + 1), hi - 1)
        cn = count(n)
        if cn <= budget:
            lo = n
            g = aim(n, cn)
            n = g if g > n else n + 1
        else:
            hi = n
            n = aim(n, cn)
    if hi is None:
        step = max(1, lo // 32)
        while hi is None:
            if count(lo + step) <= budget:
                lo += step
                step *= 2
            else:
                hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _resolve_task(task: str | NiahTask) -> NiahTask:
    if isinstance(task, NiahTask):
        return task
    if task not in TASKS:
        raise SwaxError(f"unknown NIAH task {task!r} (expected one of {', '.join(TASKS)})")
    return TASKS[task]


def generate_niah(
    task: str,
    length: int,
    num_samples: int,
    tokenizer,
    seed: int = 42,
    haystack_text: str | None = None,
    key_split: str | None = None,
    tokens_to_generate: int | None = None,
) -> list[dict]:
    """``num_samples`` RULER records of ``task`` for a context of ``length`` tokens.

    Each record has RULER's fields ``index``, ``input`` (the prompt without the answer prefix),
    ``outputs`` (the reference values), ``length`` (tokens of input + answer prefix, plus
    ``tokens_to_generate``), ``answer_prefix`` and ``token_position_answer``, and also ``depth``
    (depth in percent of the needle of each reference, in the order of ``outputs``), ``task``,
    ``max_length`` and ``tokens_to_generate``. ``haystack_text`` replaces the essay haystack
    (default: the King James Bible); ``key_split`` ("eval" or "train") draws word keys from
    :func:`swax.data.synthetic.key_vocabulary`. The same arguments give the same records.
    """
    spec = _resolve_task(task)
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise SwaxError(f"NIAH length must be a positive integer, got {length!r}")
    if (
        isinstance(num_samples, bool)
        or not isinstance(num_samples, (int, np.integer))
        or num_samples < 0
    ):
        raise SwaxError(
            f"number of NIAH samples must be a non-negative integer, got {num_samples!r}"
        )
    if key_split not in (None, "train", "eval"):
        raise SwaxError(f"unknown key split {key_split!r} (expected None, 'train' or 'eval')")
    if spec.type_haystack not in HAYSTACKS:
        raise SwaxError(
            f"unknown haystack type {spec.type_haystack!r} (expected one of {', '.join(HAYSTACKS)})"
        )
    ttg = spec.tokens_to_generate if tokens_to_generate is None else int(tokens_to_generate)
    if ttg < 0:
        raise SwaxError(f"tokens_to_generate must be >= 0, got {ttg}")
    length, num_samples = int(length), int(num_samples)
    budget = length - ttg
    words = _WordKeys(key_split)
    essay = None
    if spec.type_haystack == "essay":
        if haystack_text is not None and not haystack_text.strip():
            raise SwaxError("the essay haystack text is empty")
        essay = _essay(haystack_text)
    return [
        _sample(spec, i, length, budget, ttg, tokenizer, seed, words, essay)
        for i in range(num_samples)
    ]


@dataclass
class _Needles:
    """The keys, values and needle sentences of one sample, and which keys the question asks."""

    keys: list[str]
    values: list[list[str]]
    """values[k]: the values of key k."""
    needles: list[tuple[int, str, str]]
    """(key index, value, sentence), in the order they are placed in the haystack."""
    queried: list[int]
    """Indices of the keys asked about, in the question's order."""

    @property
    def texts(self) -> list[str]:
        return [t for _, _, t in self.needles]

    @property
    def outputs(self) -> list[str]:
        """The references: the values of the queried keys, in order."""
        return [v for i in self.queried for v in self.values[i]]

    @property
    def query(self) -> str:
        """The queried keys as RULER joins them: "a", or "a, b, c, and d"."""
        q = [self.keys[i] for i in self.queried]
        return q[0] if len(q) == 1 else ", ".join(q[:-1]) + ", and " + q[-1]


def _draw_needles(spec: NiahTask, rng: random.Random, seed: int, words: _WordKeys) -> _Needles:
    taken: set[str] = set()  # keys and values of a sample are all distinct
    keys = [_draw_distinct(spec.type_needle_k, rng, words, taken) for _ in range(spec.num_keys)]
    values = [
        [_draw_distinct(spec.type_needle_v, rng, words, taken) for _ in range(spec.num_needle_v)]
        for _ in keys
    ]
    needles = [
        (k, v, NEEDLE.format(type_needle_v=spec.type_needle_v, key=keys[k], value=v))
        for k in range(len(keys))
        for v in values[k]
    ]
    random.Random(seed).shuffle(needles)  # RULER shuffles with a fresh Random(seed)
    queried = rng.sample(range(len(keys)), spec.num_needle_q)
    return _Needles(keys, values, needles, queried)


class _EssayHaystack:
    """The first n words of the essay with the needles at their depths (percent of the
    sentences); n counts words."""

    n_min = 0

    def __init__(self, essay: _Essay, tokenizer, needle_texts: list[str], depths: list[int]):
        self.essay, self.texts, self.depths = essay, needle_texts, depths
        self.approx = essay.counts(tokenizer)

    def build(self, n: int) -> tuple[str, list[float]]:
        """(context, depth of each needle in placement order)."""
        context = self.essay.context(n, self.texts, self.depths)
        return context, [float(d) for d in sorted(self.depths)]


class _NoiseLines:
    """RULER's noise haystack: the noise paragraph, once per line."""

    def __init__(self, tokenizer):
        per_line = len(tokenizer.encode("\n" + NOISE))
        self.approx = _Counts(lambda a, b: np.full(b - a, per_line, dtype=np.int64))

    def units(self, n: int) -> list[str]:
        return [NOISE] * n


class _DistractorLines:
    """RULER's needle haystack: distractor needles with fresh random keys (never a key of the
    sample) and values, drawn as a stream so the first n never change as n grows."""

    def __init__(self, spec: NiahTask, name: str, words: _WordKeys, keys: list[str], tokenizer):
        self.spec, self.words, self.keys, self.tok = spec, words, set(keys), tokenizer
        self.rng = random.Random(name + "|distractors")
        self.lines: list[str] = []
        self.approx = _Counts(self._counts)

    def units(self, n: int) -> list[str]:
        spec = self.spec
        while len(self.lines) < n:
            key = _draw_distinct(spec.type_needle_k, self.rng, self.words, set(self.keys))
            value = _draw(spec.type_needle_v, self.rng, self.words)
            self.lines.append(NEEDLE.format(type_needle_v=spec.type_needle_v, key=key, value=value))
        return self.lines[:n]

    def _counts(self, a: int, b: int) -> np.ndarray:
        lines = self.units(b)[a:b]
        counts = [len(t) for t in self.tok.encode_batch(["\n" + d for d in lines])]
        return np.array(counts, dtype=np.int64)


class _LineHaystack:
    """n lines of a line source with the needles inserted at RULER's random line indices (drawn
    afresh for each n from a generator seeded by the sample's name and n); n counts lines."""

    def __init__(self, lines: _NoiseLines | _DistractorLines, needle_texts: list[str], name: str):
        self.lines, self.texts, self.name = lines, needle_texts, name
        self.approx = lines.approx
        self.n_min = len(needle_texts)

    def build(self, n: int) -> tuple[str, list[float]]:
        rng = random.Random(f"{self.name}|at|{n}")
        return _insert_lines(self.lines.units(n), self.texts, rng)


class _PromptLength:
    """Exact token count of the prompt around a haystack of size n (memoised)."""

    def __init__(self, tokenizer, head: str, haystack, tail: str):
        self.tok, self.head, self.haystack, self.tail = tokenizer, head, haystack, tail
        self.memo: dict[int, int] = {}

    def __call__(self, n: int) -> int:
        if n not in self.memo:
            context = self.haystack.build(n)[0]
            self.memo[n] = len(self.tok.encode(self.head + context + self.tail))
        return self.memo[n]


def _sample(
    spec: NiahTask,
    index: int,
    length: int,
    budget: int,
    ttg: int,
    tokenizer,
    seed: int,
    words: _WordKeys,
    essay: _Essay | None,
) -> dict:
    """Sample ``index``: draw its needles, fit the largest haystack whose prompt fits the
    budget, and build the record."""
    name = f"swax-ruler|{seed}|{spec.name}|{length}|{index}"
    rng = random.Random(name)
    nd = _draw_needles(spec, rng, seed, words)
    head, tail = spec.prompt_template().replace("{query}", nd.query).split("{context}")
    if essay is not None:
        depths = rng.sample(DEPTHS, len(nd.needles))
        haystack = _EssayHaystack(essay, tokenizer, nd.texts, depths)
    elif spec.type_haystack == "noise":
        haystack = _LineHaystack(_NoiseLines(tokenizer), nd.texts, name)
    else:
        lines = _DistractorLines(spec, name, words, nd.keys, tokenizer)
        haystack = _LineHaystack(lines, nd.texts, name)
    count = _PromptLength(tokenizer, head, haystack, tail)
    n = _fit(count, haystack.approx, haystack.n_min, budget)
    if n is None:
        need = count.memo[haystack.n_min] + ttg
        raise SwaxError(
            f"NIAH length {length} is too short for {spec.name}: its template, "
            f"needles and smallest haystack need {need} tokens ({count.memo[haystack.n_min]} "
            f"prompt + {ttg} to generate) in tokenizer {getattr(tokenizer, 'name', '?')}"
        )
    context, needle_depths = haystack.build(n)
    text = head + context + tail
    cut = text.rfind(ANSWER_PREFIX[:10])  # RULER cuts the answer prefix off the prompt here
    prompt, answer_prefix = text[:cut], text[cut:]
    depth_of = {(k, v): d for (k, v, _), d in zip(nd.needles, needle_depths)}
    where = prompt.find(nd.outputs[0])
    return {
        "index": index,
        "input": prompt,
        "outputs": nd.outputs,
        "length": count.memo[n] + ttg,
        "answer_prefix": answer_prefix,
        "token_position_answer": len(tokenizer.encode(prompt[:where])),
        "depth": [depth_of[(i, v)] for i in nd.queried for v in nd.values[i]],
        "task": spec.name,
        "max_length": length,
        "tokens_to_generate": ttg,
    }


# --------------------------------------------------------------------------------------------
# Scoring


def _check_pairs(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(preds) != len(refs):
        raise SwaxError(f"{len(preds)} predictions for {len(refs)} references")
    if not preds:
        raise SwaxError("no predictions to score")


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's metric for NIAH: per sample, the share of references found (case-insensitive
    substring) in the prediction; mean over samples, in percent, rounded to 2 decimals."""
    _check_pairs(preds, refs)
    total = sum(
        sum(1.0 if r.lower() in p.lower() else 0.0 for r in ref) / len(ref)
        for p, ref in zip(preds, refs)
    )
    return round(total / len(preds) * 100, 2)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's metric for QA: a sample counts 1 when any reference is found in the prediction;
    mean over samples, in percent, rounded to 2 decimals."""
    _check_pairs(preds, refs)
    total = sum(
        max(1.0 if r.lower() in p.lower() else 0.0 for r in ref) for p, ref in zip(preds, refs)
    )
    return round(total / len(preds) * 100, 2)


def postprocess_pred(pred: str) -> str:
    """RULER's cleanup of a prediction before scoring (``scripts/eval/evaluate.py``
    ``postprocess_pred``): strip, turn every ASCII control character (U+0000 … U+001F) into a
    newline, strip again. Other characters, DEL and non-ASCII ones included, are kept; a
    control character inside a value therefore splits it and the value no longer matches."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()

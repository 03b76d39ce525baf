"""The haystacks of RULER's NIAH tasks: the essay (sentences of a text, needles at their
depths), the noise and the distractor-needle lines (needles at random lines), and the
per-unit token counts that aim the search for a haystack's size."""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Sequence

import numpy as np

from swax.core.errors import SwaxError
from swax.data.sources import kjv_documents
from swax.eval.ruler.needles import _draw, _draw_distinct, _WordKeys
from swax.eval.ruler.tasks import NEEDLE, NOISE, NiahTask

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

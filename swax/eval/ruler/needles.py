"""The needles of a RULER NIAH sample: keys and values of each kind (adjective-noun words,
7-digit numbers, UUIDs), drawn distinct, and which keys the question asks about."""

from __future__ import annotations

import functools
import random
import uuid
from dataclasses import dataclass

from swax.core.errors import SwaxError
from swax.data.synthetic import key_vocabulary
from swax.eval.ruler.tasks import NEEDLE, NEEDLE_TYPES, NiahTask


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

"""RULER records: :func:`generate_niah` draws each sample's needles, searches the largest
haystack whose prompt fits the length, and builds the record."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from swax.core.errors import SwaxError
from swax.eval.ruler.haystacks import (
    _Counts,
    _DistractorLines,
    _Essay,
    _essay,
    _EssayHaystack,
    _LineHaystack,
    _NoiseLines,
)
from swax.eval.ruler.needles import _draw_needles, _WordKeys
from swax.eval.ruler.tasks import ANSWER_PREFIX, DEPTHS, HAYSTACKS, NiahTask, _resolve_task


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

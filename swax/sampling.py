"""Sampling the next token: greedy, or from softmax(logits / temperature) restricted to the top-k
and to the nucleus of mass top-p; the one module that picks a token. The prefill's first token
comes from :func:`sample_next`; a decode step (:mod:`swax.decode`) picks in two halves, both
here: :func:`pick_in_step` inside the (compiled) step, the argmax or the distribution (one graph
for every value of temperature and top-p: they travel as a tensor), then :func:`pick_after_step`
outside it, the distribution's one draw from the caller's seeded generator. Both paths end in
:func:`greedy` or :func:`draw`."""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy (``temperature`` 0), or drawn from softmax(logits /
    temperature) restricted to the ``top_k`` most likely tokens and to the nucleus of mass
    ``top_p``. A compiled step depends on :attr:`mode` only: the temperature and top_p travel as
    a tensor (:meth:`values`), so a new value reuses the graph; k is a shape (``topk``), so
    each k is a mode of its own."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def mode(self) -> tuple[int | None, bool] | None:
        """None (greedy) or (k of a top-k restriction or None, restricted to a nucleus)."""
        if self.temperature == 0:
            return None
        return (self.top_k, self.top_p is not None and self.top_p < 1.0)

    def values(self, device) -> torch.Tensor:
        """(temperature, top_p) as a float32 tensor."""
        p = 1.0 if self.top_p is None else self.top_p
        return torch.tensor([self.temperature or 1.0, p], dtype=torch.float32, device=device)


def _nucleus(sorted_logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Logits sorted in descending order with -inf where the mass of the tokens before a token
    already reaches ``top_p``."""
    probs = sorted_logits.softmax(-1)
    return sorted_logits.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))


def probs_from(logits: torch.Tensor, mode: tuple[int | None, bool], values: torch.Tensor):
    """The distribution (B, vocab) float32 to draw from for ``mode`` (see :class:`Sampling`)
    with ``values`` (temperature, top_p): no shape depends on the values. With a top-k the
    nucleus is taken among the k candidates (``topk`` sorts them): no sort of the vocabulary."""
    logits = logits.float() / values[0]
    k, has_p = mode
    if k is not None and k < logits.shape[-1]:
        top, index = logits.topk(k, dim=-1)  # in descending order
        if has_p:
            top = _nucleus(top, values[1])
        return torch.full_like(logits, float("-inf")).scatter(-1, index, top).softmax(-1)
    if not has_p:
        return logits.softmax(-1)
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    sorted_logits = _nucleus(sorted_logits, values[1])
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits).softmax(-1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token ids (B,) of logits (B, vocab)."""
    return logits.argmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id (B,) per row drawn from ``probs`` (B, vocab) with ``generator``."""
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def pick_in_step(logits: torch.Tensor, mode, values: torch.Tensor) -> torch.Tensor:
    """The part of a pick a decode step computes (inside its graph): the ids (B,) for greedy
    decoding (``mode`` None), else the distribution (B, vocab) to draw them from
    (:func:`probs_from`)."""
    if mode is None:
        return greedy(logits)
    return probs_from(logits, mode, values)


def pick_after_step(
    out: torch.Tensor, mode, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The ids (B,) from what :func:`pick_in_step` returned: the greedy ids as they are, else
    one draw from the distribution with ``generator``."""
    if mode is None:
        return out
    return draw(out, generator)


def sampling_probs(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """The distribution (B, vocab) float32 that sampling draws from: softmax(logits /
    temperature) restricted to the top-k and to the nucleus of mass top_p (temperature > 0)."""
    sampling = Sampling(temperature, top_k, top_p)
    return probs_from(logits, sampling.mode, sampling.values(logits.device))


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (B,) from logits (B, vocab): greedy when temperature == 0, else sampling
    from softmax(logits / temperature) restricted to the top-k and to the nucleus of mass top_p."""
    if temperature == 0:
        return greedy(logits)
    return draw(sampling_probs(logits, temperature, top_k, top_p), generator)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the first invalid sampling option."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}"
        )
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")

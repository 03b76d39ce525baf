"""The record of one synthetic retrieval episode (needle or MQAR), shared by the generators,
the training loader and the recall evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swax.core.errors import SwaxError


@dataclass(frozen=True)
class Episode:
    """One episode of exactly ``len(tokens)`` tokens: context (haystack or filler with the
    needles), then the questions, each followed by its answer. Spans are (start, end) token
    positions, end excluded."""

    tokens: list[int]
    """Every token of the episode."""
    answer_spans: list[tuple[int, int]]
    """The answer of each question, in question order."""
    question_spans: list[tuple[int, int]]
    """Each question (in MQAR: the queried key)."""
    needle_span: tuple[int, int]
    """The first queried needle (in MQAR: the whole block of key-value pairs)."""
    needle_positions: list[int]
    """First token of every needle (MQAR: of every pair), the queried ones first, in order."""
    distance: int
    """Tokens between the end of ``needle_span`` and the first question."""
    depth: float
    """Start of the queried needle / context length, as RULER's depth."""
    keys: list
    """Every needle's key, the queried ones first (strings, or token ids for MQAR)."""
    values: list
    """Every needle's value, in the order of ``keys``."""
    reaches: list[int]
    """For each answer, in question order, the smallest attention window under which the
    position that predicts the answer's first token attends to its value's first token (the
    value is ``reach - 1`` tokens back): the answer is **inside window W** when ``reach <= W``
    (see :func:`reach`)."""

    @property
    def answer_span(self) -> tuple[int, int]:
        """The first answer."""
        return self.answer_spans[0]

    @property
    def question_span(self) -> tuple[int, int]:
        """The first question."""
        return self.question_spans[0]

    @property
    def key(self):
        """The first queried key."""
        return self.keys[0]

    @property
    def value(self):
        """The first queried key's value."""
        return self.values[0]


def reach(reader: int, value: int) -> int:
    """The smallest window W under which a query at position ``reader`` attends to the key at
    position ``value`` (``value <= reader``): sliding-window attention lets position t see
    t - W + 1 ... t (swax.ops.sliding_window_attention), so ``reader - value + 1``."""
    return reader - value + 1


def draw_distance(
    rng,
    cfg,
    max_distance: int,
    extra: tuple[int, int] = (0, 0),
    reach_range: tuple[int, int] | None = None,
) -> int:
    """The needle-to-question distance of one episode, at most ``max_distance`` (what the
    episode's length allows, already capped by ``cfg.max_distance``).

    ``extra`` = (least, most) of ``reach - distance`` over the episode's answers (fixed by the
    episode's layout: a value sits inside its needle, the question has some length): the
    generator's geometry, so that the draw can speak of windows.

    - ``reach_range`` (lo, hi): the nearest answer's reach (with one query: the answer's)
      uniform in [lo, hi] (clipped to what the episode allows); the evaluation's distance
      buckets use it.
    - ``cfg.far_share`` None: uniform in [cfg.min_distance, max_distance] (``distance_law:
      power``: P(d) ∝ (d - min_distance + 1)^-distance_power there, a heavy tail as Zoology's).
    - ``cfg.far_share`` set: with that probability a **far** episode, every answer beyond window
      ``cfg.far_from`` (reach > far_from), else a **near** one, every answer inside it
      (reach <= far_from); each uniform over the distances that allow it. An episode too short
      for a far distance is near; a window too short for a near one is an error.
    """
    lo = cfg.min_distance
    if reach_range is not None:
        a = max(lo, reach_range[0] - extra[0])
        b = min(max_distance, reach_range[1] - extra[0])
        if a > b:
            raise SwaxError(
                f"no distance in [{lo}, {max_distance}] gives a reach in {list(reach_range)}"
            )
        return int(rng.integers(a, b + 1))
    if cfg.far_share is None:
        return _draw_law(rng, cfg, lo, max_distance)
    if cfg.far_from is None:
        raise SwaxError(
            "data.synthetic.far_share needs far_from, the window that splits near from far "
            "(in training it defaults to window.long)"
        )
    near_hi = min(cfg.far_from - extra[1], max_distance)  # every answer inside far_from
    far_lo = cfg.far_from + 1 - extra[0]  # every answer beyond it
    if near_hi < lo:
        raise SwaxError(
            f"data.synthetic.far_from={cfg.far_from}: no episode has every answer inside it "
            f"(its answers reach at least {lo + extra[1]} tokens back with "
            f"min_distance={lo}); raise far_from or lower min_distance"
        )
    if far_lo <= max_distance and rng.random() < cfg.far_share:
        return int(rng.integers(max(far_lo, lo), max_distance + 1))
    return int(rng.integers(lo, near_hi + 1))


def _draw_law(rng, cfg, lo: int, hi: int) -> int:
    if cfg.distance_law == "uniform" or hi <= lo:
        return int(rng.integers(lo, hi + 1))
    x = np.arange(1, hi - lo + 2, dtype=np.float64)
    p = x ** (-cfg.distance_power)
    return lo + int(rng.choice(len(x), p=p / p.sum()))

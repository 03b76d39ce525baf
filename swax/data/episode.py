"""The record of one synthetic retrieval episode (needle or MQAR), shared by the generators,
the training loader and the recall evaluation."""

from __future__ import annotations

from dataclasses import dataclass


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


def draw_distance(rng, cfg, max_distance: int) -> int:
    """The needle-to-question distance of one episode, at most ``max_distance`` (what the
    episode's length allows, already capped by ``cfg.max_distance``): uniform in
    [cfg.min_distance, max_distance]; with ``cfg.far_share`` set, beyond ``cfg.far_from`` (uniform
    in (far_from, max_distance]) with that probability, else uniform in [min_distance,
    far_from]. Episodes too short to hold a far distance are near ones."""
    lo = cfg.min_distance
    if cfg.far_share is None:
        return int(rng.integers(lo, max_distance + 1))
    split = min(cfg.far_from, max_distance)
    far = rng.random() < cfg.far_share
    if far and max_distance > split:
        return int(rng.integers(split + 1, max_distance + 1))
    return int(rng.integers(lo, split + 1))

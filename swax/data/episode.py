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

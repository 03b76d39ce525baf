"""Markdown for the studies' reports: a table, and a number that may be missing."""

from __future__ import annotations


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines: the header, its rule, one line per row."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def fmt(x: float, digits: int = 0) -> str:
    """``x`` with ``digits`` decimals, or "–" when it is NaN (not measured)."""
    return "–" if x != x else f"{x:.{digits}f}"

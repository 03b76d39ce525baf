"""Progress of long work: a tqdm bar on a terminal, plain periodic lines anywhere else.

A bar redraws itself with carriage returns, which a log file or a pipe keeps as one long line of
debris. :func:`progress_bar` gives a tqdm bar only when the stream is a terminal; otherwise a
:class:`LineProgress` with the same small interface (``update``, ``set_postfix_str``, ``n``,
``write``, ``close``, a context manager) that prints one complete line at most every
``interval`` seconds (``$SWAX_PROGRESS_SECONDS``, default 30) and nothing for work that ends
sooner.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

INTERVAL_ENV = "SWAX_PROGRESS_SECONDS"
"""Seconds between two progress lines when the output is not a terminal (default 30)."""
DEFAULT_INTERVAL = 30.0


def line_interval() -> float:
    """The seconds between two plain progress lines: $SWAX_PROGRESS_SECONDS, else 30."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_INTERVAL
    except ValueError:
        value = DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def fmt_seconds(seconds: float) -> str:
    """``12 years`` / ``3d04h`` / ``1h02m`` / ``3m07s`` / ``12s``."""
    s = int(round(max(0.0, seconds)))
    if s >= 2 * 31_557_600:
        return f"{s / 31_557_600:,.0f} years"
    if s >= 2 * 86_400:
        return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def fmt_count(n: float) -> str:
    """A count with the unit that keeps three digits: ``950``, ``41.0k``, ``3.28M``, ``1.20B``."""
    n = float(n)
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            v = n / size
            return f"{v:.{2 if v < 10 else 1 if v < 100 else 0}f}{unit}"
    return f"{n:g}"


class LineProgress:
    """Progress as plain lines: ``desc: n/total unit (p%) | rate | ETA | postfix``, printed at
    most every ``interval`` seconds (never a partial line, never a carriage return)."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str,
        enabled: bool = True,
        initial: int = 0,
        file: TextIO | None = None,
        interval: float | None = None,
    ):
        self.total = total
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.n = initial
        self.file = file
        self.interval = line_interval() if interval is None else interval
        self.postfix = ""
        self._start_n = initial
        self._t0 = self._last = time.monotonic()

    def _stream(self) -> TextIO:
        return self.file or sys.stderr

    def line(self) -> str:
        """The progress line as it would be printed now."""
        elapsed = time.monotonic() - self._t0
        parts = [f"{self.desc}: {self.n:,}" + (f"/{self.total:,}" if self.total else "")]
        plural = len(self.unit) > 1 and not self.unit.endswith("s")
        parts[0] += f" {self.unit}" + ("s" if plural else "")
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        done = self.n - self._start_n
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            parts.append(f"{rate:,.1f} {self.unit}/s")
            if self.total:
                parts.append(f"ETA {fmt_seconds((self.total - self.n) / rate)}")
        if self.postfix:
            parts.append(self.postfix)
        return " | ".join(parts)

    def _maybe_print(self) -> None:
        now = time.monotonic()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            print(self.line(), file=self._stream(), flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        self._maybe_print()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        self._maybe_print()

    def write(self, text: str, file: TextIO | None = None) -> None:
        print(text, file=file or self._stream(), flush=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: bool = True,
    leave: bool = True,
    initial: int = 0,
    file: TextIO | None = None,
    **tqdm_options,
):
    """A tqdm bar when ``file`` (default stderr) is a terminal, else a :class:`LineProgress`.
    ``enabled=False``: nothing is shown either way (the object still counts); ``tqdm_options``
    (e.g. ``unit_scale``) reach the bar only."""
    stream = file or sys.stderr
    if not is_terminal(stream):
        return LineProgress(total, desc, unit, enabled=enabled, initial=initial, file=file)
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        disable=not enabled,
        leave=leave,
        initial=initial,
        file=stream,
        dynamic_ncols=True,
        **tqdm_options,
    )

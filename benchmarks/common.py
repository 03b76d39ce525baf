"""Shared helpers for the benchmark scripts: timing, the matmul ceiling, tables and CSV."""

from __future__ import annotations

import csv
import os
import platform
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timeit(
    fn: Callable[[], object], repeat: int = 3, warmup: int = 1, budget_s: float = 20.0
) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs; stops early once
    ``budget_s`` is spent (at least one timed run)."""
    return timeit_interleaved({"fn": fn}, repeat, warmup, budget_s)["fn"]


def timeit_interleaved(
    fns: dict[str, Callable[[], object]], repeat: int = 3, warmup: int = 1, budget_s: float = 60.0
) -> dict[str, float]:
    """Median seconds of each ``fn()``, measured in rounds that run every function once, so a
    slow spell of a shared machine hits the swax op and its references alike. Stops early once
    ``budget_s`` is spent (at least one round)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    for _ in range(repeat):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def matmul_gflops(n: int = 2048, dtype: torch.dtype = torch.float32, repeat: int = 5) -> float:
    """Measured GFLOP/s of an n×n×n matmul on this machine, now: the ceiling for the ops."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    t = timeit(lambda: a @ b, repeat=repeat, warmup=2)
    return 2 * n**3 / t / 1e9


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def machine_line() -> str:
    return (
        f"{platform.machine()} · {os.cpu_count()} cores visible · torch {torch.__version__} · "
        f"{torch.get_num_threads()} threads"
    )


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c, "")).rjust(widths[c]) for c in columns))


def save_png(path: str | Path, draw: Callable, title: str = "") -> Path | None:
    """Draw with ``draw(fig)`` and save a PNG (None, with a note, if matplotlib is missing)."""
    try:
        from swax.core.plotting import pyplot

        plt = pyplot()
    except ImportError:
        print("# matplotlib not installed: no PNG written")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=(11, 4.5))
    draw(fig)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_csv(rows: list[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)

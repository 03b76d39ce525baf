"""The results of ``swax eval niah`` (:class:`NiahResult`) and what is made of them: the
results folder (``results.json``, the CSV summaries, the heatmaps) and the terminal table."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from swax.core.plotting import format_length, pyplot
from swax.eval.niah.predictor import Timing
from swax.eval.ruler import TASKS

DEPTH_BINS = 10  # heatmap rows: needle depth in bins of 10%


@dataclass
class NiahResult:
    scores: dict[str, dict[int, float]] = field(default_factory=dict)
    nulls: dict[str, dict[int, int]] = field(default_factory=dict)
    by_depth: dict[str, dict[int, dict[int, list[float]]]] = field(default_factory=dict)
    samples: int = 0
    timing: dict[int, Timing] = field(default_factory=dict)
    """By length, over all tasks: the predictor's prefill and decode work (empty when the
    predictor does not report it)."""

    def average(self, length: int) -> float:
        vals = [s[length] for s in self.scores.values() if length in s]
        return sum(vals) / len(vals) if vals else float("nan")


def results_files() -> list[str]:
    """The files ``swax eval niah`` writes in its results folder (glob patterns relative to
    it; see :mod:`swax.eval.niah`): what ``--overwrite`` may replace."""

    return [
        "results.json",
        "summary.csv",
        "summary-[0-9]*.csv",
        *[f"heatmap-{t}.png" for t in TASKS],
        *[f"pred/{t}-[0-9]*.jsonl" for t in TASKS],
    ]


def _write_outputs(out: Path, r: NiahResult, tasks, lengths, settings: dict) -> None:
    data = {
        "settings": settings,
        "scores": {t: {str(n): s for n, s in v.items()} for t, v in r.scores.items()},
        "average": {str(n): r.average(n) for n in lengths},
        "nulls": {t: {str(n): s for n, s in v.items()} for t, v in r.nulls.items()},
        "throughput": {str(n): t.as_dict() for n, t in r.timing.items()},
        "by_depth": {
            t: {
                str(n): {str(b * 100 // DEPTH_BINS): sum(x) / len(x) for b, x in sorted(d.items())}
                for n, d in v.items()
            }
            for t, v in r.by_depth.items()
        },
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    with (out / "summary.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task", "length", "score", "nulls", "samples"])
        for t in tasks:
            for n in lengths:
                w.writerow([t, n, f"{r.scores[t][n]:.2f}", r.nulls[t][n], r.samples])
    for n in lengths:  # RULER's own summary layout, one file per length
        with (out / f"summary-{n}.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["Tasks", *tasks])
            w.writerow(["Score", *[f"{r.scores[t][n]:.2f}" for t in tasks]])
            w.writerow(["Nulls", *[f"{r.nulls[t][n]}/{r.samples}" for t in tasks]])
    heatmaps(out, r, tasks, lengths)


def format_table(r: NiahResult, tasks, lengths) -> str:
    """Tasks × lengths with the average row, as printed to the terminal."""
    head = ["task", *[_fmt_len(n) for n in lengths]]
    rows = [[t, *[f"{r.scores[t][n]:.1f}" for n in lengths]] for t in tasks]
    rows.append(["average", *[f"{r.average(n):.1f}" for n in lengths]])
    extra = []
    if r.timing:  # the model's speed, below the accuracy table
        for key, label in (("prefill", "prefill tok/s"), ("decode", "decode tok/s")):
            rates = [
                r.timing[n].as_dict()[f"{key}_tokens_per_s"] if n in r.timing else None
                for n in lengths
            ]
            extra.append([label, *["-" if x is None else _fmt_rate(x) for x in rates]])
    rows += extra
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
        for row in [head, *rows]
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1 - len(extra), "-" * len(lines[0]))
    if extra:
        lines.insert(len(lines) - len(extra), "-" * len(lines[0]))
    return "\n".join(lines)


def _fmt_rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.1f}"


def _fmt_len(n: int) -> str:

    return format_length(n) if n % 1024 == 0 else str(n)


def heatmaps(out: Path, r: NiahResult, tasks, lengths) -> list[Path]:
    """One PNG per task: accuracy by needle depth (rows) × length (columns)."""
    import numpy as np

    plt = pyplot()
    paths = []
    for t in tasks:
        grid = np.full((DEPTH_BINS, len(lengths)), np.nan)
        for j, n in enumerate(lengths):
            for b, xs in r.by_depth.get(t, {}).get(n, {}).items():
                grid[b, j] = sum(xs) / len(xs)
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 4.2))
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [_fmt_len(n) for n in lengths])
        ax.set_yticks(range(DEPTH_BINS), [f"{b * 100 // DEPTH_BINS}%" for b in range(DEPTH_BINS)])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(t)
        fig.colorbar(im, ax=ax, label="accuracy")
        fig.tight_layout()
        p = out / f"heatmap-{t}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths

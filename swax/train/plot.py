"""`swax plot-run RUN`: the loss curves of a run's ``metrics.jsonl`` drawn to a PNG.

The training loss is drawn per attention window when the run trained at several (a stochastic
or scheduled window: each step's record has its ``window``), one series per window, since the
loss at a short window and at a long one are not the same curve; each series is its steps'
losses (faint) with their running mean. The validation loss and the learning rate follow.
"""

from __future__ import annotations

import math
from pathlib import Path

from swax.core.errors import SwaxError
from swax.core.plotting import pyplot
from swax.data.jsonl import iter_jsonl


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``RUN/metrics.jsonl`` (an error when there are none)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SwaxError(f"{path} does not exist (is {run_dir} a swax run folder?)")
    records = [rec for _, rec in iter_jsonl(path)]
    if not records:
        raise SwaxError(f"{path} holds no metrics yet")
    return records


def _window_key(label: str) -> tuple:
    """Windows in increasing size: "64" < "512" < "64/512" (per layer) < "None" (full)."""
    parts = str(label).split("/")
    sizes = [
        math.inf if p in ("None", "full") else int(p) if p.isdigit() else math.inf for p in parts
    ]
    return (len(parts), sizes, str(label))


def _window_name(label: str) -> str:
    return "full" if str(label) in ("None", "full") else str(label)


def train_series(records: list[dict]) -> dict[str | None, tuple[list[int], list[float]]]:
    """{window: (steps, losses)} of the training steps, in increasing window; one entry with
    key None when the records do not name their window (a run from before the field)."""
    series: dict[str | None, tuple[list[int], list[float]]] = {}
    for r in records:
        if r.get("loss") is None:
            continue
        w = r.get("window")
        steps, losses = series.setdefault(None if w is None else str(w), ([], []))
        steps.append(r["step"])
        losses.append(r["loss"])
    if None in series and len(series) > 1:  # a run resumed across the change: no split
        merged = sorted((s, v) for ss, vs in series.values() for s, v in zip(ss, vs))
        return {None: ([s for s, _ in merged], [v for _, v in merged])}
    return dict(sorted(series.items(), key=lambda kv: _window_key(kv[0] or "")))


def _running_mean(v: list[float], k: int) -> list[float]:
    return [sum(v[max(0, i - k) : i + 1]) / len(v[max(0, i - k) : i + 1]) for i in range(len(v))]


def draw_run(ax, ax_lr, records: list[dict], title: str | None = None) -> None:
    """Draw the losses of ``records`` on ``ax`` (training loss per window, validation loss)
    and the learning rate on ``ax_lr``. The labelled lines of ``ax`` are the series of the
    legend: ``train loss[, window W] (mean of K)`` per window, ``validation loss``."""
    series = train_series(records)
    split = len(series) > 1
    for w, (s, v) in series.items():
        name = f"train loss, window {_window_name(w)}" if split else "train loss"
        k = max(1, len(v) // 50)
        (raw,) = ax.plot(s, v, lw=0.6, alpha=0.3)  # unlabelled: not in the legend
        ax.plot(
            s, _running_mean(v, k), lw=1.5, color=raw.get_color(), label=f"{name} (mean of {k + 1})"
        )
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if val:
        s, v = zip(*val)
        ax.plot(s, v, "o-", color="k", label="validation loss")
    ax.set_ylabel("loss (nats/token)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    if series or val:
        ax.legend()
    lr = [(r["step"], r["lr"]) for r in records if "lr" in r]
    if lr:
        s, v = zip(*lr)
        ax_lr.plot(s, v, color="tab:gray")
    ax_lr.set_ylabel("lr")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)


LAZY_SERIES = (
    ("lazy/inside_long", "inside the long window"),
    ("lazy/beyond_long", "beyond it, within T"),
    ("lazy/reset_beyond_long", "beyond it, recurrent state reset"),
    ("lazy/beyond_T", "beyond T"),
)
"""The laziness monitor's metrics (swax.train.monitor) that plot-run draws, with their legend."""


def draw_laziness(ax, records: list[dict]) -> bool:
    """Recall by distance (the laziness monitor's lazy/... metrics) against the step on ``ax``;
    False when the run has none."""
    drawn = False
    for key, label in LAZY_SERIES:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            s, v = zip(*pts)
            ax.plot(s, v, "o-", ms=3, label=label)
            drawn = True
    if drawn:
        ax.set_ylim(-3, 103)
        ax.set_ylabel("recall (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="laziness monitor", title_fontsize=8)
    return drawn


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the run's losses by step (see :func:`draw_run`) to ``out`` (default
    ``RUN/loss.png``), with the laziness monitor's recall by distance under them when the run
    logged it (``log.laziness_every``); returns the PNG's path."""

    records = read_metrics(run_dir)
    out = Path(out) if out else Path(run_dir) / "loss.png"
    plt = pyplot()
    lazy = any("lazy/inside_long" in r for r in records)
    fig, axes = plt.subplots(
        3 if lazy else 2,
        1,
        figsize=(8, 8.5 if lazy else 6),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 2, 1] if lazy else [3, 1]},
    )
    ax, ax_lr = axes[0], axes[-1]
    try:
        if lazy:
            draw_laziness(axes[1], records)
        draw_run(ax, ax_lr, records, f"swax run {Path(run_dir).name}")
        fig.tight_layout()
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out

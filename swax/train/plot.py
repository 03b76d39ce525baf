"""`swax plot-run RUN`: loss curves of a run's metrics.jsonl drawn to a PNG."""

from __future__ import annotations

from pathlib import Path

from swax.data.jsonl import iter_jsonl
from swax.errors import SwaxError
from swax.eval.plots import pyplot


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SwaxError(f"{path} does not exist (is {run_dir} a swax run folder?)")
    records = [rec for _, rec in iter_jsonl(path)]
    if not records:
        raise SwaxError(f"{path} holds no metrics yet")
    return records


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Training loss (with its running mean), validation loss and learning rate by step."""

    plt = pyplot()

    records = read_metrics(run_dir)
    out = Path(out) if out else Path(run_dir) / "loss.png"
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    lr = [(r["step"], r["lr"]) for r in records if "lr" in r]
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    if train:
        s, v = zip(*train)
        ax.plot(s, v, lw=0.6, alpha=0.4, label="train loss")
        k = max(1, len(v) // 50)
        smooth = [
            sum(v[max(0, i - k) : i + 1]) / len(v[max(0, i - k) : i + 1]) for i in range(len(v))
        ]
        ax.plot(s, smooth, lw=1.5, label=f"train loss (mean of {k + 1})")
    if val:
        s, v = zip(*val)
        ax.plot(s, v, "o-", label="validation loss")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"swax run {Path(run_dir).name}")
    ax.grid(alpha=0.3)
    ax.legend()
    if lr:
        s, v = zip(*lr)
        ax2.plot(s, v, color="tab:gray")
    ax2.set_ylabel("lr")
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out

"""swax plot-run: the loss curves of a run, the training loss split by attention window."""

import json

import pytest

from swax.cli import main


def _metrics(run, windows):
    """A metrics.jsonl as swax train writes it: one record per step (its window), validation
    records at steps 0, 4 and 8."""
    run.mkdir()
    recs = [{"step": 0, "val_loss": 5.0}]
    for step in range(1, 9):
        w = windows[(step - 1) % len(windows)]
        recs.append(
            {
                "step": step,
                "loss": 5.0 - 0.1 * step + (0.5 if w == "64" else 0.0),
                "lr": 1e-3,
                "window": w,
            }
        )
        if step in (4, 8):
            recs.append({"step": step, "val_loss": 4.8 - 0.1 * step})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures plot-run saves (their lines are inspected, not their pixels)."""
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def _series(fig):
    """{legend label: (xs, ys)} of the loss axes' labelled lines."""
    ax = fig.axes[0]
    return {
        ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
        for ln in ax.get_lines()
        if not ln.get_label().startswith("_")
    }


def test_plot_run_splits_the_training_loss_by_window(tmp_path, capsys, saved_figures):
    # a stochastic run's short- and long-window steps were drawn as one zigzag curve
    recs = _metrics(tmp_path / "run", ["64", "512"])
    assert main(["plot-run", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    series = _series(saved_figures[-1])
    train = {k: v for k, v in series.items() if k.startswith("train loss")}
    assert sorted(train) == [
        "train loss, window 512 (mean of 2)",
        "train loss, window 64 (mean of 2)",
    ]
    assert list(train) == [
        "train loss, window 64 (mean of 2)",
        "train loss, window 512 (mean of 2)",
    ]
    for label, (xs, _) in train.items():
        w = label.split("window ")[1].split(" ")[0]
        assert xs == [r["step"] for r in recs if r.get("window") == w]
    # the raw losses of each window are drawn too (unlabelled), and the validation loss kept
    raw = [ln for ln in saved_figures[-1].axes[0].get_lines() if ln.get_label().startswith("_")]
    assert sorted(list(ln.get_ydata()) for ln in raw) == sorted(
        [r["loss"] for r in recs if r.get("window") == w] for w in ("64", "512")
    )
    val = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
    assert series["validation loss"] == ([s for s, _ in val], [v for _, v in val])


def test_plot_run_with_one_window_has_one_training_series(tmp_path, capsys, saved_figures):
    _metrics(tmp_path / "run", ["128"])
    out = tmp_path / "plot.png"
    assert main(["plot-run", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    series = _series(saved_figures[-1])
    assert list(series) == ["train loss (mean of 2)", "validation loss"]
    assert series["validation loss"][0] == [0, 4, 8]

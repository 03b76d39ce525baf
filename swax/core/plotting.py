"""Line charts against a log₂ axis (context length or position), shared by the reports of
``swax eval`` and the experiments."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend: swax only writes figures to files, and Agg
    needs no display (a headless machine, a cluster node)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def format_length(n: float) -> str:
    """A token count or position as people write it: 512, 1k, 4k, 128k, 1M (2^20)."""
    n = float(n)
    for size, unit in ((2**20, "M"), (2**10, "k")):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def length_axis(ax) -> None:
    """A log₂ x axis of lengths labelled 512, 1k, 4k … (not 2⁹, 2¹⁰, 2¹²)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_length(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())


Series = dict[str, tuple]
"""{label: (xs, ys)} or {label: (xs, ys, errors)}; errors are drawn as error bars."""


def draw_curves(
    ax,
    series: Series,
    xlabel: str,
    ylabel: str,
    *,
    ylim: tuple[float, float] | None = None,
    hlines: Sequence[tuple[float, str]] = (),
    vlines: Sequence[tuple[float, str]] = (),
    legend_size: float | None = 8,
    title: str | None = None,
) -> None:
    """Draw ``series`` on ``ax`` with a log₂ x axis, a grid and (unless ``legend_size`` is
    None) a legend; ``hlines`` / ``vlines`` are dashed reference lines (value, label)."""
    for label, s in series.items():
        xs, ys = s[0], s[1]
        if len(s) > 2 and s[2] is not None:
            ax.errorbar(xs, ys, yerr=s[2], marker="o", capsize=2, label=label)
        else:
            ax.plot(xs, ys, "o-", label=label)
    for value, label in hlines:
        ax.axhline(value, color="k", ls="--", lw=1, label=label)
    for value, label in vlines:
        ax.axvline(value, color="gray", ls="--", label=label)
    length_axis(ax)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if legend_size is not None:
        ax.legend(fontsize=legend_size)


def save_curves(
    path: str | Path,
    series: Series,
    xlabel: str,
    ylabel: str,
    *,
    figsize: tuple[float, float] = (7, 4.2),
    **kwargs,
) -> Path:
    """One chart of ``series`` (see :func:`draw_curves` for ``kwargs``) saved as a PNG."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    draw_curves(ax, series, xlabel, ylabel, **kwargs)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)

"""The depth study's readings by reach and by distance, mean over each run's seeds: the copy
gain's and the planted key's tables, and the figure of both (REPORT.md's lower half)."""

from __future__ import annotations

import math
from pathlib import Path

from experiments.depth_study import rule as R
from experiments.lab.markdown import table

RANGES = ("r8_32", "r32_128", "r128_512", "r512_1024", "beyond_128", "beyond_256", "r1024_4096")
PAST = ("r8_32_pastT", "r32_128_pastT", "r128_512_pastT", "r512_1024_pastT")
LABELS = {
    "r8_32": "(8, 32]",
    "r32_128": "(32, 128]",
    "r128_512": "(128, 512]",
    "r512_1024": "(512, 1024]",
    "beyond_128": "(128, T]",
    "beyond_256": "(256, T]",
    "r1024_4096": "(T, 4T]",
}


def label(key: str) -> str:
    """A range key as the reports print it: "(8, 32]", "(8, 32] past T"."""
    base = key.removesuffix("_pastT")
    return LABELS.get(base, base) + (" past T" if key != base else "")


def gain_table(runs: dict, names: list[str], keys=RANGES) -> list[str]:
    """Mean E per range over the seeds of each run (min–max over seeds)."""
    head = ["run", "seeds"] + [label(k) for k in keys]
    rows = []
    for name in names:
        recs = runs.get(name, {})
        if not recs:
            continue
        cells = []
        for k in keys:
            vals = [R.mean(R.excess(r, k)) for r in recs.values()]
            vals = [v for v in vals if not math.isnan(v)]
            cells.append(
                f"{sum(vals) / len(vals):+.4f} ({min(vals):+.3f}…{max(vals):+.3f})" if vals else "–"
            )
        rows.append([name, str(len(recs)), *cells])
    return table(head, rows)


def passkey_table(runs: dict, names: list[str]) -> list[str]:
    """Retrieval by distance, pooled over each run's seeds (Wilson interval)."""
    dists = sorted(
        {
            r["distance"]
            for recs in runs.values()
            for rec in recs.values()
            for r in rec.get("passkey", {}).get("rows", [])
        }
    )
    head = ["run", *[str(d) for d in dists]]
    rows = []
    for name in names:
        recs = runs.get(name, {})
        if recs:
            cells = []
            for d in dists:
                p = {"k": 0, "n": 0}
                for rec in recs.values():
                    q = R.pooled(rec, (d,))
                    p = {"k": p["k"] + q["k"], "n": p["n"] + q["n"]}
                cells.append(f"{100 * p['k'] / p['n']:.1f}" if p["n"] else "–")
            rows.append([name, *cells])
    return table(head, rows)


def key_gains(recs: dict, probe: str | None = None) -> dict:
    """{distance: the key gain (nats per key byte) averaged over the seeds that have it},
    read as measured or, with ``probe``, with the window cut or the memory reset."""
    by_d: dict = {}
    for rec in recs.values():
        for r in rec.get("passkey", {}).get("rows", []):
            g = r.get("probes", {}).get(probe, {}).get("gain") if probe else r.get("gain")
            if g and g.get("n"):
                by_d.setdefault(r["distance"], []).append(g["mean"])
    return {d: sum(v) / len(v) for d, v in sorted(by_d.items())}


def _mean(vals: list[float]) -> str:
    return f"{sum(vals) / len(vals):.4f} ({min(vals):.3f}…{max(vals):.3f})" if vals else "–"


def loss_table(runs: dict, names: list[str]) -> list[str]:
    """Held-out text loss (nats per byte) of each run, mean over its seeds (min…max): with its
    own window (claim 3's quality reading), and read at W = 8 and W = 128 where the run
    recorded them."""
    head = ["run", "seeds", "own window", "read at W = 8", "read at W = 128"]
    rows = []
    for name in names:
        recs = runs.get(name, {})
        if not recs:
            continue
        own = [r["text_val_loss"] for r in recs.values() if "text_val_loss" in r]
        at = {w: [] for w in (8, 128)}
        for r in recs.values():
            for k, loss in r.get("text_loss", {}).items():
                w = r.get("windows", {}).get(k)
                if w in at:
                    at[w].append(loss)
        rows.append([name, str(len(recs)), _mean(own), _mean(at[8]), _mean(at[128])])
    return table(head, rows)


def loss_gaps(runs: dict, family: str) -> list[str]:
    """Per seed of one family: loss(short) − loss(long) and loss(stoch) − loss(long), each at
    its own window (the paired differences claim 3's quality half reads)."""
    f = family.lower()
    short, long, stoch = (runs.get(f"{f}-{r}", {}) for r in ("short", "long", "stoch"))
    rows = []
    for s in sorted(long):
        cells = []
        for other in (short, stoch):
            gap = R.loss_gap(other.get(s), long[s])
            cells.append("–" if gap is None else f"{gap:+.4f}")
        rows.append([family, str(s), *cells])
    return rows


def control_losses(runs: dict) -> tuple[float, float] | None:
    """The lowest and highest control loss on the key (nats per key byte) over every run,
    seed and distance: the most a key gain can be."""
    vals = [
        r["control_nll"]
        for recs in runs.values()
        for rec in recs.values()
        for r in rec.get("passkey", {}).get("rows", [])
        if "control_nll" in r
    ]
    return (min(vals), max(vals)) if vals else None


PROBES = (("window_cut", "window cut to 8"), ("reset", "memory reset"))


def key_gain_table(runs: dict, names: list[str]) -> list[str]:
    """The planted key's gain by distance, mean over each run's seeds, and under the probes
    (read at d ≤ T): who carries the key, attention (the cut takes it) or the memory (the
    reset does)."""
    rows, dists = [], set()
    for name in names:
        recs = runs.get(name, {})
        read = {
            what: {d: f"{v:+.4f}" for d, v in key_gains(recs, probe).items()}
            for probe, what in ((None, ""), *PROBES)
        }
        for what, g in read.items():
            if g and not (what and all(g[d] == read[""].get(d) for d in g)):
                rows.append((f"{name}{': ' + what if what else ''}", g))
                dists |= set(g)
    dists = sorted(dists)
    cells = [[n, *(g.get(d, "–") for d in dists)] for n, g in rows]
    return table(["run", *[str(d) for d in dists]], cells)


def figure(runs: dict, path: Path) -> Path:
    """depth_study.png: E by reach (left) and the key gain by distance (right; dashed: with
    the memory reset, i.e. attention alone) for each main and reference run, mean over seeds;
    symmetric-log y axes (linear below 1e-3), the windows 8 and 128 and T marked."""
    from swax.core.plotting import pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = ("r8_32", "r32_128", "r128_512", "r512_1024", "r1024_4096")
    mids = [math.prod(map(int, k[1:].split("_"))) ** 0.5 for k in keys]  # geometric middles
    for i, (name, recs) in enumerate(runs.items()):
        color = f"C{i % 10}"
        pts = [(x, [R.mean(R.excess(r, k)) for r in recs.values()]) for x, k in zip(mids, keys)]
        pts = [(x, sum(v) / len(v)) for x, v in pts if v and not any(map(math.isnan, v))]
        if pts:
            a.plot(*zip(*pts), "o-", color=color, label=f"{name} ({len(recs)})")
        g = key_gains(recs)
        if g:
            b.plot(list(g), list(g.values()), "o-", color=color, label=name)
        z = key_gains(recs, "reset")
        if z:
            b.plot(list(z), list(z.values()), "x--", color=color, lw=1)
    for ax, what in ((a, "reach (bytes)"), (b, "distance d of the planted key (bytes)")):
        for w in (8, 128):
            ax.axvline(w, color="gray", ls=":", lw=1)
        ax.axvline(1024, color="k", ls="--", lw=1)
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_ylim(bottom=-3e-3)
        ax.set_xlabel(f"{what}; dotted: W = 8, 128; dashed: T")
        ax.grid(alpha=0.3)
    a.set_ylabel("E: copy gain above the placebo (nats)")
    b.set_ylabel("key gain (nats per key byte)")
    a.legend(fontsize=7, title="run (seeds)", title_fontsize=7)
    b.legend(fontsize=7, title="x--: memory reset", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

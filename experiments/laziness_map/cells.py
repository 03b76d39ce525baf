"""The laziness map's reading: its cells (long window W × far share ρ) from the committed
per-run results, the lazy share of each with its Jeffreys interval, and ρ*(W/T), the far share
at which half the seeds stay lazy, with its interval. The map of record is the rerun on clean
episode ids (laziness_clean.yaml) once every one of its runs is archived, the first map
(laziness.yaml, old ids) until then. The text study and the regime's reading read the map
through these functions.

A run is read by distance bucket (experiments.lab.recall): it is **lazy** when it recalls
>= 90 % inside W and within 10 points of chance beyond it. rho*(W/T) is linear between the two
measured shares that straddle one half; its interval comes from the cells' Jeffreys posteriors
(RHO_METHOD).
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
from pathlib import Path

from experiments.lab import provenance as P
from experiments.lab.markdown import table as _table
from experiments.lab.recall import record
from experiments.lab.stats import jeffreys
from swax.sweep import archive_path, grid_seeds, load_sweep

HERE = Path(__file__).resolve().parent

WINDOW_AXIS = "window.fixed+window.long"
SHARE_AXIS = "data.synthetic.far_share"
LAW_AXIS = "data.synthetic.distance_law"


def column(point: dict) -> str:
    """The map's column of a grid point: the far share in %, uniform or power."""
    share = point[SHARE_AXIS]
    if share is None:
        return point.get(LAW_AXIS, "uniform")
    return f"{100 * share:g}%"


def columns(cfg) -> list[str]:
    out = []
    for point in cfg.grid_points.values():
        c = column(point)
        if c not in out:
            out.append(c)
    return sorted(out, key=lambda c: (not c.endswith("%"), float(c[:-1]) if c[-1] == "%" else 0))


def point_seeds(cfg, name: str) -> list[int]:
    """The seeds of grid point ``name``: the grid's, and the sweep's too when the point is a run
    of the sweep (laziness_clean.yaml's 0 % cells have seeds 0-4)."""
    seeds = set(grid_seeds(cfg))
    if name in cfg.aliases:
        seeds |= set(cfg.seeds)
    return sorted(seeds)


def planned(cfg) -> int:
    return sum(len(point_seeds(cfg, name)) for name in cfg.grid_points)


def load_cells(cfg) -> dict[tuple[int, str], list[dict]]:
    """{(W, column): [one record per archived seed]}: the seed, the verdict's numbers, the
    probes beyond W within T, the text loss, the run's training time and its episode ids
    ("ids"); a SwaxError when the archive mixes id ranges (provenance.one_range)."""
    cells: dict[tuple[int, str], list[dict]] = {}
    seen = []
    for name, point in cfg.grid_points.items():
        key = (point[WINDOW_AXIS], column(point))
        for seed in point_seeds(cfg, name):
            path = archive_path(cfg, name, seed)
            if path is None or not path.is_file():
                continue
            ev = json.loads(path.read_text())
            ids = P.run_ids(ev, cfg, cfg.aliases.get(name, name), seed)
            cells.setdefault(key, []).append({**record(ev, seed), "ids": ids})
            seen.append((cfg.aliases.get(name, name), seed, ids))
    P.one_range(seen, os.path.relpath(cfg.archive, HERE) if cfg.archive else cfg.name)
    return cells


def ids_of(cells) -> dict | None:
    """The one episode id range of a map's runs (load_cells checked that there is one)."""
    return next((r["ids"] for recs in cells.values() for r in recs if r.get("ids")), None)


def lazy_share(recs: list[dict]) -> float:
    return sum(r["kind"] == "lazy" for r in recs) / len(recs) if recs else math.nan


def rho_star(shares: list[tuple[float, float]]) -> str:
    """rho* from (far share, lazy share of the seeds) in increasing far share: where the lazy
    share crosses one half, linear between the two shares around it."""
    if not shares:
        return "–"
    (r0, f0), rest = shares[0], shares[1:]
    if f0 <= 0.5:
        return f"≤ {100 * r0:g}% (half the seeds or fewer lazy already at {100 * r0:g}%)"
    for r1, f1 in rest:
        if f1 <= 0.5:
            x = r0 + (f0 - 0.5) / (f0 - f1) * (r1 - r0)
            return f"{100 * x:.3g}% (between {100 * r0:g}% and {100 * r1:g}%)"
        r0, f0 = r1, f1
    return f"> {100 * r0:g}% (more than half the seeds lazy at every measured share)"


def rho_star_value(shares: list[tuple[float, float]]) -> float:
    """rho* as a number (see :func:`rho_star`): the first measured share when half the seeds or
    fewer are lazy there already, +inf when more than half are lazy at every share."""
    if not shares:
        return math.nan
    (r0, f0), rest = shares[0], shares[1:]
    if f0 <= 0.5:
        return r0
    for r1, f1 in rest:
        if f1 <= 0.5:
            return r0 + (f0 - 0.5) / (f0 - f1) * (r1 - r0)
        r0, f0 = r1, f1
    return math.inf


POSTERIOR_DRAWS = 20_000
"""Joint draws of the cells' Jeffreys posteriors behind rho*'s interval."""
RHO_METHOD = (
    "ρ*'s 95 % interval: each cell's lazy share drawn from its Jeffreys posterior "
    "Beta(k + ½, n − k + ½), independently per cell, and ρ* recomputed from the drawn shares by "
    f"the same crossing rule, {POSTERIOR_DRAWS:,} times; the interval is the 2.5 and 97.5 "
    "percentiles. Why this and not a bootstrap over seeds: resampling 3 seeds leaves every 3/3 "
    "and 0/3 cell as it is, so the bootstrap interval can only move where a cell is split and "
    "comes out as narrow as the handful of values it can produce; a posterior per cell keeps "
    "what 3 seeds cannot exclude (3 of 3 lazy is compatible with a lazy share of 46 %). A "
    "monotone logistic fit over ρ would impose a shape on six unevenly spaced shares; the "
    "per-cell posterior needs none"
)


def rho_star_interval(cells, w: int, cols: list[str], seed: int = 0) -> tuple[float, float]:
    """95 % interval of rho* for row ``w`` (RHO_METHOD): the cells' Jeffreys posteriors
    drawn jointly, rho* recomputed from each draw; +inf where it lies beyond the largest
    share."""
    data = tuple(
        (float(c[:-1]) / 100, sum(r["kind"] == "lazy" for r in cells[(w, c)]), len(cells[(w, c)]))
        for c in cols
        if c.endswith("%") and (w, c) in cells
    )
    return rho_star_posterior(data, POSTERIOR_DRAWS, seed)


@functools.lru_cache(maxsize=64)
def rho_star_posterior(data: tuple, draws: int, seed: int = 0, qs=(0.025, 0.975)) -> tuple:
    """The ``qs`` quantiles (default: the 2.5 and 97.5 percentiles) of rho* over ``draws``
    joint draws of the shares Beta(k + 1/2, n - k + 1/2) of ``data`` ((far share, lazy seeds
    k, seeds n) in increasing far share)."""
    if not data:
        return tuple(math.nan for _ in qs)
    rng = random.Random(seed)
    out = sorted(
        rho_star_value([(rho, rng.betavariate(k + 0.5, n - k + 0.5)) for rho, k, n in data])
        for _ in range(draws)
    )
    return tuple(out[int(q * (draws - 1))] for q in qs)


def _jeffreys(k: int, n: int) -> str:
    lo, hi = jeffreys(k, n)
    return f"{lo:.0f}–{hi:.0f}"


def interval_text(lo: float, hi: float) -> str:
    def pct(x):
        return "> the largest share" if x == math.inf else f"{100 * x:.3g}%"

    return f"[{pct(lo)}, {pct(hi)}]"


def share_table(cfg, cells) -> list[str]:
    """Lazy seeds / archived seeds per cell, and rho* per row (markdown lines)."""
    seq_len = cfg.base["seq_len"]
    cols = columns(cfg)
    head = (
        ["long window W"]
        + cols
        + ["ρ* (half the seeds lazy)", "ρ* 95 % interval (Jeffreys posterior per cell)"]
    )
    body = []
    for w in sorted(cfg.grid.axes[WINDOW_AXIS]):
        row = [f"{w} (T/{seq_len // w})"]
        for c in cols:
            recs = cells.get((w, c), [])
            k = sum(r["kind"] == "lazy" for r in recs)
            row.append(f"{k}/{len(recs)} [{_jeffreys(k, len(recs))}]" if recs else "–")
        numeric = [
            (float(c[:-1]) / 100, lazy_share(cells[(w, c)]))
            for c in cols
            if c.endswith("%") and (w, c) in cells
        ]
        row.append(rho_star(numeric))
        row.append(interval_text(*rho_star_interval(cells, w, cols)) if numeric else "–")
        body.append(row)
    return _table(head, body)


OLD_MAP, CLEAN_MAP = "laziness.yaml", "laziness_clean.yaml"
"""The map made on old episode ids (72 runs, archived) and its rerun on clean ids."""


def map_of_record(old=None, clean=None) -> tuple:
    """(config name, config, cells, pending): the clean-id map once every one of its runs is
    archived; until then the old-id map, with the clean one as ``pending`` (config, cells).
    ``old`` and ``clean``: the two sweeps (default: OLD_MAP and CLEAN_MAP here)."""
    clean = clean or load_sweep(HERE / CLEAN_MAP)
    clean_cells = load_cells(clean)
    if sum(len(v) for v in clean_cells.values()) >= planned(clean):
        return CLEAN_MAP, clean, clean_cells, None
    old = old or load_sweep(HERE / OLD_MAP)
    return OLD_MAP, old, load_cells(old), (clean, clean_cells)


def ids_line(cells, pending) -> str:
    """What episode ids the map's runs used, and the rerun's state while it is pending."""
    ids = ids_of(cells)
    line = f"The map's runs used {P.label(ids)}"
    if ids and not ids["recorded"]:
        line += (
            "; these results predate the field that records the ids (regime_study/NOTES.md "
            "section 8)"
        )
    if pending is None:
        return line + "."
    pcfg, pcells = pending
    return (
        line + f". The rerun on clean ids ({CLEAN_MAP}: the same cells, 3 seeds, the 0 % "
        f"cells with 5) is pending: {sum(len(v) for v in pcells.values())} of "
        f"{planned(pcfg)} runs archived. Until it is complete this map is the old-id one."
    )


def numeric_columns(cells, w: int) -> list[str]:
    """The far-share columns ("0%", "0.5%", ...) that row ``w`` has, in increasing share."""
    cols = [c for ww, c in cells if ww == w and c.endswith("%")]
    return sorted(cols, key=lambda c: float(c[:-1]))


def rho_by_row(cells) -> dict[int, str]:
    """rho* per long window W of the map: the far share at which half the seeds stay lazy."""
    return {
        w: rho_star(
            [(float(c[:-1]) / 100, lazy_share(cells[(w, c)])) for c in numeric_columns(cells, w)]
        )
        for w in sorted({w for w, _ in cells})
    }


def rho_intervals(cells) -> dict[int, tuple[float, float]]:
    return {
        w: rho_star_interval(cells, w, numeric_columns(cells, w))
        for w in sorted({w for w, _ in cells})
    }

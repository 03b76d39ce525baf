"""The laziness map: train the missing cells, then write LAZINESS.md from the committed results.

    python experiments/regime_study/laziness.py             # the report from the archives
    python experiments/regime_study/laziness.py --config laziness_clean.yaml --run --jobs 2
                                                            # the rerun on clean episode ids
    python experiments/regime_study/laziness.py --quick --run --report-dir DIR   # CI smoke test

Each cell of ``laziness.yaml`` is SWAX trained with a fixed window W (the row) on episodes of
which a share rho has its answer beyond W (every other answer inside W, "inside" as the
attention mask defines it). Every finished run leaves ``results/<archive>/NAME/seedS.json``
(committed); this script reads them and nothing else, so the report is rebuilt from committed
files, and a cell with fewer seeds than the config asks is reported with the seeds it has.
``laziness.yaml``'s runs used episode ids that the text also holds (128-175);
``laziness_clean.yaml`` is the same map on ids after the tokenizer's vocabulary, with 5 seeds in
the 0 % cells. LAZINESS.md shows the clean map once all its runs are archived, the old one
(saying so) until then; a map whose runs mix id ranges is refused (provenance.py).

A run is read by distance bucket (swax.probes.buckets): recall inside W, beyond W within the
training length T, beyond T, with the window cut to W_short and the recurrent state reset. It is
**lazy** when it recalls >= 90 % inside W and within 10 points of chance beyond it. Each cell's
lazy share carries its Jeffreys interval; rho*(W/T) is the far share at which half the seeds
stay lazy (linear between the two measured shares that straddle one half), with an interval
from the cells' Jeffreys posteriors (RHO_METHOD).
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from studycli import prepare, run, update_readme  # noqa: E402

from swax.core.plotting import pyplot  # noqa: E402
from swax.sweep import archive_path, grid_seeds, load_sweep  # noqa: E402

WINDOW_AXIS = "window.fixed+window.long"
SHARE_AXIS = "data.synthetic.far_share"
LAW_AXIS = "data.synthetic.distance_law"
REPORT = "LAZINESS.md"


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
    import provenance as P

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


def record(ev: dict, seed: int) -> dict:
    T = ev["seq_len"]
    rows = ev["buckets"]
    mid = [r for r in rows if not r["inside_long"] and r["hi"] <= T]
    inner = [r for r in rows if r["inside_long"] and r["lo"] > 0]  # (W_short, W]

    def pooled(sel, probe=None):
        src = [r["probes"][probe] if probe else r for r in sel]
        n = sum(r["n"] for r in src)
        return 100 * sum(r["correct"] for r in src) / n if n else math.nan

    lz = ev["laziness"]
    T_far = [r for r in rows if r["lo"] >= T]

    def counts(sel):
        return [sum(r["correct"] for r in sel), sum(r["n"] for r in sel)]

    return {
        "counts": {
            "inside": counts([r for r in rows if r["inside_long"]]),
            "beyond": counts(mid),
            "beyond_T": counts(T_far),
        },
        "emergence": ev.get("emergence", {}).get("points", []),
        "curve": ev.get("curve", []),
        "seed": seed,
        "inside": lz["inside_long"],
        "beyond": lz["beyond_long"],
        "beyond_T": lz["beyond_T"],
        "cut_inner": pooled(inner, "window_cut"),
        "reset_beyond": pooled(mid, "reset"),
        "kind": lz["kind"],
        "chance": lz["chance"],
        "n_beyond": sum(r["n"] for r in mid),
        "text": ev.get("text_val_loss", math.nan),
        "text_short_read": ev.get("text_loss", {}).get("train", math.nan),
        "minutes": (ev.get("summary", {}).get("elapsed") or math.nan) / 60,
        "emerged": emerged(ev),
        "tokens": ev.get("summary", {}).get("tokens"),
    }


def emerged(ev: dict) -> float:
    """Training tokens (millions) at the first kept checkpoint whose recall at 1× the training
    length (uniform distances, most answers beyond the window) reached 50 %: when the memory
    emerged; NaN if it did not within the run."""
    for point in ev.get("curve", []):
        if max(point["acc"].values()) >= 50:
            return point["tokens"] / 1e6
    return math.nan


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
    from stats import jeffreys

    lo, hi = jeffreys(k, n)
    return f"{lo:.0f}–{hi:.0f}"


def interval_text(lo: float, hi: float) -> str:
    def pct(x):
        return "> the largest share" if x == math.inf else f"{100 * x:.3g}%"

    return f"[{pct(lo)}, {pct(hi)}]"


def fmt(x: float, digits: int = 0) -> str:
    return "–" if x != x else f"{x:.{digits}f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def figure(cfg, cells, out: Path, seq_len: int) -> str:
    plt = pyplot()
    cols = columns(cfg)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for w in sorted(cfg.grid.axes[WINDOW_AXIS]):
        xs = [i for i, c in enumerate(cols) if (w, c) in cells]
        ys = [100 * lazy_share(cells[(w, cols[i])]) for i in xs]
        if xs:
            ax.plot(xs, ys, "o-", label=f"W = {w} (T/{seq_len // w})")
    ax.axhline(50, color="0.6", lw=0.8, ls="--")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_ylim(-5, 105)
    ax.set_xlabel("training answers beyond the long window W")
    ax.set_ylabel("seeds that end lazy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = "laziness_share.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _wilson(r: dict, key: str) -> str:
    """Recall with its 95 % Wilson interval, from the run's counts."""
    from swax.probes.buckets import wilson

    k, n = r["counts"][key]
    if not n:
        return "–"
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.0f} [{lo:.0f}–{hi:.0f}]"


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


STUDIES_PAGE = ROOT / "docs" / "studies.md"
"""The page whose laziness-map block this script rewrites."""
README_BEGIN = "<!-- laziness-map:begin (written by experiments/regime_study/laziness.py) -->"
README_END = "<!-- laziness-map:end -->"


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
    import provenance as P

    ids = ids_of(cells)
    line = f"The map's runs used {P.label(ids)}"
    if ids and not ids["recorded"]:
        line += "; these results predate the field that records the ids (NOTES.md section 8)"
    if pending is None:
        return line + "."
    pcfg, pcells = pending
    return (
        line + f". The rerun on clean ids ({CLEAN_MAP}: the same cells, 3 seeds, the 0 % "
        f"cells with 5) is pending: {sum(len(v) for v in pcells.values())} of "
        f"{planned(pcfg)} runs archived. Until it is complete this map is the old-id one."
    )


def readme_block(cfg, cells, pending=None, name: str = OLD_MAP) -> str:
    done = sum(len(v) for v in cells.values())
    lines = [
        f"Laziness map, {done} of the {planned(cfg)} runs {name} lists"
        + (" (a cell marked – is not run yet)" if done < planned(cfg) else "")
        + ": seeds that end lazy / seeds run [95 % Jeffreys interval], per long window (row) "
        "and share of training answers beyond it (column). " + ids_line(cells, pending),
        "",
        *share_table(cfg, cells),
    ]
    return "\n".join(lines)


def write_report(cfg, cells, out: Path, command: str, pending=None, name: str = OLD_MAP) -> Path:
    any_rec = next(iter(cells.values()))[0] if cells else None
    seq_len = cfg.base["seq_len"]
    cols = columns(cfg)
    rows_w = sorted(cfg.grid.axes[WINDOW_AXIS])
    done = sum(len(v) for v in cells.values())
    lines = [
        "# The laziness map",
        "",
        f"Generated by `{command}` from the committed per-run results in "
        f"`{os.path.relpath(cfg.archive, HERE) if cfg.archive else '–'}`; nothing below is "
        "typed by hand. The design and every attempt are in [NOTES.md](NOTES.md).",
        "",
        ids_line(cells, pending),
        "",
        f"- runs: {done} of {planned(cfg)} planned ({len(cfg.grid_points)} cells × seeds "
        f"{grid_seeds(cfg)}"
        + (f", seeds {cfg.seeds} where a cell is a run of the sweep" if cfg.aliases else "")
        + "); cells with fewer seeds show the seeds they have;",
        f"- model: SWAX (SX, 2 layers, d_model {cfg.base['model']['d_model']}), training "
        f"length T = {seq_len}, {cfg.base['steps']} steps × {cfg.base['batch_size']} sequences "
        f"({cfg.base['steps'] * cfg.base['batch_size'] * seq_len / 1e6:.1f}M tokens), "
        f"lr {cfg.base['optim']['lr']:g} {cfg.base['optim']['schedule']};",
        "- data: 10% KJV text (every byte a target), 90% one-pair recall episodes (keys, values "
        "and filler from 16 ids each; only the answer is a target);",
        "- the window W of a row is the run's fixed training window and its long window; the "
        "column is the share of training episodes whose answer lies **beyond W** (the question "
        "does not attend to the value under the attention mask); every other answer lies "
        "inside W. `uniform`: distances uniform over what the sequence allows; `power`: "
        "P(d) ∝ (d − 1)^−1, a heavy tail like text's;",
        "- read at the run's window W, by distance bucket with 64 episodes each (reach = the "
        "window an answer needs): inside W = (0, W], beyond W = (W, T], beyond T = (T, 16T]; "
        "`cut` is recall in (W_short, W] with the window cut to W_short = 8 (attention cannot "
        "see the value), `reset` recall in (W, T] with the recurrent state emptied before the "
        "question (attention alone);",
        "- **lazy**: ≥ 90% inside W and at most 10 points above chance (6.25%) beyond it. "
        "**memory**: ≥ 50% beyond W. **none**: < 50% inside W. Else **partial**.",
        "",
        "## Share of seeds that end lazy",
        "",
        "Lazy seeds / seeds run, with the share's 95 % Jeffreys interval in brackets (the "
        "equal-tailed interval of the Beta(k + ½, n − k + ½) posterior). ρ* is the far share at "
        "which the lazy share crosses one half, linear between the two measured shares around "
        f"it. {RHO_METHOD}. Recall in the table of every run carries its 95 % Wilson interval.",
        "",
    ]
    lines += share_table(cfg, cells) + [""]
    if pending is not None and pending[1]:
        lines += ["### The rerun on clean ids so far", "", *share_table(*pending), ""]
    if cells:
        lines += [f"![share of lazy seeds]({figure(cfg, cells, out, seq_len)})", ""]
    found = [r["emerged"] for recs in cells.values() for r in recs if r["emerged"] == r["emerged"]]
    latest = max(found) if found else math.nan
    lines += [
        "## Every run",
        "",
        "Recall (%) per seed. `n beyond` is the number of answers in (W, T]. `memory at`: the "
        "training tokens at the first checkpoint (every 2M) where recall at 1× T over uniform "
        "distances (most answers beyond W) reached 50 %, a first crossing on 32 episodes (not "
        "the censored emergence time of CLAIMS.md, which these runs' curves cannot give). The "
        f"latest such crossing among these runs came at {fmt(latest, 1)}M of "
        f"{cfg.base['steps'] * cfg.base['batch_size'] * seq_len / 1e6:.1f}M tokens, so a lazy "
        "verdict here means lazy *within this budget*; the claims study trains 3× longer.",
        "",
    ]
    head = [
        "W",
        "far",
        "seed",
        "inside W",
        "beyond W",
        "beyond T",
        "cut",
        "reset",
        "n beyond",
        "verdict",
        "memory at (M tokens)",
        "text loss",
        "train min",
    ]
    body = []
    for w in rows_w:
        for c in cols:
            for r in sorted(cells.get((w, c), []), key=lambda r: r["seed"]):
                body.append(
                    [
                        str(w),
                        c,
                        str(r["seed"]),
                        _wilson(r, "inside"),
                        _wilson(r, "beyond"),
                        _wilson(r, "beyond_T"),
                        fmt(r["cut_inner"]),
                        fmt(r["reset_beyond"]),
                        str(r["n_beyond"]),
                        r["kind"],
                        fmt(r["emerged"], 1),
                        fmt(r["text"], 3),
                        fmt(r["minutes"], 1),
                    ]
                )
    lines += _table(head, body) + [""]
    if any_rec is None:
        lines += ["No run has finished yet.", ""]
    lines += ["## Config", "", "```yaml", (HERE / name).read_text().rstrip(), "```", ""]
    path = out / REPORT
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    cfg, args, out, command = prepare(Path(__file__).name, __doc__, OLD_MAP, REPORT, argv)
    if args.quick:  # the smoke test reports its own runs
        print(f"report: {write_report(cfg, load_cells(cfg), out, command, name=args.config)}")
        return 0
    name, cfg, cells, pending = map_of_record()
    command = f"python experiments/regime_study/{Path(__file__).name}"
    print(f"report: {write_report(cfg, cells, out, command, pending, name)}")
    if args.report_dir is None:
        block = readme_block(cfg, cells, pending, name)
        if update_readme(STUDIES_PAGE, README_BEGIN, README_END, block):
            print(f"{STUDIES_PAGE.relative_to(ROOT)}: laziness map updated")
    return 0


if __name__ == "__main__":
    run(main)

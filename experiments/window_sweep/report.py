"""The window sweep's report: REPORT.md (and its figures) from the sweep's results.json, and the
summary block of docs/studies.md.

``run`` collects every run's summary.json and eval.json into results.json (results_gpu.json for
sweep_gpu.yaml); the report is made from that file alone, so it is rebuilt from what is
committed.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.lab.cli import ROOT
from experiments.lab.markdown import table as _table
from experiments.lab.sweep_claims import _acc, _far, all_claims
from experiments.lab.sweep_report import (
    SMOKE_RUN,
    carrier,
    closing_lines,
    curve_section,
    figures,
    fmt,
    probe_section,
    recall_rows,
    results_tables,
    summed_minutes,
    task_text,
)
from swax.core.plotting import pyplot
from swax.sweep import aggregate, load_sweep

HERE = Path(__file__).resolve().parent
CONFIGS = ("sweep.yaml", "sweep_gpu.yaml")
"""The CPU sweep (committed results) and the GPU one (not run yet)."""
COMMAND = "python -m experiments.window_sweep"


def names(config: str) -> tuple[str, str, str]:
    """(report, results file, figure prefix) of a sweep config: REPORT.md and results.json for
    sweep.yaml, REPORT_gpu.md, results_gpu.json and gpu_ figures for sweep_gpu.yaml."""
    scale = Path(config).stem.removeprefix("sweep").lstrip("_")
    if not scale:
        return "REPORT.md", "results.json", ""
    return f"REPORT_{scale}.md", f"results_{scale}.json", f"{scale}_"


def phase_figure(agg: dict, cfg, out: Path, seq_len: int, prefix: str) -> str | None:
    """Heatmaps over the grid's two axes: recall at 1×, beyond 1×, and the share carried by
    the recurrent memory (the drop when its state is reset after the needle)."""
    import numpy as np

    if not cfg.grid_points or len(cfg.grid.axes) != 2:
        return None
    plt = pyplot()
    (ka, va), (kb, vb) = cfg.grid.axes.items()
    panels = [
        ("recall at 1× (%)", lambda a: _acc(a, seq_len)),
        ("recall beyond 1× (%)", lambda a: _far(a, seq_len)),
    ]
    if any("probe" in agg.get(n, {}) for n in cfg.grid_points):
        panels.append(
            (
                "drop when the recurrent state is reset (points)",
                lambda a: a["probe"]["full"][0] - a["probe"]["reset"][0],
            )
        )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8))
    for ax, (title, fn) in zip(np.atleast_1d(axes), panels):
        grid = np.full((len(va), len(vb)), np.nan)
        for name, point in cfg.grid_points.items():
            if name in agg:
                grid[va.index(point[ka]), vb.index(point[kb])] = fn(agg[name])
        ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto", origin="lower")
        for i in range(len(va)):
            for j in range(len(vb)):
                if np.isfinite(grid[i, j]):
                    ax.text(
                        j,
                        i,
                        f"{grid[i, j]:.0f}",
                        ha="center",
                        va="center",
                        color="w" if grid[i, j] < 60 else "k",
                        fontsize=9,
                    )
        ax.set_xticks(range(len(vb)), [str(v) for v in vb])
        ax.set_yticks(range(len(va)), [str(v) for v in va])
        ax.set_xlabel(kb)
        ax.set_ylabel(ka)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    name = f"{prefix}phase_diagram.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def grid_section(agg, cfg, seq_len, fig) -> list[str]:
    if not cfg.grid_points:
        return []
    keys = list(cfg.grid.axes)
    lines = [
        "## Phase diagram: which memory wins",
        "",
        "Extra runs over "
        + " × ".join(f"`{k}` {cfg.grid.axes[k]}" for k in keys)
        + f" (seeds {cfg.grid.seeds or cfg.seeds[:1]}); points equal to a run above reuse "
        "it. The paper does not have this result.",
        "",
    ]
    rows = []
    for name, point in cfg.grid_points.items():
        if name not in agg:
            continue
        a = agg[name]
        rows.append(
            [str(point[k]) for k in keys]
            + [fmt(a["episodes_deploy"][seq_len]), f"{_far(a, seq_len):.1f}"]
            + ([carrier(a["probe"])] if "probe" in a else [])
            + [cfg.aliases.get(name, "")]
        )
    head = keys + ["recall at 1×", "mean recall beyond 1×"]
    head += ["carried by"] if any("probe" in agg.get(n, {}) for n in cfg.grid_points) else []
    lines += _table(head + ["same run as"], rows)
    if fig:
        lines += ["", f"![phase diagram]({fig})"]
    return lines + [""]


def header(cfg, cfg_path: Path, results: dict, seq_len: int, quick: bool) -> list[str]:
    """The report's title, provenance, time and seeds lines."""
    rel = cfg_path.relative_to(ROOT) if cfg_path.is_relative_to(ROOT) else cfg_path
    run_time, evals = summed_minutes(results)
    results_file = names(cfg_path.name)[1]
    lines = [
        f"# {cfg.name}: window size and long-range recall",
        "",
        f"Generated by `{COMMAND} report` from `{results_file}`, which `run` collects from the "
        "runs' `summary.json` and `eval.json`; nothing below is typed by hand. What was tried "
        "before this design, with its numbers, is in [NOTES.md](NOTES.md).",
        "",
        f"- command: `{COMMAND} run" + (" --quick" if quick else "") + "`",
        f"- config: `{rel}`" + (" with `--quick`" if quick else ""),
        f"- runs: {cfg.jobs} at a time with {cfg.base.get('threads') or 'default'} thread(s) "
        f"each; training {run_time:.1f} min and evaluation {evals:.1f} min summed "
        "over runs",
        f"- seeds: {cfg.seeds}; training length {seq_len} tokens; every run sees the same "
        "number of tokens",
        "",
    ]
    return lines + (SMOKE_RUN if quick else [])


def write_report(cfg, cfg_path: Path, results: dict, out: Path, quick: bool = False) -> Path:
    """The report of ``results`` (run name -> its seeds' evaluations) into ``out``."""
    report_name, _, prefix = names(cfg_path.name)
    agg = aggregate(results)
    seq_len = next(iter(results.values()))[0]["seq_len"]
    main = [n for n in results if n in cfg.runs]
    paths = figures(agg, out, main, prefix)
    phase = phase_figure(agg, cfg, out, seq_len, prefix)
    lines = header(cfg, cfg_path, results, seq_len, quick)
    lines += ["## Task", "", task_text(cfg), "", "## Results", ""]
    lines += results_tables(agg, main, seq_len)
    lines += ["", f"![recall and answer loss vs length]({paths['accuracy']})", ""]
    lines += ["## The paper's claims at this scale", ""]
    for claim, verdict, evidence in all_claims(cfg, agg, seq_len):
        lines += [f"**{claim}** — **{verdict}**. {evidence}", ""]
    lines += curve_section(agg, main, seq_len, paths.get("curves"))
    lines += probe_section(agg, main + [n for n in results if n not in main], seq_len)
    lines += grid_section(agg, cfg, seq_len, phase)
    lines += closing_lines(cfg, cfg_path)
    report = out / report_name
    report.write_text("\n".join(lines))
    return report


def write_reports(out: Path) -> list[Path]:
    """The report of every sweep whose results are committed, and its figures."""
    written = []
    for config in CONFIGS:
        results = HERE / names(config)[1]
        if results.is_file():
            cfg = load_sweep(HERE / config)
            written.append(write_report(cfg, HERE / config, json.loads(results.read_text()), out))
    return written


STUDIES_PAGE = ROOT / "docs" / "studies.md"
"""The page whose window-sweep block the report rewrites (the summary of the CPU sweep)."""
README_BEGIN = f"<!-- window-sweep:begin (written by {COMMAND} report) -->"
README_END = "<!-- window-sweep:end -->"


def readme_block(cfg, agg: dict, seq_len: int) -> str:
    """The summary docs/studies.md shows: recall at a few lengths and the verdicts."""
    main = [n for n in agg if n in cfg.runs]
    lengths = sorted({n for name in main for n in agg[name]["episodes_long"]})
    show = [n for n in lengths if n in (lengths[0], lengths[len(lengths) // 2], lengths[-1])]
    head = ["run", "pattern", "window"] + [f"recall at {n // seq_len}× ({n})" for n in show]
    rows = recall_rows(agg, main, show, unit="%")
    lines = _table(head, rows) + [""]
    for claim, verdict, _ in all_claims(cfg, agg, seq_len):
        lines.append(f"- {claim} **{verdict}**")
    return "\n".join(lines)


def studies_block() -> str:
    """The docs/studies.md block, from the committed results.json."""
    results = json.loads((HERE / "results.json").read_text())
    seq_len = next(iter(results.values()))[0]["seq_len"]
    return readme_block(load_sweep(HERE / "sweep.yaml"), aggregate(results), seq_len)

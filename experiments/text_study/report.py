"""The text study's report: TEXT_STUDY.md from the committed per-run results (the controls, the
verdicts by the rule, the copy gain per run and range, when the memory's gain appeared); the
readings themselves are readings.py's."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from experiments.far_share.shares import load_far_shares
from experiments.lab.markdown import table as _table
from experiments.text_study.readings import (
    CONTROLS,
    CORPUS_NAMES,
    HERE,
    MAIN,
    control_table,
    failed,
    families,
    family_result,
    load_runs,
    map_predictions,
    map_readings,
    pct,
)
from experiments.text_study.rule import appeared_at, far_key, fmt
from swax.sweep import load_sweep, train_config

REPORT = "TEXT_STUDY.md"
RULE = "TEXT_RULE.md"
COMMAND = "python -m experiments.text_study"


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not b["mean"]:
        return "–"
    return f"{a['mean'] / b['mean']:.2f}"


def prediction_lines(corpus: str, preds: list[dict]) -> list[str]:
    """TEXT_STUDY.md's lines on the map's prediction, one per map."""
    out = []
    for p in preds:
        if p["share"] is None:
            out.append(
                f"- the laziness map's prediction (TEXT_RULE.md section 6, primary "
                f"reading): {p['reading']}."
            )
            continue
        rho, lo, hi = p["rho"]
        per = p["per"]
        out.append(
            f"- the laziness map's prediction (TEXT_RULE.md section 6), {p['label']}: ρ*(T/4) = "
            f"{pct(rho)} of the episodes (95 % interval {pct(lo)}–{pct(hi)}, {p['method']}), "
            f"{pct(rho * per)} of the targets ({pct(lo * per)}–{pct(hi * per)}), against "
            f"{corpus}'s far share beyond 64 of {pct(p['share'])} of its targets: primary "
            f"reading (per target) **{p['reading']}**; secondary reading (the text's share "
            f"read as the episodes') {_secondary(p['secondary'])}."
        )
    return out


def _secondary(pred: str) -> str:
    if pred == "cannot predict":
        return "cannot predict (the share lies inside ρ*'s interval)"
    return f"predicts {pred}"


def verdict_line(corpus: str, fam: str, res: dict, tokens: float) -> str:
    """'**SX on pystdlib** (W 8 vs 64, 30.7M tokens, seeds 0–4): **lazy** — ...'."""
    seeds = [p["seed"] for p in res["seeds"]]
    counts = ", ".join(
        f"{sum(p['reading'] == k for p in res['seeds'])} {k}"
        for k in ("lazy", "between", "not lazy", "no reference")
    )
    p = ""
    if res["verdict"] == "lazy":
        p = f" (one-sided exact sign test p = {0.5 ** res['planned']:.3f})"
    return (
        f"**{fam} on {corpus}** (W_short 8 vs W_long {res['w_long']}, {tokens:.1f}M tokens, "
        f"seeds {seeds}): **{res['verdict']}**{p} — per seed: {counts}."
    )


def _of_planned(n: int, planned: int) -> str:
    return "" if n >= planned else f" (from {n} of {planned} seeds; the rest not run yet)"


def family_section(
    corpus: str, fam: str, cfg, runs, roles, tokens: float, maps=None, shares=None
) -> list[str]:
    """TEXT_STUDY.md's section on one family and corpus; ``maps`` and ``shares``: as
    :func:`map_predictions` takes them (read once per report by the caller)."""
    res = family_result(cfg, runs, roles)
    lines = [f"### {fam} on {corpus}", "", "- " + verdict_line(corpus, fam, res, tokens)]
    if "long128" in roles and runs.get(roles["long128"]):
        r128 = family_result(cfg, runs, roles, 128, "long128")
        lines.append("- " + verdict_line(corpus, fam, r128, tokens))
    lines += prediction_lines(corpus, map_predictions(corpus, res["verdict"], maps, shares))
    if "memory_half" in res:
        lines.append(
            f"- claim 3, memory half (stochastic 8 / 64 in place of the long window): "
            f"**{res['memory_half']}**."
        )
    q = res.get("quality")
    if q:
        c, d = q["cost"], q["diff"]
        lines.append(
            f"- claim 3, quality half: text loss at T, stochastic minus long {d['mean']:+.4f} "
            f"(95 % t interval {d['ci'][0]:+.4f} to {d['ci'][1]:+.4f}, sign-flip p = "
            f"{d['p']:.2f}), against half the short window's cost {c['mean'] / 2:+.4f} (cost "
            f"{c['mean']:+.4f}, interval {c['ci'][0]:+.4f} to {c['ci'][1]:+.4f}): "
            f"**{q['verdict']}**{_of_planned(res['quality_seeds'], res['planned'])}."
        )
        if c["n"] >= 2 and c["ci"][1] < 0:
            lines.append(
                "- the short window's text loss is *lower* than the long window's (the cost's "
                "interval lies below 0): the premise of the quality half, that a short window "
                "costs quality, does not hold here. The rule did not foresee this case; its "
                "verdict above is applied as written. The loss by position "
                "([TEXT_POSITIONS.md](TEXT_POSITIONS.md)) says where the difference lies."
            )
    head = [
        "seed",
        f"G short ({res['key']})",
        "G long",
        "long / short",
        "reading",
        "G stoch",
        "stoch / short",
        "text loss short / long / stoch",
    ]
    rows = []
    loss = res.get("loss", {})
    for p in res["seeds"]:
        lo = " / ".join(f"{x:.4f}" for x in loss[p["seed"]]) if p["seed"] in loss else "–"
        rows.append(
            [
                str(p["seed"]),
                fmt(p["short"]),
                fmt(p["long"]),
                _ratio(p["long"], p["short"]),
                p["reading"],
                fmt(p["stoch"]),
                _ratio(p["stoch"], p["short"]),
                lo,
            ]
        )
    lines += ["", *_table(head, rows), ""]
    return lines


def run_table(runs, names: list[str]) -> list[str]:
    head = [
        "run",
        "seed",
        "range",
        "events (available)",
        "documents",
        "gain (own window)",
        "cut to 8",
        "reset",
    ]
    rows = []
    for name in names:
        for rec in runs.get(name, []):
            for row in rec.get("copies", {}).get("buckets", []):
                pr = row.get("probes", {})
                rows.append(
                    [
                        name,
                        str(rec["seed"]),
                        row["bucket"],
                        f"{row['n']} ({row['available']})",
                        str(row.get("docs", "–")),
                        fmt(row["gain"] if row["n"] else None),
                        fmt(pr.get("window_cut")),
                        fmt(pr.get("reset")),
                    ]
                )
    return _table(head, rows)


def curve_lines(runs, names: list[str], key_of) -> list[str]:
    out = []
    for name in names:
        key = key_of(name)
        for rec in runs.get(name, []):
            pts = rec.get("copy_curve", [])
            if not pts:
                continue
            at = appeared_at(pts, key)
            when = f"appeared at {at:.1f}M" if at is not None else "not within the budget"
            vals = ", ".join(
                f"{p['tokens'] / 1e6:.1f}M {p['gain'].get(key, math.nan):.3f}" for p in pts
            )
            out.append(f"- {name} seed {rec['seed']} ({key}): {when}; {vals}")
    return out


def paired_appearance(cfg, runs, key_of) -> list[str]:
    """Per family, a table by seed: when each run's memory gain beyond W_long appeared
    (:func:`appeared_at`; 'never' = not within the budget)."""
    out = []
    for fam, roles in families(cfg).items():
        present = [r for r in roles if runs.get(roles[r])]
        if not present:
            continue
        head = ["seed", *(f"{r} ({roles[r]})" for r in present)]
        rows = []
        for seed in cfg.seeds:
            cells = []
            for r in present:
                rec = next((x for x in runs[roles[r]] if x["seed"] == seed), None)
                at = appeared_at(rec.get("copy_curve", []), key_of(roles[r])) if rec else None
                cells.append("" if not rec else "never" if at is None else f"{at:.1f}M")
            if any(cells):
                rows.append([str(seed), *cells])
        out += [
            f"{fam}, millions of tokens until G beyond W_long appeared (a blank: not run yet):",
            "",
            *_table(head, rows),
            "",
        ]
    return out


def write_report(out: Path, command: str, ccfg=None, mains=None) -> Path:
    """TEXT_STUDY.md in ``out`` from the archives of the controls and the main sweeps
    (defaults: the committed ones)."""
    ccfg = ccfg or load_sweep(HERE / CONTROLS)
    mains = mains if mains is not None else [(c, load_sweep(HERE / f)) for c, f in MAIN]
    cruns = load_runs(ccfg)
    lines = [
        "# Laziness on text alone: the copy gain of the recurrent memory by window",
        "",
        f"Generated by `{command}` from the committed per-run results in "
        f"`{_rel(ccfg.archive)}` and "
        + ", ".join(f"`{_rel(c.archive)}`" for _, c in mains)
        + f"; nothing below is typed by hand. The rule it applies was committed before the "
        f"first main run: [{RULE}]({RULE}). The probe: `swax/probes/copies.py`.",
        "",
        "- **G**: the copy gain (nats; loss on a copy event's target with every earlier "
        "occurrence of its 8-byte context replaced by other held-out text, minus the loss as it "
        "is) with the run's own window, in a range of reach; 95 % interval from a bootstrap over "
        "held-out documents; `*` where the lower bound is above 0 (the range copies).",
        "- Beyond W_long (`beyond_64` = (64, T], `r128_256` for W_long = 128) neither run's "
        "attention reaches the copied byte: G there is the recurrent memory's.",
        "",
        "## 1. Controls (W = 8, one seed)",
        "",
    ]
    table, controls = control_table(ccfg, cruns)
    lines += table + [""] if any(cruns.values()) else ["No control is archived yet.", ""]
    lines += ["## 2. Verdicts by the rule", ""]
    maps, shares = map_readings(), load_far_shares()
    for corpus, cfg in mains:
        runs = load_runs(cfg)
        b = cfg.base
        tokens = b["steps"] * b["batch_size"] * b["seq_len"] / 1e6
        for fam, roles in families(cfg).items():
            c = controls.get((corpus, fam))
            if c is None:
                lines += [f"### {fam} on {corpus}", "", "- control not run yet.", ""]
                continue
            if not c["passes"]:
                lines += [
                    f"### {fam} on {corpus}",
                    "",
                    f"- **cannot decide at this scale**: {failed(c)}.",
                    "",
                ]
                continue
            if not any(runs.get(n) for n in roles.values()):
                lines += [f"### {fam} on {corpus}", "", "- no main run archived yet.", ""]
                continue
            lines += family_section(corpus, fam, cfg, runs, roles, tokens, maps, shares)
    lines += ["## 3. Copy gain per run and range", ""]
    for corpus, cfg in mains:
        runs = load_runs(cfg)
        names = [n for n in cfg.runs if runs.get(n)]
        if names:
            lines += [f"### {CORPUS_NAMES.get(corpus, corpus)}", "", *run_table(runs, names), ""]
    lines += [
        "## 4. When the memory's gain appeared",
        "",
        "The first checkpoint at which G beyond W_long has its interval above 0 there and "
        "at the next checkpoint; then G (own window, 256 events) at every checkpoint.",
        "",
    ]
    for _, cfg in mains:
        runs = load_runs(cfg)
        names = [n for n in cfg.runs if runs.get(n)]

        def key_of(name, cfg=cfg):
            return far_key(train_config(cfg, name, cfg.seeds[0]).window.long)

        lines += paired_appearance(cfg, runs, key_of) + curve_lines(runs, names, key_of)
    lines.append("")
    path = out / REPORT
    path.write_text("\n".join(lines))
    return path


def _rel(archive: str) -> str:
    return Path(os.path.relpath(archive, HERE)).as_posix()


def write_reports(out: Path) -> list[Path]:
    """TEXT_STUDY.md and TEXT_POSITIONS.md from the committed results."""
    from experiments.text_study import positions

    result = json.loads(positions.RESULT.read_text())
    return [write_report(out, f"{COMMAND} report"), positions.write_report(result, out)]


def quick_reports(cfgs: dict, ran: list[str], out: Path, command: str) -> list[Path]:
    """TEXT_STUDY.md of the reduced study (every config read, the ones run archived)."""
    return [write_report(out, command, cfgs[CONTROLS], [(c, cfgs[f]) for c, f in MAIN])]

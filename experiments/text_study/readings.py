"""Laziness on text alone (issue 49): the controls, the main runs and the verdicts of TEXT_RULE.md.

    python experiments/regime_study/textstudy.py          # TEXT_STUDY.md from the archives
    python experiments/regime_study/textstudy.py --config text_code.yaml --run --jobs 2
    python experiments/regime_study/textstudy.py --quick --run --report-dir DIR   # CI smoke test

``--quick --run`` trains the reduced controls and pystdlib runs (KJV's reduced runs only with
``--config text_kjv.yaml``: the study has no KJV main runs, its controls failed).

The rule (TEXT_RULE.md) was committed before the first main run; this script applies it to the
committed per-run files of ``text_controls.yaml``, ``text_code.yaml`` (pystdlib) and
``text_kjv.yaml`` (KJV) and reads nothing else: every number in TEXT_STUDY.md, the text-only
section of REPORT.md and the README's sentence on it is made here from those files.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import laziness as L  # noqa: E402
from farshare import answers_of_targets, far_at, load_far_shares  # noqa: E402
from sections import _numeric_columns  # noqa: E402
from studycli import load_archived, run  # noqa: E402
from textrule import (  # noqa: E402
    ANSWERS_OF_TARGETS,
    RANGES,
    RHO_STAR,
    appeared_at,
    control_reading,
    family_verdict,
    far_key,
    fmt,
    gain,
    map_prediction,
    memory_half,
    predict,
    quality_half,
    seed_reading,
)

from swax.sweep import load_sweep, run_sweep  # noqa: E402

REPORT = "TEXT_STUDY.md"
RULE = "TEXT_RULE.md"
CONTROLS = "text_controls.yaml"
MAIN = (("pystdlib", "text_code.yaml"), ("kjv", "text_kjv.yaml"))
CORPUS_NAMES = {"pystdlib": "pystdlib (Python standard library, code)", "kjv": "KJV (prose)"}
# ------------------------------------------------------------------------------ the archives


def load_runs(cfg) -> dict[str, list[dict]]:
    """{run name: [archived result per seed, with "seed"]}."""
    return load_archived(cfg, lambda ev, seed: {**ev, "seed": seed})


def families(cfg) -> dict[str, dict[str, str]]:
    """{family: {role: run name}} of a main sweep."""
    return dict(getattr(cfg, "families", None) or {}) or {"SX": dict(cfg.roles)}


def _family_of(pattern: str) -> str:
    return "SX" if "X" in pattern else "SD" if "D" in pattern else pattern


def control_table(ccfg, cruns) -> tuple[list[str], dict]:
    """The controls' table and {(corpus, family): control reading}."""
    head = [
        "control",
        "corpus",
        "family",
        "input-gate bias",
        "tokens",
        *RANGES,
        "reset beyond 32",
        "passes",
        "128 arm",
    ]
    rows, out = [], {}
    from swax.sweep import train_config

    for name, recs in cruns.items():
        for rec in recs:
            t = train_config(ccfg, name, rec["seed"])
            fam = _family_of(t.model.layer_pattern)
            c = control_reading(rec)
            key = (str(t.data.source), fam)
            bias = f"{t.model.mlstm_igate_bias_init:g}"
            tried = out.get(key, {}).get("tried", []) + [f"{name} (bias {bias}): {c['why']}"]
            if key not in out or (c["passes"] and not out[key]["passes"]):
                out[key] = {**c, "name": name}
            out[key]["tried"] = tried
            rows.append(
                [
                    name,
                    str(t.data.source),
                    fam,
                    f"{t.model.mlstm_igate_bias_init:g}",
                    f"{rec.get('summary', {}).get('tokens', math.nan) / 1e6:.1f}M",
                    *[fmt(gain(rec, k)) for k in RANGES],
                    fmt(gain(rec, "beyond_32", "reset")),
                    "yes" if c["passes"] else f"no: {c['why']}",
                    "yes" if c["arm128"] else "no",
                ]
            )
    return _table(head, rows), out


def failed(c: dict) -> str:
    """Why a family has no verdict on a corpus: the control, or every control tried, failed."""
    if len(c.get("tried", [])) < 2:
        return f"its control ({c['name']}) failed: {c['why']}"
    return "its controls failed: " + "; ".join(c["tried"])


def family_result(cfg, runs, roles: dict, w_long: int = 64, role: str = "long") -> dict:
    """Per-seed readings and the verdict of one family on one corpus at one long window."""
    key = far_key(w_long)
    by = {r: {x["seed"]: x for x in runs.get(roles.get(r, ""), [])} for r in roles}
    seeds = [s for s in cfg.seeds if s in by.get("short", {}) and s in by.get(role, {})]
    per_seed = []
    for s in seeds:
        gs, gl = gain(by["short"][s], key), gain(by[role][s], key)
        gt = gain(by.get("stochastic", {}).get(s), key) if w_long == 64 else None
        per_seed.append(
            {
                "seed": s,
                "short": gs,
                "long": gl,
                "stoch": gt,
                "reading": seed_reading(gs, gl),
                "stoch_reading": seed_reading(gs, gt) if gt else None,
            }
        )
    planned = len(cfg.seeds)
    out = {
        "key": key,
        "w_long": w_long,
        "seeds": per_seed,
        "planned": planned,
        "verdict": family_verdict([p["reading"] for p in per_seed], planned),
    }
    if w_long == 64:
        st = [p["stoch_reading"] for p in per_seed if p["stoch_reading"]]
        out["memory_half"] = memory_half(st, planned)
        trios = [s for s in seeds if s in by.get("stochastic", {})]  # the seeds with all three
        loss = {
            r: [by[r][s].get("text_val_loss", math.nan) for s in trios]
            for r in ("short", "long", "stochastic")
        }
        out["loss"] = {s: [loss[r][i] for r in loss] for i, s in enumerate(trios)}
        if len(trios) >= 2:
            out["quality"] = quality_half(loss["short"], loss["long"], loss["stochastic"])
            out["quality_seeds"] = len(trios)
    return out


def _table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not b["mean"]:
        return "–"
    return f"{a['mean'] / b['mean']:.2f}"


# ------------------------------------------------------------------------- the map's prediction

MAP_T, MAP_W = 256, 64
"""TEXT_RULE.md section 6 reads the map's row W = T/4 = 64 at T = 256: the study's W_long."""


def map_readings(record=None) -> list[dict]:
    """The maps TEXT_RULE.md section 6 predicts from, as {"label", "rho": (value, lo, hi) in
    shares of the episodes, "per": the answers' share of the map's targets}: the map the rule
    committed (old episode ids; its constants, as committed) and, once every run of the rerun on
    clean ids is archived (the rule: "if its rho*(T/4) moves, the report prints the prediction
    with both"), that map, its rho*(T/4) and Jeffreys interval recomputed from its runs.
    ``record``: laziness.map_of_record()'s answer (default: the committed archives)."""
    out = [
        {
            "label": "the map the rule committed (episode ids 128–175)",
            "rho": RHO_STAR,
            "per": ANSWERS_OF_TARGETS,
            "method": "bootstrap over seeds",
        }
    ]
    name, cfg, cells, _ = record or L.map_of_record()
    cols = _numeric_columns(cells, MAP_W)
    if name == L.CLEAN_MAP and cols:
        shares = [(float(c[:-1]) / 100, L.lazy_share(cells[(MAP_W, c)])) for c in cols]
        lo, hi = L.rho_star_interval(cells, MAP_W, cols)
        out.append(
            {
                "label": f"the map on clean episode ids ({L.CLEAN_MAP})",
                "rho": (L.rho_star_value(shares), lo, hi),
                "per": answers_of_targets(cfg),
                "method": "Jeffreys posterior per cell",
            }
        )
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2g} %" if x < 0.001 else f"{100 * x:.3g} %"


def map_predictions(corpus: str, verdict: str, maps=None, shares=None) -> list[dict]:
    """Per map of :func:`map_readings`: what it predicts for ``corpus`` (its natural far share
    beyond W = 64 at T = 256, bytes) in the primary and the secondary reading of TEXT_RULE.md
    section 6, and the verdict read against the primary one. Without the far-share result the
    committed map's primary prediction (*not lazy*) stands alone."""
    maps = maps if maps is not None else map_readings()
    shares = shares if shares is not None else load_far_shares()
    row = far_at(shares[(corpus, "byte")], MAP_T, MAP_W) if (corpus, "byte") in shares else None
    if row is None:
        return [
            {
                **maps[0],
                "share": None,
                "primary": "not lazy",
                "secondary": None,
                "reading": map_prediction(verdict),
            }
        ]
    out = []
    for m in maps:
        primary = predict(row["share"], m["rho"], m["per"])
        out.append(
            {
                **m,
                "share": row["share"],
                "primary": primary,
                "secondary": predict(row["share"], m["rho"], 1.0),
                "reading": map_prediction(verdict, primary),
            }
        )
    return out


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
            f"{_pct(rho)} of the episodes (95 % interval {_pct(lo)}–{_pct(hi)}, {p['method']}), "
            f"{_pct(rho * per)} of the targets ({_pct(lo * per)}–{_pct(hi * per)}), against "
            f"{corpus}'s far share beyond 64 of {_pct(p['share'])} of its targets: primary "
            f"reading (per target) **{p['reading']}**; secondary reading (the text's share "
            f"read as the episodes') {_secondary(p['secondary'])}."
        )
    return out


def _secondary(pred: str) -> str:
    if pred == "cannot predict":
        return "cannot predict (the share lies inside ρ*'s interval)"
    return f"predicts {pred}"


def prediction_summary(preds: list[dict]) -> str:
    """REPORT.md's clause: the verdict against each map's primary prediction."""
    if len(preds) == 1:
        return preds[0]["reading"]
    if len({p["reading"] for p in preds}) == 1:
        return f"{preds[0]['reading']}, by the map the rule committed and by its rerun on clean ids"
    return "; ".join(f"{p['label']}: {p['reading']}" for p in preds)


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


def verdicts(ccfg=None, mains=None) -> list[dict]:
    """One record per (corpus, family): the verdict by TEXT_RULE.md or why there is none, the
    claim-3 halves, the map's prediction, and what they were read at."""
    ccfg = ccfg or load_sweep(HERE / CONTROLS)
    mains = mains if mains is not None else [(c, load_sweep(HERE / f)) for c, f in MAIN]
    _, controls = control_table(ccfg, load_runs(ccfg))
    maps, shares = map_readings(), load_far_shares()
    out = []
    for corpus, cfg in mains:
        runs = load_runs(cfg)
        b = cfg.base
        tokens = b["steps"] * b["batch_size"] * b["seq_len"] / 1e6
        for fam, roles in families(cfg).items():
            rec = {"corpus": corpus, "family": fam, "tokens": tokens, "planned": len(cfg.seeds)}
            c = controls.get((corpus, fam))
            if c is None:
                out.append({**rec, "verdict": "control not run yet"})
            elif not c["passes"]:
                out.append({**rec, "verdict": "cannot decide at this scale", "why": failed(c)})
            elif not any(runs.get(n) for n in roles.values()):
                out.append({**rec, "verdict": "not yet run"})
            else:
                res = family_result(cfg, runs, roles)
                if "long128" in roles and runs.get(roles["long128"]):
                    res["w128"] = family_result(cfg, runs, roles, 128, "long128")
                preds = map_predictions(corpus, res["verdict"], maps, shares)
                out.append({**rec, **res, "map": prediction_summary(preds)})
    return out


def _read_from(res: dict) -> str:
    """'lazy in 5 paired seeds': the verdict and, when it has complete seeds, how many."""
    what = res["verdict"]
    if "seeds" in res and not what.startswith("incomplete"):
        what += f" in {len(res['seeds'])} paired seeds"
    return what


def summary_lines(records: list[dict]) -> list[str]:
    """REPORT.md's sentences on the text study, one per (corpus, family)."""
    out = []
    for r in records:
        head = f"- **{r['family']} on {r['corpus']}** ({r['tokens']:.1f}M tokens, T = 256): "
        if "seeds" not in r:
            why = f" ({r['why']})" if r.get("why") else ""
            out.append(head + f"**{r['verdict']}**{why}.")
            continue
        n = len(r["seeds"])
        counts = ", ".join(
            f"{sum(p['reading'] == k for p in r['seeds'])} {k}"
            for k in ("lazy", "between", "not lazy", "no reference")
        )
        q = r.get("quality", {}).get("verdict", "not yet read")
        r128 = r.get("w128")
        at128 = (
            f"; W_long = 128 against 8, **{r128['verdict']}** ({len(r128['seeds'])} of "
            f"{r128['planned']} seeds)"
            if r128
            else ""
        )
        out.append(
            head + f"W_long = 64 against W_short = 8, **{r['verdict']}** by the rule ({n} of "
            f"{r['planned']} seeds: {counts}){at128}; claim 3's memory half "
            f"{r['memory_half']}, its quality half {q}; the laziness map's prediction: "
            f"{r['map']}."
        )
    return out


def readme_sentence(records: list[dict]) -> str:
    """The README's sentence on the text study."""
    parts = []
    for r in records:
        at128 = f" (at W_long = 128: {_read_from(r['w128'])})" if r.get("w128") else ""
        parts.append(f"{r['family']} on {r['corpus']} {_read_from(r)}{at128}")
    return (
        "On text alone, by a rule fixed before the runs (TEXT_RULE.md; the recurrent memory's "
        "copy gain beyond W_long = 64 against W_short = 8, T = 256): " + "; ".join(parts) + "."
    )


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
            from swax.sweep import train_config

            return far_key(train_config(cfg, name, cfg.seeds[0]).window.long)

        lines += paired_appearance(cfg, runs, key_of) + curve_lines(runs, names, key_of)
    lines.append("")
    path = out / REPORT
    path.write_text("\n".join(lines))
    return path


def _rel(archive: str) -> str:
    return Path(os.path.relpath(archive, HERE)).as_posix()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="train and evaluate the missing runs")
    ap.add_argument("--quick", action="store_true", help="the reduced study (CI smoke test)")
    ap.add_argument("--jobs", type=int, default=None, help="runs at a time (default: config's)")
    ap.add_argument("--only", default=None, help="comma list of the runs to train")
    ap.add_argument("--report-dir", default=None, help=f"where {REPORT} goes (default: here)")
    ap.add_argument(
        "--config", default=None, help="the sweep to run (default: the controls, then the mains)"
    )
    args = ap.parse_args(argv)
    names = [CONTROLS, *(f for _, f in MAIN)]
    cfgs = {f: load_sweep(HERE / f, quick=args.quick) for f in names}
    if args.quick:  # the smoke test keeps its results with its runs
        for cfg in cfgs.values():
            if not cfg.archive:
                cfg.archive = str(Path(cfg.out_dir).resolve() / "archive")
    if args.run:
        default = [f for f in names if not (args.quick and f == "text_kjv.yaml")]
        for f in [args.config] if args.config else default:
            if f not in cfgs:
                cfgs[f] = load_sweep(HERE / f, quick=args.quick)
            cfg = cfgs[f]
            if args.jobs:
                cfg.jobs = args.jobs
            run_sweep(cfg, only=args.only.split(",") if args.only else None)
    out = Path(args.report_dir) if args.report_dir else HERE
    out.mkdir(parents=True, exist_ok=True)
    command = "python experiments/regime_study/textstudy.py" + (" --quick" if args.quick else "")
    mains = [(c, cfgs[f]) for c, f in MAIN]
    print(f"report: {write_report(out, command, cfgs[CONTROLS], mains)}")
    return 0


if __name__ == "__main__":
    run(main)

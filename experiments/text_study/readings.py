"""The text study's readings (issue 49): the controls, each family's verdict by the rule of
TEXT_RULE.md (rule.py), claim 3's two halves and the laziness map's prediction, from the
committed per-run results of ``text_controls.yaml``, ``text_code.yaml`` (pystdlib) and
``text_kjv.yaml`` (KJV) and nothing else: every number in TEXT_STUDY.md, the text-only section
of REPORT.md and the README's rows on it are made here from those files.
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.far_share.shares import answers_of_targets, far_at, load_far_shares
from experiments.lab.cli import load_archived
from experiments.lab.markdown import table as _table
from experiments.laziness_map import cells as L
from experiments.text_study.rule import (
    ANSWERS_OF_TARGETS,
    RANGES,
    RHO_STAR,
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
from swax.sweep import load_sweep, train_config

HERE = Path(__file__).resolve().parent
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
    cols = L.numeric_columns(cells, MAP_W)
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


def pct(x: float) -> str:
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


def prediction_summary(preds: list[dict]) -> str:
    """REPORT.md's clause: the verdict against each map's primary prediction."""
    if len(preds) == 1:
        return preds[0]["reading"]
    if len({p["reading"] for p in preds}) == 1:
        return f"{preds[0]['reading']}, by the map the rule committed and by its rerun on clean ids"
    return "; ".join(f"{p['label']}: {p['reading']}" for p in preds)


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

"""REPORT.md of the regime study: the laziness map, the claims at both far shares, the delay,
the natural far share of text, and laziness on text alone, read together.

Built from the same committed per-run results as the studies' own reports (laziness_map,
claims, far_share, text_only, text_study), with their functions, so its numbers are theirs;
every sentence that states a result is made from those numbers here (the map, claims and delay
sections in sections.py). The first study of this regime, whose reading did not hold, is
first_regime_study/FIRST_STUDY.md.
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.claims import judge as C
from experiments.far_share import report as F
from experiments.far_share.shares import (
    CORPORA,
    TOKENIZERS,
    answers_of_targets,
    far_at,
    load_far_shares,
)
from experiments.laziness_map import cells as L
from experiments.regime_study.sections import (
    _exact,
    claims_section,
    delay_reading,
    delay_section,
    ids_paragraph,
    map_section,
)
from experiments.text_only import report as X
from experiments.text_study import readings as TS
from swax.sweep import load_sweep

HERE = Path(__file__).resolve().parent
COMMAND = "python -m experiments.regime_study"
REPORT = "REPORT.md"


def far_share_section(lcfg, ccfg, cells, shares) -> list[str]:
    if not shares:
        return []
    per = answers_of_targets(ccfg)
    T, W = ccfg.base["seq_len"], ccfg.base["window"]["long"]
    rho_claims = C.far_share(ccfg) or 0.0
    lines = ["## 4. The natural far share of text, against ρ*", "", F.WHAT, ""]
    lines += F.table_lines(shares) + [""]
    keys = [(c, t) for c, _ in CORPORA for t, _ in TOKENIZERS if (c, t) in shares]
    kjv = shares.get(("kjv", "byte"))
    study = far_at(kjv, T, W) if kjv else None
    rho_star = (
        L.rho_star_value(
            [
                (float(c[:-1]) / 100, L.lazy_share(cells[(W, c)]))
                for c in L.numeric_columns(cells, W)
            ]
        )
        if (W, "0%") in cells
        else math.nan
    )
    lo, hi = L.rho_star_interval(cells, W, L.numeric_columns(cells, W))
    old = " on old episode ids" if (L.ids_of(cells) or {}).get("old") else ""
    if study is not None:
        lines.append(
            f"- **The study's setting** (T = {T}, W_long = {W}, KJV bytes): text alone puts "
            f"{100 * study['share']:.2f} % of its targets beyond W_long (interval "
            f"{100 * study['ci'][0]:.2f}–{100 * study['ci'][1]:.2f} %). The episodes of the "
            f"claims at ρ = {100 * rho_claims:g} % supervise {100 * rho_claims * per:.3f} % of "
            f"all targets beyond W_long (answers are {100 * per:.1f} % of the targets), and the "
            f"map's ρ*(T/8) = {100 * rho_star:.3g} % (95 % interval {L.interval_text(lo, hi)}"
            f"{old}) is {100 * rho_star * per:.3f} % of the targets (interval "
            f"{100 * lo * per:.3f}–{100 * hi * per:.3f} %). On that scale the text's own far "
            f"share is {study['share'] / (rho_star * per):.0f}× ρ* "
            f"({_ratio(study['share'], lo, hi, per)}): the study's text rows carry more far "
            "supervision than its episodes, of another "
            "kind (copying a span of text, not recalling one value)."
        )
    paper = [(k, far_at(shares[k], 16384, 128), far_at(shares[k], 16384, 2048)) for k in keys]
    paper = [(k, a, b) for k, a, b in paper if a and b]
    if paper:
        lines.append(
            "- **The paper's setting** (T = 16k; W = 128 and 2048): "
            + "; ".join(
                f"{dict(CORPORA)[c].split(' (')[0]} {dict(TOKENIZERS)[t]} "
                f"{100 * a['share']:.2f} % and {100 * b['share']:.2f} %"
                for (c, t), a, b in paper
            )
            + ". On the map's scale (ρ × the answers' share of the targets) every one of these "
            f"lies above ρ*(T/8) = {100 * rho_star * per:.3f} % of the targets, the smallest "
            f"{min(b['share'] for _, _, b in paper) / (rho_star * per):.0f}× over; "
            f"{sum(b['share'] > hi * per for _, _, b in paper)} of {len(paper)} lie above the "
            f"upper end of ρ*'s interval ({100 * hi * per:.3f} %), the smallest "
            f"{min(b['share'] for _, _, b in paper) / (hi * per):.2g}× over it. If far supervision "
            "in text counted as the map's does, the paper's long window would not be lazy. "
            "Section 5 reads whether it counts."
        )
    lines.append("")
    return lines


def _ratio(share: float, lo: float, hi: float, per: float) -> str:
    """How far ``share`` lies above rho*'s interval [lo, hi] (far shares of the answers; per:
    the answers' share of the targets)."""
    top = f"{share / (hi * per):.2g}×" if hi < math.inf else "no multiple"
    if lo > 0:
        return f"{top} to {share / (lo * per):.2g}× over ρ*'s interval"
    return f"{top} the upper end of ρ*'s interval; its lower end is 0, which bounds no ratio"


def text_only_section(tcfg, truns) -> list[str]:
    done = sum(len(v) for v in truns.values())
    lines = [
        "## 5. Laziness on text alone: the first probe",
        "",
        f"The study's SX model trained on KJV text only (no episodes), windows 8, 32 and "
        f"stochastic, {C.tokens_m(tcfg):.1f}M tokens per run, {done} of "
        f"{len(tcfg.runs) * len(tcfg.seeds)} runs. The copy gain (swax/probes/copies.py): the "
        "loss on a copy event's target with every earlier occurrence of its context replaced by "
        "other held-out text, minus the loss as it is (nats); per bucket of reach, with the "
        "window cut to 8 and the recurrent reset. Per run: "
        "[TEXT_ONLY.md](../text_only/TEXT_ONLY.md).",
        "",
    ]
    if not done:
        return lines + ["No text-only run is archived yet.", ""]
    roles = tcfg.roles
    for key in ("short_long", "long_T", "T_4T"):
        parts, label = [], key
        for role, name in roles.items():
            recs = truns.get(name, [])
            vals = [X.gains(r).get(key) for r in recs]
            vals = [v for v in vals if v]
            if not vals:
                continue
            label = vals[0]["bucket"]
            m = [v["gain"]["mean"] for v in vals]
            cut = [v.get("probes", {}).get("window_cut", {}).get("mean", math.nan) for v in vals]
            rst = [v.get("probes", {}).get("reset", {}).get("mean", math.nan) for v in vals]
            parts.append(
                f"{role} {sum(m) / len(m):.3f} (cut {sum(cut) / len(cut):.3f}, reset "
                f"{sum(rst) / len(rst):.3f}; {len(m)} seeds)"
            )
        if parts:
            lines.append(f"- {label}: mean copy gain " + "; ".join(parts) + ".")
    lines += ["", "Long against short, paired by seed:", "", *X.reading(tcfg, truns), ""]
    return lines


def sxsx_section() -> list[str]:
    """The text-only probe with two attention layers (textonly_sxsx.yaml), once archived."""
    cfg = load_sweep(X.HERE / "textonly_sxsx.yaml")
    runs = X.load_runs(cfg)
    done = sum(len(v) for v in runs.values())
    if not done:
        return []
    return [
        f"With two attention layers (SXSX, 4 layers; {done} of "
        f"{len(cfg.runs) * len(cfg.seeds)} runs, "
        "[TEXT_ONLY_SXSX.md](../text_only/TEXT_ONLY_SXSX.md)):",
        "",
        *X.reading(cfg, runs),
        "",
    ]


def _rerun_note(settings) -> str:
    """The positive controls' rerun with episode ids no text emits (claims_rho0.yaml's long
    windows: same seeds, budget and data order), for the reading's laziness sentence."""
    for cfg, sruns in settings:
        sx, sd = sruns.get("sx-long", []), sruns.get("sd-long", [])
        if cfg.name.endswith("rho0") and sx:
            tail = f", SD in {_exact(sd, 'lazy')}" if sd else ""
            return (
                " Those runs used episode ids that also occur in the text (NOTES.md section 8); "
                f"rerun with ids no text emits (claims_rho0.yaml), the SX long window was lazy "
                f"in {_exact(sx, 'lazy')} seeds{tail}: with no far answer, a long window is "
                "lazy in some seeds, not in all."
            )
    return ""


def text_study_section() -> list[str]:
    """The text-only study decided by a rule fixed in advance (text_study, TEXT_RULE.md)."""
    return [
        "## 6. Laziness on text alone, by a rule fixed before the runs",
        "",
        "The study's 2-layer models trained on text only (no episodes), read by the recurrent "
        "memory's copy gain beyond W_long with 8-byte contexts and intervals from a bootstrap "
        "over held-out documents. The decision rule, windows, seeds and budget were committed "
        "before the first main run ([TEXT_RULE.md](../text_study/TEXT_RULE.md)); per run and per "
        "seed: [TEXT_STUDY.md](../text_study/TEXT_STUDY.md).",
        "",
        *TS.summary_lines(TS.verdicts()),
        "",
    ]


def reading(ccfg, runs, cells, settings, tcfg, truns) -> list[str]:
    """What the numbers say, sentence by sentence from the numbers."""
    out = ["## 7. Reading", ""]
    sx_near, sd_near = runs.get("sx-long-near", []), runs.get("sd-long-near", [])
    if sx_near:
        out.append(
            f"- **Laziness exists at this scale.** With every training answer inside W_long, "
            f"the SX long window ended lazy in {_exact(sx_near, 'lazy')} seeds after "
            f"{C.tokens_m(ccfg):.1f}M tokens: recall 100 % inside the window, chance beyond "
            "it, and the window cut removes it while the recurrent reset does not."
            + (
                f" The Gated DeltaNet hybrid: lazy in {_exact(sd_near, 'lazy')} seeds; the "
                "others' window-cut probe keeps the near answers, so their recurrent memory "
                "carries them too."
                if sd_near
                else ""
            )
            + _rerun_note(settings)
        )
    for cfg, sruns in settings:
        for family, roles in C.families_of(cfg).items():
            js = C.judge(family, roles, sruns, cfg)
            if js[0]["verdict"] == "not yet run":
                continue
            verdicts = "; ".join(
                f"claim {c['claim'].split(' ', 1)[0]} {c['verdict']} ("
                + ", ".join(f"{p['part']}: {p['verdict']}" for p in c["parts"])
                + ")"
                for c in js
            )
            out.append(f"- **{family}, {js[0]['at']}:** {verdicts}.")
    out += delay_reading(settings)
    out += [
        "- **The task is the simplest that learns on this machine.** One key-value pair, where "
        "the answer is the only value-range token in the context: it measures which memory "
        "carries a token across a distance, not lookup by key. The binding variants tried are "
        "in NOTES.md (sections 3, 4 and 7).",
        "",
    ]
    return out


def write_report(out: Path, lcfg=None, settings=None, tcfg=None, shares=None, pending=None) -> Path:
    """REPORT.md in ``out`` from the archived results (default: the committed ones of the map
    of record (laziness_map.cells.map_of_record), the claims settings, textonly.yaml and the
    far share's results)."""
    if lcfg is None:
        _, lcfg, cells, pending = L.map_of_record()
    else:
        cells = L.load_cells(lcfg)
    settings = settings or C.load_settings()
    tcfg = tcfg or load_sweep(X.HERE / "textonly.yaml")
    shares = load_far_shares() if shares is None else shares
    ccfg, runs = settings[0]
    truns = X.load_runs(tcfg)
    lines = [
        "# The window effect in the paper's regime, measured by distance",
        "",
        f"Generated by `{COMMAND} report` from the committed per-run results of the studies "
        "it reads; nothing below is typed by hand. The tables per seed are "
        "[LAZINESS.md](../laziness_map/LAZINESS.md), [CLAIMS.md](../claims/CLAIMS.md) and "
        "[TEXT_ONLY.md](../text_only/TEXT_ONLY.md); every attempt, and why the first study's "
        "reading was wrong, is in [NOTES.md](NOTES.md); the first study itself is "
        "[FIRST_STUDY.md](../first_regime_study/FIRST_STUDY.md).",
        "",
        "An answer lies **inside** window W when the position that predicts it attends to the "
        "value under the attention op's own mask. Recall is read by distance bucket; a run is "
        "**lazy** when it recalls ≥ 90 % inside the long window and at most 10 points above "
        "chance (6.25 %) beyond it, **memory** when it recalls ≥ 50 % beyond it. "
        + ids_paragraph(cells, settings),
        "",
        *map_section(lcfg, cells, pending),
        *claims_section(settings),
        *delay_section(settings),
        *far_share_section(lcfg, ccfg, cells, shares),
        *text_only_section(tcfg, truns),
        *sxsx_section(),
        *text_study_section(),
        *reading(ccfg, runs, cells, settings, tcfg, truns),
    ]
    path = out / REPORT
    path.write_text("\n".join(lines))
    return path


def write_reports(out: Path) -> list[Path]:
    return [write_report(out)]

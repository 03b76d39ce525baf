"""REPORT.md's sections on the laziness map, the claims and when the memory emerged (report.py
puts them together with the far share of text and the text-only sections)."""

from __future__ import annotations

from experiments.claims import judge as C
from experiments.claims.report import control_lines
from experiments.lab import emergence as E
from experiments.lab import provenance as P
from experiments.lab import stats as S
from experiments.lab.markdown import fmt
from experiments.lab.markdown import table as _table
from experiments.laziness_map import cells as L


def _count(recs: list[dict], kind: str) -> str:
    return f"{sum(r['kind'] == kind for r in recs)} of {len(recs)}"


def _exact(recs: list[dict], kind: str) -> str:
    return S.share_text(sum(r["kind"] == kind for r in recs), len(recs))


def map_section(lcfg, cells, pending=None) -> list[str]:
    seq_len = lcfg.base["seq_len"]
    done = sum(len(v) for v in cells.values())
    planned = L.planned(lcfg)
    lines = [
        "## 1. The laziness map: how much far supervision a long window needs",
        "",
        f"SWAX (SX, 2 layers, d_model {lcfg.base['model']['d_model']}) trained with a fixed "
        f"window W at T = {seq_len} on 10 % text and 90 % one-pair recall episodes, "
        f"{C.tokens_m(lcfg):.1f}M tokens per run; the column is the share ρ of training answers "
        "that lie beyond W (every other answer lies inside it under the attention mask). Seeds "
        f"that end lazy / seeds run, [95 % Jeffreys interval] ({done} of {planned} planned runs"
        + ("; a cell marked – is not run yet" if done < planned else "")
        + "). "
        + L.ids_line(cells, pending),
        "",
        *L.share_table(lcfg, cells),
        "",
    ]
    for w in sorted(lcfg.grid.axes[L.WINDOW_AXIS]):
        zero = cells.get((w, "0%"), [])
        if zero:
            k = sum(r["kind"] == "lazy" for r in zero)
            lo, hi = S.jeffreys(k, len(zero))
            lines.append(
                f"- W = {w} (T/{seq_len // w}): with no answer beyond W, lazy in {k} of "
                f"{len(zero)} seeds (Jeffreys {lo:.0f}–{hi:.0f} %) and carried by the memory in "
                f"{_count(zero, 'memory')}."
            )
    iv = L.rho_intervals(cells)
    if len(iv) > 1:
        ws = sorted(iv)
        overlap = all(
            iv[a][1] >= iv[b][0] and iv[b][1] >= iv[a][0] for a in ws for b in ws if a < b
        )
        lines.append(
            "- ρ* by row, with its 95 % interval from the cells' Jeffreys posteriors (LAZINESS.md "
            "says why not a bootstrap): "
            + "; ".join(
                f"W = {w}: {L.rho_by_row(cells)[w].split(' (')[0]} {L.interval_text(*iv[w])}"
                for w in ws
            )
            + (
                ". The intervals overlap, so the map does not order the rows: with "
                f"{min(len(v) for v in cells.values())} seeds per cell it cannot say whether a "
                "wider window relative to T needs more or less far supervision."
                if overlap
                else "."
            )
        )
    lines += [
        "",
        "Per seed, with the probes and Wilson intervals: "
        "[LAZINESS.md](../laziness_map/LAZINESS.md).",
        "",
    ]
    return lines


def _rho_label(cfg) -> str:
    rho = C.far_share(cfg)
    return "ρ = 0" if rho == 0 else f"ρ = {100 * rho:g} %"


def claims_section(settings) -> list[str]:
    lines = [
        "## 2. The three claims, part by part",
        "",
        "T = 256, W_short = 8 (T/32), W_long = 32 (T/8), 30.7M tokens per run. Each part "
        "**held**, **did not hold**, or **cannot be shown at this scale**, by one rule: the 95 % "
        "interval of the part's quantity against its threshold (a seed share's exact interval "
        "against one half, a paired difference's t interval; CLAIMS.md gives each interval, "
        "the exact sign-flip p and how many seeds would settle what cannot be shown). One table "
        "per setting: the settings were trained on different episode ids.",
        "",
    ]
    for cfg, runs in settings:
        rows = []
        for family, roles in C.families_of(cfg).items():
            for c in C.judge(family, roles, runs, cfg):
                seeds = c["at"].rsplit(", ", 1)[-1] if c["at"] else ""
                for p in c["parts"]:
                    rows.append(
                        [
                            c["claim"].split(". ", 1)[0],
                            p["part"],
                            p["verdict"] + (f" ({seeds})" if seeds else ""),
                        ]
                    )
        lines += [
            f"**{_rho_label(cfg)}** ({P.label(C.ids_of(runs))}):",
            "",
            *_table(["claim", "part", "verdict"], rows),
            "",
        ]
    lines += ["Controls (a long window: the positive one should be lazy, the negative not):", ""]
    for cfg, runs in settings:
        lines += control_lines(cfg, runs)
    lines.append("")
    return lines


def delay_section(settings) -> list[str]:
    lines = [
        "## 3. When the memory emerged: a censored time, paired by seed",
        "",
        "Short and long runs with the same seed share their initialisation and data, so they "
        "pair. The memory has emerged at the first checkpoint where recall in (W_long, T] is "
        "≥ 50 % on ≥ 64 episodes and the next checkpoint holds it; checkpoints at most 1M tokens "
        "apart. Emergence at the first checkpoint is left-censored, none within the run "
        "right-censored (that run is lazy at the budget, not late); a pair counts in the sign "
        "test only when the censoring leaves its order known, and a factor long / short is given "
        "only where both emerged. Per family, without pooling:",
        "",
    ]
    for cfg, runs in settings:
        for d in C.delays(cfg, runs).values():
            if "left_out" in d:
                lines.append(f"- **{d['head']}**: left out: {d['left_out']}.")
            else:
                lines.append(f"- **{d['head']}**: {E.summary(d['pairs'], C.tokens_m(cfg))}")
    lines += ["", "Per seed: [CLAIMS.md](../claims/CLAIMS.md).", ""]
    return lines


def delay_sentence(cfg, sruns) -> str:
    """The delay of one setting, per family: the sign test on the pairs whose order is known
    and the runs that never emerged; or why the setting is left out ("" without runs)."""
    ds = C.delays(cfg, sruns)
    read = {f: d["pairs"] for f, d in ds.items() if "pairs" in d}
    if not ds:
        return ""
    if not read:
        return f"not read at {_rho_label(cfg)}: " + next(iter(ds.values()))["left_out"] + "."
    parts = [
        f"{f}: the long window emerged later in {d['later']}, earlier in {d['earlier']} and in "
        f"an order censoring hides in {d['hidden']} of {len(d['rows'])} pairs (exact sign test "
        f"two-sided p = {fmt(d['p_two'], 3)}), and never within {C.tokens_m(cfg):.1f}M tokens "
        f"in {d['never']['long']} of {d['runs']['long']} seeds (lazy at that budget)"
        for f, d in read.items()
    ]
    shown = any(d["p_two"] <= 0.05 for d in read.values())
    return (
        f"at {_rho_label(cfg)}, per family (censored times), "
        + "; ".join(parts)
        + ("." if shown else ". No family shows at 95 % that the long window delays the memory.")
    )


def delay_reading(settings) -> list[str]:
    """One bullet per setting on when the memory emerged."""
    return [
        f"- **When the memory emerged,** {text}"
        for cfg, sruns in settings
        if (text := delay_sentence(cfg, sruns))
    ]


def ids_paragraph(cells, settings) -> str:
    """Which episode ids each part of the study was trained with."""
    parts = [f"the map (section 1) was trained on {P.label(L.ids_of(cells))}"]
    parts += [
        f"the claims at {_rho_label(cfg)} on {P.label(C.ids_of(runs))}" for cfg, runs in settings
    ]
    return (
        "Episode ids: " + "; ".join(parts) + "; the text-only runs have no episodes. A table "
        "never mixes runs of two id ranges (provenance.py refuses it)."
    )

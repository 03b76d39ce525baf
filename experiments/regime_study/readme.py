"""The README's regime reading: a table (model and setting × claim → verdict, with the headline
numbers), a few plain sentences and the laziness map's figure, all written here from the
committed results (REPORT.md keeps the full text; docs/studies.md the design)."""

from __future__ import annotations

import re

from experiments.claims import judge as C
from experiments.lab import stats as S
from experiments.lab.cli import ROOT
from experiments.lab.markdown import table
from experiments.laziness_map import cells as L
from experiments.text_study import readings as TS

README = ROOT / "README.md"
BEGIN = "<!-- regime-reading:begin (written by python -m experiments.regime_study report) -->"
END = "<!-- regime-reading:end -->"
FIGURE = "experiments/laziness_map/laziness_share.png"
"""The picture: the laziness map's lazy share by far share and window (its report makes it)."""
CLAIMS = (
    "1. a short window teaches the memory",
    "2. a long window is lazy",
    "3. the stochastic schedule gets both",
)
SHORT = {"cannot be shown at this scale": "cannot be shown"}
PARTS = {
    "beyond W_long": "recall beyond W_long",
    "beyond T": "recall beyond T",
    "lazy": "laziness",
    "recall": "recall",
    "quality": "quality",
}
"""The claims' parts (experiments.claims.judge.PARTS) in a sentence."""


def _mean(recs: list[dict], key: str) -> float:
    return sum(r[key] for r in recs) / len(recs)


def _lazy(recs: list[dict]) -> str:
    return f"{sum(r['kind'] == 'lazy' for r in recs)} of {len(recs)}"


def _count(items: list) -> str:
    return {0: "none", 1: "one"}.get(len(items), str(len(items)))


def _setting(cfg) -> str:
    rho = C.far_share(cfg)
    return "no far answer" if rho == 0 else f"{100 * rho:g} % far answers"


def _prediction(reading: str) -> tuple[str, str]:
    """('not lazy', 'refuted'): what the map predicted and the verdict against it, from the
    text study's reading of the map's prediction."""
    predicted = re.search(r"predicted ([a-z ]+)", reading)
    return (predicted.group(1) if predicted else "–"), reading.split(" (")[0]


def _word(verdict: str) -> str:
    return SHORT.get(verdict, verdict)


def episode_row(cfg, runs, family: str, roles: dict) -> list[str] | None:
    """One setting and family of the claims: each claim's verdict and its headline number."""
    js = C.judge(family, roles, runs, cfg)
    if js[0]["verdict"] == "not yet run":
        return None
    s, lg, st = (runs[roles[r]] for r in ("short", "long", "stochastic"))
    where = _setting(cfg)
    mem = sum(r["beyond"] >= 50 for r in s)
    lazy = sum(r["kind"] == "lazy" for r in lg)
    return [
        f"{family}, episodes, {where}",
        f"{_word(js[0]['verdict'])}: {mem}/{len(s)} short seeds recall ≥ 50 % beyond "
        f"W_long, {_mean(s, 'beyond_T'):.0f} % beyond T",
        f"{_word(js[1]['verdict'])}: {lazy}/{len(lg)} long seeds lazy",
        f"{_word(js[2]['verdict'])}: stochastic {_mean(st, 'beyond'):.0f} % beyond W_long "
        f"(short {_mean(s, 'beyond'):.0f} %, long {_mean(lg, 'beyond'):.0f} %)",
    ]


def text_row(r: dict) -> list[str]:
    """One family on one corpus of the text study, read by its fixed rule."""
    head = f"{r['family']}, text only ({'code' if r['corpus'] == 'pystdlib' else 'prose'})"
    if "seeds" not in r:
        return [head, "control: at W = 8 no copy beyond 32", _word(r["verdict"]), "–"]
    lazy = sum(p["reading"] == "lazy" for p in r["seeds"])
    quality = _word(r.get("quality", {}).get("verdict", "not read"))
    return [
        head,
        "control: at W = 8 the memory copies beyond 32",
        f"{r['verdict']}: {lazy}/{len(r['seeds'])} seeds",
        f"memory half {_word(r['memory_half'])}, quality half {quality}",
    ]


def claims_table(settings, records) -> list[str]:
    rows = [
        row
        for cfg, runs in settings
        for family, roles in C.families_of(cfg).items()
        if (row := episode_row(cfg, runs, family, roles))
    ]
    rows += [text_row(r) for r in records]
    return table(["model, training data", *CLAIMS], rows)


def sentences(settings, cells, records) -> list[str]:
    """The reading in plain sentences, each number read from the committed results."""
    out = []
    rho0 = next(((c, r) for c, r in settings if C.far_share(c) == 0), None)
    near = settings[0][1]
    if rho0:
        cfg, runs = rho0
        fams = [f for f in C.families_of(cfg) if runs.get(f"{f.lower()}-long")]
        longs = [runs[f"{f.lower()}-long"] for f in fams]
        old = [near.get(f"{f.lower()}-long-near", []) for f in fams]
        every = all(r["kind"] == "lazy" for recs in longs for r in recs)
        out.append(
            "Laziness is there" + ("" if every else ", but not in every seed") + ": with no "
            "answer beyond the window in training, a long window of T/8 ended lazy in "
            + " and ".join(f"{_lazy(recs)} {f}" for f, recs in zip(fams, longs))
            + " seeds"
            + (
                " (" + " and ".join(_lazy(recs) for recs in old) + " with episode ids the text "
                "also holds)"
                if all(old)
                else ""
            )
            + "."
        )
    w = settings[0][0].base["window"]["long"]
    if (w, "0%") in cells:
        cols = L.numeric_columns(cells, w)
        rho = L.rho_star_value([(float(c[:-1]) / 100, L.lazy_share(cells[(w, c)])) for c in cols])
        lo, hi = L.rho_star_interval(cells, w, cols)
        out.append(
            f"A little far supervision ends it: half the seeds stay lazy up to ρ* = "
            f"{100 * rho:.3g} % of the training answers beyond W = T/8 (95 % interval "
            f"{100 * lo:.3g}–{100 * hi:.3g} %)."
        )
    parts = [
        (p["verdict"], f"claim {c['claim'][0]}'s {PARTS[p['part']]}, {family}, {_setting(cfg)}")
        for cfg, runs in settings
        for family, roles in C.families_of(cfg).items()
        for c in C.judge(family, roles, runs, cfg)
        for p in c["parts"]
        if p["verdict"] != "not yet run"
    ]
    held = [w for v, w in parts if v == "held"]
    failed = [w for v, w in parts if v == "did not hold"]
    seeds = min(len(recs) for _, runs in settings for recs in runs.values() if recs)
    out.append(
        f"With {seeds} seeds per window, {_count(held)} of the {len(parts)} parts of the "
        f"three claims held"
        + (f" ({', '.join(held)})" if held else "")
        + f" and {_count(failed)} did not"
        + (f" ({', '.join(failed)})" if failed else "")
        + f"; the others cannot be shown at this scale (no share of {seeds} seeds can show "
        f"'most seeds': even {S.share_text(seeds, seeds)} contains one half), and REPORT.md "
        "says how many seeds would settle each."
    )
    text = [r for r in records if "seeds" in r]
    if text:
        predicted = {_prediction(r["map"])[0] for r in text}
        out.append(
            "On text alone, by a rule fixed before the runs, the long window was "
            + " and ".join(
                f"{r['verdict']} for {r['family']} on code "
                f"({sum(p['reading'] == 'lazy' for p in r['seeds'])} of {len(r['seeds'])} seeds "
                "lazy)"
                for r in text
            )
            + (
                f", where the laziness map predicted {predicted.pop()} ("
                if len(predicted) == 1
                else " (the laziness map's prediction: "
            )
            + "; ".join(f"{_prediction(r['map'])[1]} for {r['family']}" for r in text)
            + ")."
        )
    return out


def block() -> str:
    """The README's block between BEGIN and END."""
    settings = C.load_settings()
    _, _, cells, _ = L.map_of_record()
    records = TS.verdicts()
    lines = [
        *claims_table(settings, records),
        "",
        " ".join(sentences(settings, cells, records)),
        "",
        f"![The laziness map: the share of seeds that end lazy, by the share of training answers "
        f"beyond the window, per window]({FIGURE})",
    ]
    return "\n".join(lines)

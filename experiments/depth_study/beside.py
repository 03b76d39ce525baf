"""The depth study beside the paper and the 2-layer text study (issue 59, item 6): per claim and
family, what the paper reports, the 2-layer study's verdict (recomputed from its committed
results by :mod:`experiments.text_study.readings`), this study's, and whether depth changed it."""

from __future__ import annotations

from experiments.depth_study import rule as R
from experiments.lab.markdown import table

PAPER = {
    "1": "held: W 128 keeps NIAH accuracy at 131k after training at 16k",
    "2": "held: W 2048's NIAH accuracy collapses past its window; W 128's does not",
    "3m": "held: the stochastic run matches or beats W 128 at long context",
    "3q": "held: the stochastic run recovers W 2048's short-context scores",
}
"""The paper's findings (1.4B and 7B models, 150B tokens, T = 16k, W 128 against 2048)."""

TEXT_AS_RULE = {"lazy": "held", "not lazy": "did not hold"}
"""The 2-layer rule's claim-2 family verdicts in the depth rule's words."""


def _n_of(seeds: list[dict], key: str, value) -> str:
    return f"{sum(s[key] == value for s in seeds)} of {len(seeds)}"


def _changed(depth: str, two: str | None) -> str:
    """Whether depth changed a verdict: only once both are verdicts."""
    if depth.startswith(("incomplete", "pending")):
        return "not yet"
    if depth.startswith("cannot decide"):
        return "no verdict at this depth"
    if two is None or two.startswith(("cannot", "not yet", "–")):
        return "– (no 2-layer verdict)"
    two = TEXT_AS_RULE.get(two, two)
    return f"no (both {depth})" if depth == two else f"yes: {two} → {depth}"


def _gaps(f: dict) -> list[float]:
    """Per paired seed: text loss(short) − loss(long), each at its own window."""
    return [x["gap"] for x in f.get("gaps", [])]


def _up(gaps: list[float]) -> str:
    """How many seeds have the short window's loss above the long one's."""
    return f"{sum(g > 0 for g in gaps)} of {len(gaps)}"


def _premise(gaps: list[float]) -> str:
    if not gaps:
        return "–"
    return f"short − long > 0 in {_up(gaps)} seeds (mean {sum(gaps) / len(gaps):+.4f})"


def _premise_moved(two: list[float], four: list[float]) -> str:
    """The quality half's premise (a short window costs quality) at 2 layers → at 4."""
    if not two or not four:
        return ""
    return f"; short − long > 0: {_up(two)} → {_up(four)} seeds"


def rows_for(name: str, f: dict, text: dict | None) -> list[list[str]]:
    """The four rows (claims 1, 2, 3's halves) of one family."""
    n, holds, lazy, seen = R.tally(f)
    t = text or {}
    t_seeds, t128 = t.get("seeds", []), t.get("w128") or {}
    two_2 = t.get("verdict")  # W 64 = T/4 there: the nearer ratio to this study's T/8
    text_2 = two_2 or "–"
    if t_seeds:
        text_2 = f"W 64: {two_2} (lazy in {_n_of(t_seeds, 'reading', 'lazy')})"
    if t128:
        lazy128 = _n_of(t128["seeds"], "reading", "lazy")
        text_2 += f"; W 128: {t128['verdict']} (lazy in {lazy128})"
    rows = [
        [
            "1: retrieval beyond T",
            name,
            PAPER["1"],
            "not measured (beyond T, reach and position were confounded)",
            f"{f['v1']} (holds in {holds} of {n})",
            "– (first measured here)",
        ],
        [
            "2: a long window is lazy",
            name,
            PAPER["2"],
            text_2,
            f"{f['v2']} (lazy in {lazy} of {n}; mechanism seen in {seen})",
            _changed(f["v2"], two_2),
        ],
    ]
    t_mem = t.get("memory_half", "–")
    q = t.get("quality") or {}
    t_gaps = [v[0] - v[1] for v in t.get("loss", {}).values()]
    t_q = q.get("verdict", "–")
    if t_gaps:
        t_q += f"; {_premise(t_gaps)}"
    gaps = _gaps(f)
    d_gaps, moved = _premise(gaps), _premise_moved(t_gaps, gaps)
    if "c3" in f:
        keeps = _n_of(f["c3"], "reading", "keeps")
        d_mem, d_q = f"{f['v3m']} (keeps in {keeps})", f"{f['q3']['verdict']}; {d_gaps}"
        ch_m, ch_q = _changed(f["v3m"], t_mem), _changed(f["q3"]["verdict"], q.get("verdict"))
    else:
        d_mem, d_q = "– (no stochastic arm)", f"– (no stochastic arm); {d_gaps}"
        ch_m = ch_q = "–"
    ch_q += moved
    rows += [
        ["3: stochastic keeps the memory", name, PAPER["3m"], t_mem, d_mem, ch_m],
        ["3: stochastic keeps the quality", name, PAPER["3q"], t_q, d_q, ch_q],
    ]
    return rows


def beside_section(fams: dict, text: list[dict] | None) -> list[str]:
    """REPORT.md's section: one table, the paper | 2 layers | 4 layers | changed."""
    by_fam = {r["family"]: r for r in (text or []) if r.get("corpus") == "pystdlib"}
    head = [
        "claim",
        "family",
        "the paper",
        "2 layers (T 256, W 8 vs 64 and 128, 5 seeds)",
        "4 layers (T 1024, W 8 vs 128)",
        "did depth change it?",
    ]
    rows = [r for name, f in fams.items() for r in rows_for(name, f, by_fam.get(name))]
    return [
        "## Beside the paper and the 2-layer study",
        "",
        "The paper: 1.4B and 7B models, 150B tokens, T = 16k, W 128 (T/128) against 2048 (T/8). "
        "The 2-layer text study (experiments/text_study, recomputed from its committed results): "
        "pystdlib, 2 layers of d_model 64, 30.7M tokens, stochastic 8 / 64. Here: pystdlib, 4 "
        "layers of d_model 128, 30.7M tokens, stochastic 8 / 128. The quality half needs a short "
        "window that costs quality (short − long > 0): that premise, per seed, is printed "
        "beside it.",
        "",
        *table(head, rows),
        "",
    ]

"""The paper's three claims in its regime, judged part by part on recall by distance bucket.

Two settings, each a sweep whose every run leaves ``results/<archive>/NAME/seedS.json``
(committed): ``claims.yaml`` (1 % of the training answers beyond W_long, with controls) and
``claims_rho0.yaml`` (no answer beyond W_long, where the long window is lazy). The report is
built from those files alone, one setting per table (a setting that mixes episode id ranges is
refused, provenance.py). Per family (SX: mLSTM, SD: Gated DeltaNet), with W_short = T/32 and
W_long = T/8, each claim is judged in parts by the one verdict rule of verdicts.py (held / did
not hold / cannot be shown at this scale, from the 95 % interval of the part's quantity against
its threshold), and every verdict names the far share, tokens and seeds it was made at:

1. a short training window makes the recurrent layers learn recall beyond the window:
   (a) beyond W_long: the share of short-window seeds that recall >= 50 % in (W_long, T],
   against one half (exact interval);
   (b) beyond T: per seed, recall beyond T minus half the recall in (W_long, T], against 0
   (t interval; cannot be shown when (a) did not hold);
2. with a long window the model relies on attention: the share of long-window seeds that end
   lazy (>= 90 % inside W_long, within 10 points of chance beyond it), against one half;
3. stochastic training gets both: (a) recall in (W_long, T], per seed: stochastic minus 3/4 of
   short against 0 and stochastic minus long against 10 points, both must hold (cannot be shown
   when the long window already recalls >= 90 % there); (b) quality: the short window's
   text-loss cost over the long window, paired by seed, must be measurably positive (else
   cannot be shown), and then, per seed, half the cost minus the stochastic runs' gap to the
   long window, against 0.

The controls (long window, every answer inside it / uniform distances) say whether a setting
can show laziness at all. When the memory emerged is a censored time (emergence.py): the delay
section pairs short and long by seed, counts the pairs whose order the censoring does not hide,
and gives a factor only where both emerged.
"""

from __future__ import annotations

import math
from pathlib import Path

from experiments.lab import emergence as E
from experiments.lab import provenance as P
from experiments.lab import verdicts as V
from experiments.lab.cli import archived
from experiments.lab.markdown import fmt
from experiments.lab.recall import record
from swax.sweep import load_sweep

HERE = Path(__file__).resolve().parent
SETTINGS = ("claims.yaml", "claims_rho0.yaml")
"""The claims' settings, in the report's order: rho = 1 % (with the controls), then rho = 0."""
MEMORY = {"SX": "mLSTM", "SD": "Gated DeltaNet"}
CONTROLS = (
    ("long-near", "positive control: every training answer inside W_long"),
    ("long-uniform", "negative control: uniform distances"),
)
HELD, NOT, CANNOT = V.HELD, V.NOT, V.CANNOT
PARTS = (("beyond W_long", "beyond T"), ("lazy",), ("recall", "quality"))
"""The parts of claims 1, 2 and 3."""


def load_runs(cfg) -> dict[str, list[dict]]:
    """{run name: [record per archived seed]} (experiments.lab.recall.record), each with its
    episode ids ("ids", provenance.run_ids); a SwaxError when the setting mixes id ranges."""
    out: dict[str, list[dict]] = {name: [] for name in cfg.runs}
    for name, seed, ev in archived(cfg):
        out[name].append({**record(ev, seed), "ids": P.run_ids(ev, cfg, name, seed)})
    where = Path(cfg.archive).name if cfg.archive else cfg.name
    P.one_range([(n, r["seed"], r["ids"]) for n, rs in out.items() for r in rs], where)
    return out


def ids_of(runs: dict[str, list[dict]]) -> dict | None:
    """The episode ids of a setting's runs (one range: load_runs checked it)."""
    return next((r["ids"] for rs in runs.values() for r in rs if r.get("ids")), None)


def load_settings(names=SETTINGS) -> list[tuple]:
    """[(config, runs)] of each claims setting, from the committed archives."""
    out = []
    for name in names:
        cfg = load_sweep(HERE / name)
        out.append((cfg, load_runs(cfg)))
    return out


def _mean(recs, key) -> float:
    xs = [r[key] for r in recs if r[key] == r[key]]
    return sum(xs) / len(xs) if xs else math.nan


def _share(recs, kind) -> str:
    return f"{sum(r['kind'] == kind for r in recs)}/{len(recs)}"


def far_share(cfg) -> float | None:
    return cfg.base["data"]["synthetic"].get("far_share")


def tokens_m(cfg) -> float:
    b = cfg.base
    return b["steps"] * b["batch_size"] * b["seq_len"] / 1e6


def setting_text(cfg, seeds: int) -> str:
    """'ρ = 1 %, 30.7M tokens, 4 seeds': where a verdict was made."""
    rho = far_share(cfg)
    share = "uniform distances" if rho is None else "ρ = 0" if rho == 0 else f"ρ = {100 * rho:g} %"
    return f"{share}, {tokens_m(cfg):.1f}M tokens, {seeds} seed{'s' * (seeds != 1)}"


def by_seed(*roles: list[dict]) -> list[tuple]:
    """Records of the same seed in every one of ``roles``, in seed order."""
    maps = [{r["seed"]: r for r in recs} for recs in roles]
    seeds = sorted(set.intersection(*(set(m) for m in maps)))
    return [tuple(m[x] for m in maps) for x in seeds]


def per_seed(recs: list[dict], key: str) -> str:
    return ", ".join(fmt(r[key]) for r in recs)


def _describe(res: dict, digits: int = 1, unit: str = "") -> str:
    """'m unit (95 % t interval lo to hi, exact sign-flip p = P)' of a difference that is
    shown but not judged."""
    lo, hi = res["ci"]
    return (
        f"{fmt(res['mean'], digits)}{unit} (95 % t interval {fmt(lo, digits)} to "
        f"{fmt(hi, digits)}, exact sign-flip p = {fmt(res['p'], 2)})"
    )


def claim_names(family: str) -> list[str]:
    mem = MEMORY.get(family, "recurrent")
    return [
        f"1 ({family}). A short training window makes the {mem} layers learn recall that "
        "reaches beyond the long window and the training length.",
        f"2 ({family}). With a long window the model relies on attention (it is lazy).",
        f"3 ({family}). Stochastic window training gets the short-context quality of the long "
        "window and the long-range recall of the short window.",
    ]


def judge(family: str, roles: dict[str, str], runs: dict[str, list[dict]], cfg=None) -> list:
    """The three claims of one family in one setting, each part by the verdict rule
    (verdicts.py): [{"claim", "verdict", "parts": [{"part", "verdict", "evidence"}], "at"}]. A
    family whose runs are not all there is "not yet run"."""
    s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
    names = claim_names(family)
    if not (s and lg and st):
        return [
            {
                "claim": n,
                "verdict": "not yet run",
                "at": "",
                "parts": [{"part": p, "verdict": "not yet run", "evidence": ""} for p in parts],
            }
            for n, parts in zip(names, PARTS)
        ]
    n_seeds = min(len(s), len(lg), len(st))
    at = setting_text(cfg, n_seeds) if cfg is not None else f"{n_seeds} seeds"
    parts = [claim_1(s), claim_2(s, lg, roles), claim_3(s, lg, st, roles)]
    return [
        {"claim": n, "verdict": V.combine([p["verdict"] for p in ps]), "parts": ps, "at": at}
        for n, ps in zip(names, parts)
    ]


def claim_1(s: list[dict]) -> list[dict]:
    """(a) most short-window seeds recall >= 50 % in (W_long, T]: a seed share against one
    half; (b) recall beyond T keeps at least half of that: per seed, recall beyond T minus half
    the recall in (W_long, T], against 0 (cannot be shown when (a) did not hold)."""
    k_mem = sum(r["beyond"] >= 50 for r in s)
    sh = V.share(k_mem, len(s))
    ev_a = (
        V.share_text(sh, "short-window seeds with ≥ 50 % in (W_long, T]")
        + f". Recall there per seed {per_seed(s, 'beyond')} (mean {fmt(_mean(s, 'beyond'), 1)})."
    )
    if sh["verdict"] == V.NOT:
        b, ev_b = V.CANNOT, "the short window learned no recall beyond W_long to extend."
    elif any(r["beyond_T"] != r["beyond_T"] for r in s):
        b, ev_b = V.CANNOT, "recall beyond T was not evaluated."
    else:
        res = V.paired([r["beyond_T"] - r["beyond"] / 2 for r in s])
        b = res["verdict"]
        ev_b = (
            f"recall beyond T per seed {per_seed(s, 'beyond_T')} against half the recall in "
            f"(W_long, T] ({', '.join(fmt(r['beyond'] / 2, 1) for r in s)}). "
            + V.paired_text(res, "Beyond T minus that half", 1, "0")
            + "."
        )
    return [
        {"part": "beyond W_long", "verdict": sh["verdict"], "evidence": ev_a},
        {"part": "beyond T", "verdict": b, "evidence": ev_b},
    ]


def claim_2(s: list[dict], lg: list[dict], roles: dict) -> list[dict]:
    """Most long-window seeds end lazy: a seed share against one half."""
    sh = V.share(sum(r["kind"] == "lazy" for r in lg), len(lg))
    pairs = by_seed(s, lg)
    d = V.paired([a["beyond"] - b["beyond"] for a, b in pairs])
    ev = (
        V.share_text(sh, f"{roles['long']} seeds that end lazy")
        + f" (verdicts {', '.join(r['kind'] for r in lg)}; inside W_long "
        f"{per_seed(lg, 'inside')}, beyond it {per_seed(lg, 'beyond')}). Short minus long "
        f"beyond W_long, paired by seed: {_describe(d, 1, ' points')}."
    )
    return [{"part": "lazy", "verdict": sh["verdict"], "evidence": ev}]


def claim_3(s: list[dict], lg: list[dict], st: list[dict], roles: dict) -> list[dict]:
    """(a) recall in (W_long, T]: the stochastic runs reach at least 3/4 of the short window's
    and 10 points above the long window's, both per seed (cannot be shown when the long window
    already recalls >= 90 % there); (b) quality: the short window's text-loss cost over the long
    window must be measurably positive, and the stochastic runs within half of it of the long
    window (per seed: half the cost minus the stochastic runs' gap, against 0)."""
    trio = by_seed(s, lg, st)
    lb = _mean(lg, "beyond")
    if lb >= 90:
        r3 = V.CANNOT
        ev_r = (
            f"recall in (W_long, T]: {roles['stochastic']} {fmt(_mean(st, 'beyond'), 1)}, short "
            f"{fmt(_mean(s, 'beyond'), 1)}, long {fmt(lb, 1)}: the long window already recalls "
            "≥ 90 % there, so the schedule has nothing to add."
        )
    else:
        r1 = V.paired([c["beyond"] - 0.75 * a["beyond"] for a, _, c in trio])
        r2 = V.paired([c["beyond"] - b["beyond"] for _, b, c in trio], threshold=10.0)
        r3 = V.all_of([r1["verdict"], r2["verdict"]])
        ev_r = (
            f"recall in (W_long, T] per seed: {roles['stochastic']} "
            f"{', '.join(fmt(c['beyond']) for *_, c in trio)}, short "
            f"{', '.join(fmt(a['beyond']) for a, *_ in trio)}, long "
            f"{', '.join(fmt(b['beyond']) for _, b, _ in trio)}; held means both of: "
            + V.paired_text(r1, "stochastic minus 3/4 of short", 1, "0")
            + "; "
            + V.paired_text(r2, "stochastic minus long", 1, "10 points")
            + "."
        )
    q, ev_q = quality(trio)
    return [{"part": "recall", "verdict": r3, "evidence": ev_r},
            {"part": "quality", "verdict": q, "evidence": ev_q}]  # fmt: skip


def quality(trio: list[tuple]) -> tuple[str, str]:
    """Claim 3's quality part from (short, long, stochastic) records of the same seed."""
    cost = V.paired([a["text"] - b["text"] for a, b, _ in trio])
    head = (
        "held-out text loss at T (nats/byte): short "
        f"{fmt(_mean([a for a, *_ in trio], 'text'), 4)}, long "
        f"{fmt(_mean([b for _, b, _ in trio], 'text'), 4)}, stochastic "
        f"{fmt(_mean([c for *_, c in trio], 'text'), 4)}. "
        + V.paired_text(cost, "The short window's cost (short minus long, paired by seed)", 4, "0")
        + ". "
    )
    read = [x - c["text"] for *_, c in trio if (x := c.get("text_short_read", math.nan)) == x]
    same = (
        f" The same stochastic models read at W_short instead of W_long lose {min(read):.4f} to "
        f"{max(read):.4f} nats/byte."
        if read
        else ""
    )
    if cost["n"] < 2:
        return V.CANNOT, head + "Fewer than two paired seeds." + same
    if cost["verdict"] == V.NOT:
        return V.CANNOT, (
            head + "There is no cost to recover: the short window's text loss is *lower* "
            "than the long window's." + same
        )
    if cost["verdict"] == V.CANNOT:
        return V.CANNOT, (
            head + "The cost is not shown to be there, so there is nothing to recover." + same
        )
    gap = V.paired([c["text"] - b["text"] for _, b, c in trio])
    e = V.paired([(a["text"] + b["text"]) / 2 - c["text"] for a, b, c in trio])
    return e["verdict"], (
        head + f"The stochastic runs minus the long window: {_describe(gap, 4)}, against half "
        f"the cost ({fmt(cost['mean'] / 2, 4)}). "
        + V.paired_text(e, "Per seed, half the cost minus the stochastic runs' gap", 4, "0")
        + "."
        + same
    )


def families_of(cfg) -> dict[str, dict]:
    return {"SX": cfg.roles, **cfg.families}


# ------------------------------------------------------------------------------ the delay


def delays(cfg, runs) -> dict[str, dict]:
    """Per family of one setting: {"head", "pairs" (emergence.pairs) or "left_out" (why the
    runs cannot be read with the censored definition)}; families without short and long runs
    are left out."""
    out = {}
    ids = ids_of(runs)
    for family, roles in families_of(cfg).items():
        s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
        if not (s and lg):
            continue
        head = f"{family}, {setting_text(cfg, min(len(s), len(lg)))}"
        why = sorted({E.unreadable(r) for r in s + lg + st} - {""})
        if why:
            old = f"; and they were trained on {P.label(ids)}" if ids and ids["old"] else ""
            out[family] = {"head": head, "left_out": f"the runs have {'; '.join(why)}{old}"}
        else:
            out[family] = {"head": head, "pairs": E.pairs(s, lg, st)}
    return out


# ------------------------------------------------------------------------------ the report

"""The paper's three claims in its regime, judged part by part on recall by distance bucket.

    python experiments/regime_study/claims.py                  # CLAIMS.md from both archives
    python experiments/regime_study/claims.py --run --jobs 2   # train/evaluate claims.yaml's runs
    python experiments/regime_study/claims.py --config claims_rho0.yaml --run   # the rho = 0 runs
    python experiments/regime_study/claims.py --quick --run --report-dir DIR    # CI smoke test

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

import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import emergence as E  # noqa: E402
import provenance as P  # noqa: E402
import stats as S  # noqa: E402
import verdicts as V  # noqa: E402
from laziness import fmt, record  # noqa: E402
from studycli import prepare, run  # noqa: E402

from swax.sweep import archive_path, load_sweep  # noqa: E402

REPORT = "CLAIMS.md"
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
    """{run name: [record per archived seed]} (see laziness.record), each with its episode ids
    ("ids", provenance.run_ids); a SwaxError when the setting mixes id ranges."""
    out = {}
    for name in cfg.runs:
        recs = []
        for seed in cfg.seeds:
            path = archive_path(cfg, name, seed)
            if path is not None and path.is_file():
                ev = json.loads(path.read_text())
                recs.append({**record(ev, seed), "ids": P.run_ids(ev, cfg, name, seed)})
        out[name] = recs
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


def wilson_text(k: int, n: int) -> str:
    from swax.probes.buckets import wilson

    if not n:
        return "–"
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.0f} [{lo:.0f}–{hi:.0f}]"


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


def delay_lines(cfg, runs) -> list[str]:
    """The paired emergence table and the sign test per family of one setting (emergence.py),
    or why the setting's runs are left out of the delay reading."""
    out = []
    for d in delays(cfg, runs).values():
        if "left_out" in d:
            out += [f"**{d['head']}**: left out of the delay reading: {d['left_out']}.", ""]
            continue
        p = d["pairs"]
        out += [
            f"**{d['head']}**: tokens (M) until the memory emerged (recall in (W_long, T] ≥ 50 % "
            f"on ≥ {E.MIN_EPISODES} episodes at a checkpoint and at the next; checkpoints every "
            f"{fmt(p['spacing'], 2)}M tokens at most). '≤ x': at the first checkpoint "
            "(left-censored); 'a–b': between two checkpoints; '> x (never)': not within the run "
            "(right-censored). long / short: the range the two intervals allow, only where both "
            "emerged and the order is known.",
            "",
            *_table(
                ["seed", "short", "long", "stochastic", "order", "long / short"],
                [
                    [
                        str(r["seed"]),
                        E.cell(r["short"]),
                        E.cell(r["long"]),
                        E.cell(r["stochastic"]),
                        r["order"],
                        E.factor_text(r["factor"]),
                    ]
                    for r in p["rows"]
                ],
            ),
            "",
            E.summary(p, tokens_m(cfg)),
            "",
        ]
    return out


# ------------------------------------------------------------------------------ the report


def _table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def verdict_lines(cfg, runs) -> list[str]:
    lines = []
    for family, roles in families_of(cfg).items():
        have = min(len(runs.get(n, [])) for n in roles.values())
        for c in judge(family, roles, runs, cfg):
            verdict = c["verdict"]
            if verdict != "not yet run" and have < len(cfg.seeds):
                verdict += f" (provisional: {have} of {len(cfg.seeds)} seeds)"
            at = f" ({c['at']})" if c["at"] else ""
            lines += [f"**{c['claim']}** — **{verdict}**{at}.", ""]
            if c["verdict"] != "not yet run":
                lines += [
                    f"- *{p['part']}*: **{p['verdict']}**. {p['evidence']}" for p in c["parts"]
                ] + [""]
    return lines


def control_lines(cfg, runs) -> list[str]:
    lines = []
    for family in families_of(cfg):
        for suffix, what in CONTROLS:
            name = f"{family.lower()}-{suffix}"
            if name not in cfg.runs:
                continue
            recs = runs.get(name, [])
            if recs:
                k = sum(r["kind"] == "lazy" for r in recs)
                lines.append(
                    f"- {name} ({what}; {setting_text(cfg, len(recs))}): lazy in "
                    f"{S.share_text(k, len(recs))} seeds, memory in {_share(recs, 'memory')}."
                )
            else:
                lines.append(f"- {name} ({what}): not yet run.")
    return lines


def run_rows(runs) -> list[list[str]]:
    def w(r, key):
        k, n = r["counts"][key] if "counts" in r else (0, 0)
        return wilson_text(k, n) if n else fmt(r[key if key != "inside" else "inside"])

    return [
        [
            name,
            str(r["seed"]),
            w(r, "inside"),
            w(r, "beyond"),
            w(r, "beyond_T"),
            fmt(r["cut_inner"]),
            fmt(r["reset_beyond"]),
            r["kind"],
            "–" if E.unreadable(r) else E.cell(E.censored(r)),
            fmt(r["text"], 4),
            fmt(r["minutes"], 1),
        ]
        for name, recs in runs.items()
        for r in recs
    ]


def write_report(settings, out: Path, command: str) -> Path:
    """CLAIMS.md in ``out`` from [(config, runs)] of the claims settings."""
    lines = [
        "# The paper's claims in its regime, judged by distance",
        "",
        f"Generated by `{command}` from the committed per-run results; nothing below is typed "
        "by hand. Design and attempts: [NOTES.md](NOTES.md); the far share comes from the "
        "laziness map ([LAZINESS.md](LAZINESS.md)).",
        "",
        "Each claim is judged in parts, each part by one rule (verdicts.py): **held** when the "
        "95 % interval of its quantity lies on the claim's side of its threshold, **did not "
        "hold** when it lies on the other side, **cannot be shown at this scale** when it "
        "contains the threshold, with how many seeds would settle it at the observed value and "
        'spread. A seed share ("most seeds") is judged by its exact (Clopper-Pearson) interval '
        "against one half: no share of 4 seeds can settle that (even 4 of 4 is 40–100 %). A "
        "paired difference over seeds is judged by its 95 % t interval, with the exact "
        "two-sided sign-flip p beside it (with 4 seeds it cannot go below 0.125), and, where it "
        "cannot be shown, the smallest true difference the design detects at 80 % power (exact "
        "noncentral t); a difference that is the same on every seed has a t interval of no "
        "width, and the sign-flip test decides it. Recall carries a 95 % Wilson interval "
        "[lo–hi].",
        "",
    ]
    for cfg, runs in settings:
        b = cfg.base
        rho = far_share(cfg)
        done = sum(len(v) for v in runs.values())
        title = "No answer" if rho == 0 else f"{100 * rho:g} % of the answers"
        lines += [
            f"## {title} beyond W_long (`{Path(cfg.archive).name}`)",
            "",
            f"- runs: {done} of {len(cfg.runs) * len(cfg.seeds)} planned ({len(cfg.runs)} runs × "
            f"seeds {cfg.seeds});",
            f"- T = {b['seq_len']}, W_short = {b['window']['short']}, W_long = "
            f"{b['window']['long']}; {b['steps']} steps × {b['batch_size']} sequences "
            f"({tokens_m(cfg):.1f}M tokens);",
            f"- {P.label(ids_of(runs))}"
            + (
                " — read from the archive's history (NOTES.md sections 8 and 9): these results "
                "predate the field that records them;"
                if ids_of(runs) and not ids_of(runs)["recorded"]
                else ";"
            ),
            "- recall (%) by distance bucket at the run's own window (the long one after a "
            f"stochastic schedule), {cfg.eval.bucket_samples} episodes per bucket; the text loss "
            f"on {cfg.eval.text_samples} held-out sequences of length T, also at the run's own "
            "window.",
            "",
            "### Verdicts",
            "",
            *verdict_lines(cfg, runs),
        ]
        ctrl = control_lines(cfg, runs)
        if ctrl:
            lines += ["### Controls", "", *ctrl, ""]
        lines += ["### When the memory emerged, paired by seed", "", *delay_lines(cfg, runs)]
        head = [
            "run",
            "seed",
            "inside W_long",
            "beyond W_long",
            "beyond T",
            "cut",
            "reset",
            "verdict",
            "memory emerged (M)",
            "text loss",
            "train min",
        ]
        lines += ["### Every run", "", *_table(head, run_rows(runs)), ""]
    path = out / REPORT
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    cfg, args, out, command = prepare(Path(__file__).name, __doc__, "claims.yaml", REPORT, argv)
    settings = [(cfg, load_runs(cfg))] if args.quick else load_settings()
    print(f"report: {write_report(settings, out, command)}")
    return 0


if __name__ == "__main__":
    run(main)

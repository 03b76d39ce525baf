"""The paper's three claims in its regime, judged part by part on recall by distance bucket.

    python experiments/regime_study/claims.py                  # CLAIMS.md from both archives
    python experiments/regime_study/claims.py --run --jobs 2   # train/evaluate claims.yaml's runs
    python experiments/regime_study/claims.py --config claims_rho0.yaml --run   # the rho = 0 runs
    python experiments/regime_study/claims.py --quick --run --report-dir DIR    # CI smoke test

Two settings, each a sweep whose every run leaves ``results/<archive>/NAME/seedS.json``
(committed): ``claims.yaml`` (1 % of the training answers beyond W_long, with controls) and
``claims_rho0.yaml`` (no answer beyond W_long, where the long window is lazy). The report is
built from those files alone. Per family (SX: mLSTM, SD: Gated DeltaNet), with W_short = T/32
and W_long = T/8, each claim is judged in parts, each part **held**, **did not hold** or
**cannot be shown at this scale** (the reason and, for a difference, the smallest one the design
detects), and every verdict names the far share, tokens and seeds it was made at:

1. a short training window makes the recurrent layers learn recall beyond the window:
   (a) beyond W_long: held when most short-window seeds recall >= 50 % in (W_long, T];
   (b) beyond T: held when the short window keeps at least half of that beyond T (cannot be
   shown when (a) did not hold);
2. with a long window the model relies on attention: held when most long-window seeds are lazy
   (>= 90 % inside W_long, within 10 points of chance beyond it);
3. stochastic training gets both: (a) recall: at least 3/4 of the short window's beyond W_long
   and 10 points above the long window's (cannot be shown when the long window already recalls
   >= 90 % there); (b) quality: the short window's text-loss cost over the long window, paired
   by seed, must be measurable (its 95 % interval excludes 0 and it is positive) and the
   stochastic runs within half of it of the long window; otherwise cannot be shown.

Seed shares carry exact (Clopper-Pearson) intervals, recall Wilson intervals, paired
differences a t interval and an exact sign-flip p-value (stats.py). The controls (long window,
every answer inside it / uniform distances) say whether a setting can show laziness at all.
When the memory emerged, paired by seed, is the delay section: tokens until recall beyond
W_long reaches 50 % (with the window-cut probe agreeing where the run has it).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import stats as S  # noqa: E402
from laziness import fmt, record  # noqa: E402
from studycli import load_archived, prepare, run  # noqa: E402

from swax.sweep import load_sweep  # noqa: E402

REPORT = "CLAIMS.md"
SETTINGS = ("claims.yaml", "claims_rho0.yaml")
"""The claims' settings, in the report's order: rho = 1 % (with the controls), then rho = 0."""
MEMORY = {"SX": "mLSTM", "SD": "Gated DeltaNet"}
CONTROLS = (
    ("long-near", "positive control: every training answer inside W_long"),
    ("long-uniform", "negative control: uniform distances"),
)
HELD, NOT, CANNOT = "held", "did not hold", "cannot be shown at this scale"
PARTS = (("beyond W_long", "beyond T"), ("lazy",), ("recall", "quality"))
"""The parts of claims 1, 2 and 3."""


def load_runs(cfg) -> dict[str, list[dict]]:
    """{run name: [record per archived seed]} (see laziness.record)."""
    return load_archived(cfg, record)


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


def _se(recs, key) -> float:
    xs = [r[key] for r in recs if r[key] == r[key]]
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan


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


def _paired_by_seed(a: list[dict], b: list[dict], key: str) -> dict:
    by_b = {r["seed"]: r[key] for r in b}
    pairs = [(r[key], by_b[r["seed"]]) for r in a if r["seed"] in by_b]
    return S.paired([x for x, _ in pairs], [y for _, y in pairs])


def _combine(parts: list[dict]) -> str:
    v = [p["verdict"] for p in parts]
    if all(x == HELD for x in v):
        return HELD
    if NOT in v:
        return "held in part" if HELD in v else NOT
    return "held in part" if HELD in v else CANNOT


def judge(family: str, roles: dict[str, str], runs: dict[str, list[dict]], cfg=None) -> list:
    """The three claims of one family in one setting: [{"claim", "verdict", "parts": [{"part",
    "verdict", "evidence"}], "at"}]. A family whose runs are not all there is "not yet run"."""
    s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
    mem = MEMORY.get(family, "recurrent")
    names = [
        f"1 ({family}). A short training window makes the {mem} layers learn recall that "
        "reaches beyond the long window and the training length.",
        f"2 ({family}). With a long window the model relies on attention (it is lazy).",
        f"3 ({family}). Stochastic window training gets the short-context quality of the long "
        "window and the long-range recall of the short window.",
    ]
    if not (s and lg and st):
        return [
            {"claim": n, "verdict": "not yet run", "at": "",
             "parts": [{"part": p, "verdict": "not yet run", "evidence": ""} for p in parts]}
            for n, parts in zip(names, PARTS)
        ]  # fmt: skip
    n_seeds = min(len(s), len(lg), len(st))
    at = setting_text(cfg, n_seeds) if cfg is not None else f"{n_seeds} seeds"
    sb, lb, stb = (_mean(x, "beyond") for x in (s, lg, st))

    # claim 1
    k_mem = sum(r["beyond"] >= 50 for r in s)
    a = HELD if k_mem > len(s) / 2 else NOT
    ev_a = (
        f"short-window seeds with ≥ 50 % in (W_long, T]: {S.share_text(k_mem, len(s))}; "
        f"recall there per seed {', '.join(fmt(r['beyond']) for r in s)} (mean {fmt(sb, 1)})."
    )
    s_far = _mean(s, "beyond_T")
    if a == NOT:
        b, ev_b = CANNOT, "the short window learned no recall beyond W_long to extend."
    elif s_far != s_far:
        b, ev_b = CANNOT, "recall beyond T was not evaluated."
    else:
        b = HELD if s_far >= sb / 2 else NOT
        ev_b = (
            f"recall beyond T per seed {', '.join(fmt(r['beyond_T']) for r in s)} (mean "
            f"{fmt(s_far, 1)}, against {fmt(sb, 1)} in (W_long, T]; held means at least half "
            "of it)."
        )
    c1 = [{"part": "beyond W_long", "verdict": a, "evidence": ev_a},
          {"part": "beyond T", "verdict": b, "evidence": ev_b}]  # fmt: skip

    # claim 2
    lazy = sum(r["kind"] == "lazy" for r in lg)
    d = _paired_by_seed(s, lg, "beyond")
    v2 = HELD if lazy > len(lg) / 2 else NOT
    lo, hi = S.clopper_pearson(lazy, len(lg))
    ev2 = (
        f"{roles['long']}: lazy in {S.share_text(lazy, len(lg))} seeds (verdicts "
        f"{', '.join(r['kind'] for r in lg)}; inside W_long "
        f"{', '.join(fmt(r['inside']) for r in lg)}, beyond it "
        f"{', '.join(fmt(r['beyond']) for r in lg)}). Short minus long beyond W_long, paired by "
        f"seed: {fmt(d['mean'], 1)} points (95 % interval {fmt(d['ci'][0], 1)} to "
        f"{fmt(d['ci'][1], 1)}, sign-flip p = {fmt(d['p'], 2)})."
        + (
            f" The share's interval ({lo:.0f}–{hi:.0f} %) includes one half: {len(lg)} seeds do "
            'not settle "most".'
            if lo <= 50 <= hi
            else ""
        )
    )
    c2 = [{"part": "lazy", "verdict": v2, "evidence": ev2}]

    # claim 3: recall
    if stb < 0.75 * sb:
        r3 = NOT
    elif lb >= 90:
        r3 = CANNOT
    else:
        r3 = HELD if stb >= lb + 10 else NOT
    ev_r = (
        f"recall in (W_long, T]: {roles['stochastic']} {fmt(stb, 1)} vs short {fmt(sb, 1)} and "
        f"long {fmt(lb, 1)} (held means ≥ 3/4 of the short's and ≥ long + 10"
        + (
            "; the long window already recalls ≥ 90 % there, so the schedule has nothing to add"
            if r3 == CANNOT
            else ""
        )  # fmt: skip
        + ")."
    )
    # claim 3: quality (held-out text loss at each run's own window, paired by seed)
    cost = _paired_by_seed(s, lg, "text")
    gap = _paired_by_seed(st, lg, "text")
    read = [x - r["text"] for r in st if (x := r.get("text_short_read", math.nan)) == x]
    same_model = (
        f" The same stochastic models read at W_short instead of W_long lose "
        f"{min(read):.4f} to {max(read):.4f} nats/byte."
        if read
        else ""
    )
    lo_c, hi_c = cost["ci"]
    if cost["n"] < 2:
        q, why = CANNOT, "fewer than two paired seeds."
    elif lo_c > 0:
        q = HELD if gap["mean"] <= cost["mean"] / 2 else NOT
        why = (
            f"the stochastic runs are {fmt(gap['mean'], 4)} ± {fmt(gap['se'], 4)} from the long "
            "window (held means within half the short window's cost)."
        )
    elif hi_c < 0:
        q = CANNOT
        why = (
            "there is no cost to recover: the short window's text loss is *lower* than the "
            "long window's."
        )
    else:
        q = CANNOT
        why = (
            "the short window's cost is within the noise: its 95 % interval includes 0, and "
            f"the smallest cost this design detects (95 %, 80 % power) is {fmt(cost['mde'], 4)} "
            "nats/byte."
        )
    ev_q = (
        f"held-out text loss at T (nats/byte): short {fmt(_mean(s, 'text'), 4)}, long "
        f"{fmt(_mean(lg, 'text'), 4)}, stochastic {fmt(_mean(st, 'text'), 4)}; short minus "
        f"long, paired by seed: {fmt(cost['mean'], 4)} ± {fmt(cost['se'], 4)} (95 % interval "
        f"{fmt(lo_c, 4)} to {fmt(hi_c, 4)}): " + why + same_model
    )
    c3 = [{"part": "recall", "verdict": r3, "evidence": ev_r},
          {"part": "quality", "verdict": q, "evidence": ev_q}]  # fmt: skip
    return [
        {"claim": names[0], "verdict": _combine(c1), "parts": c1, "at": at},
        {"claim": names[1], "verdict": _combine(c2), "parts": c2, "at": at},
        {"claim": names[2], "verdict": _combine(c3), "parts": c3, "at": at},
    ]


def families_of(cfg) -> dict[str, dict]:
    return {"SX": cfg.roles, **cfg.families}


# ------------------------------------------------------------------------------ the delay


def emergence_m(r: dict) -> tuple[float, str]:
    """(tokens in millions until the memory carried recall beyond W_long, how it was read):
    from the emergence curve (recall in (W_long, T] ≥ 50 % with the window-cut probe ≥ 50 %
    too) where the run has it, else from the learning curve (recall at 1× T over uniform
    distances ≥ 50 %, most answers beyond W_long). NaN: not within the run."""
    if r.get("emergence"):
        return S.first_crossing(r["emergence"], "acc", 50.0, also="cut"), "emergence"
    pts = [{"tokens": p["tokens"], "acc": max(p["acc"].values())} for p in r.get("curve", [])]
    return S.first_crossing(pts, "acc", 50.0), "curve"


def spacing_m(r: dict) -> float:
    """Tokens (millions) between the run's curve points (the resolution of its emergence)."""
    pts = r.get("emergence") or r.get("curve") or []
    toks = sorted(p["tokens"] for p in pts)
    gaps = [b - a for a, b in zip(toks, toks[1:])]
    return max(gaps) / 1e6 if gaps else math.nan


def delay(cfg, runs, family: str, roles: dict) -> dict | None:
    """Per seed: tokens until emergence for short, long and stochastic; the paired factor
    long / short (a run that never emerged counts as its whole budget: a lower bound) with a
    bootstrap interval over seeds of the geometric mean, and how many pairs emerged later with
    the long window."""
    s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
    if not (s and lg):
        return None
    budget = tokens_m(cfg)
    seeds = sorted({r["seed"] for r in s} & {r["seed"] for r in lg})
    by = {role: {r["seed"]: emergence_m(r)[0] for r in recs}
          for role, recs in (("short", s), ("long", lg), ("stochastic", st))}  # fmt: skip
    how = {emergence_m(r)[1] for r in s + lg + st}
    spacing = max(spacing_m(r) for r in s + lg + st)
    points = [p for r in s for p in (r.get("emergence") or r.get("curve") or [])]
    first = min((p["tokens"] / 1e6 for p in points), default=math.nan)
    logs, censored, later = [], 0, 0
    for seed in seeds:
        a, b = by["short"][seed], by["long"][seed]
        if a != a:  # the short window never emerged: no factor for this seed
            continue
        if b != b or a <= first:  # long never emerged, or short at the first point: a bound
            censored += 1
        b = budget if b != b else b
        logs.append(math.log(b / a))
        later += b > a
    gm = math.exp(sum(logs) / len(logs)) if logs else math.nan
    lo, hi = S.bootstrap(logs, lambda x: sum(x) / len(x)) if len(logs) > 1 else (math.nan,) * 2
    return {
        "seeds": seeds,
        "tokens": by,
        "factor": gm,
        "ci": (math.exp(lo), math.exp(hi)) if lo == lo else (math.nan, math.nan),
        "censored": censored,
        "pairs": len(logs),
        "later": later,
        "p": S.one_sided_sign_flip_p(logs),
        "how": how,
        "spacing": spacing,
        "budget": budget,
        "first": first,
    }


def _cell(d: dict, x: float) -> str:
    if x != x:
        return f"> {d['budget']:.1f}"
    return f"≤ {x:.1f}" if x <= d["first"] else f"{x:.1f}"


def pooled_log_delays(delays: list[dict]) -> list[float]:
    """log(long / short) of every pair of ``delays`` where the short run emerged (a long run
    that never did counts as its budget)."""
    logs = []
    for d in delays:
        for x in d["seeds"]:
            a, b = d["tokens"]["short"].get(x, math.nan), d["tokens"]["long"].get(x, math.nan)
            if a == a:
                logs.append(math.log((b if b == b else d["budget"]) / a))
    return logs


def delay_lines(cfg, runs) -> list[str]:
    """The paired emergence table and the delay factor per family of one setting."""
    out = []
    for family, roles in families_of(cfg).items():
        d = delay(cfg, runs, family, roles)
        if d is None:
            continue
        how = (
            "recall in (W_long, T] ≥ 50 % with the window cut agreeing"
            if d["how"] == {"emergence"}
            else "recall at 1× T over uniform distances ≥ 50 % (no cut probe in these runs)"
        )
        out += [
            f"**{family}, {setting_text(cfg, len(d['seeds']))}**: tokens (M) until {how}; "
            f"curve points every {fmt(d['spacing'], 2)}M tokens at most; '>' = not within the "
            f"run's {d['budget']:.1f}M.",
            "",
            "| seed | short | long | stochastic | long / short |",
            "|---|---|---|---|---|",
        ]

        for seed in d["seeds"]:
            a, b, c = (d["tokens"][k].get(seed, math.nan) for k in ("short", "long", "stochastic"))
            if a != a:
                ratio = "–"
            else:
                bound = "≥ " if (b != b or a <= d["first"]) else ""
                ratio = f"{bound}{(d['budget'] if b != b else b) / a:.1f}"
            out.append(f"| {seed} | {_cell(d, a)} | {_cell(d, b)} | {_cell(d, c)} | {ratio} |")
        bound = (
            f" (a lower bound: in {d['censored']} pair(s) the long run never emerged or the "
            "short one had already at the first curve point)"
            if d["censored"]
            else ""
        )
        out += [
            "",
            f"The long window emerged later in {d['later']} of {d['pairs']} pairs; geometric "
            f"mean factor {fmt(d['factor'], 1)}{bound}, 95 % bootstrap interval over seeds "
            f"{fmt(d['ci'][0], 1)}–{fmt(d['ci'][1], 1)}; one-sided sign-flip p = "
            f"{fmt(d['p'], 3)}.",
            "",
        ]
    both = [delay(cfg, runs, f, r) for f, r in families_of(cfg).items()]
    both = [d for d in both if d is not None]
    if len(both) > 1:
        later = sum(d["later"] for d in both)
        pairs = sum(d["pairs"] for d in both)
        logs = pooled_log_delays(both)
        out += [
            f"Both families together: the long window emerged later in {later} of {pairs} "
            f"pairs (one-sided sign-flip p = {fmt(S.one_sided_sign_flip_p(logs), 3)}).",
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
                lines += [f"- *{p['part']}*: **{p['verdict']}**. {p['evidence']}"
                          for p in c["parts"]] + [""]  # fmt: skip
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
        [name, str(r["seed"]), w(r, "inside"), w(r, "beyond"), w(r, "beyond_T"),
         fmt(r["cut_inner"]), fmt(r["reset_beyond"]), r["kind"], fmt(emergence_m(r)[0], 1),
         fmt(r["text"], 4), fmt(r["minutes"], 1)]
        for name, recs in runs.items()
        for r in recs
    ]  # fmt: skip


def write_report(settings, out: Path, command: str) -> Path:
    """CLAIMS.md in ``out`` from [(config, runs)] of the claims settings."""
    lines = [
        "# The paper's claims in its regime, judged by distance",
        "",
        f"Generated by `{command}` from the committed per-run results; nothing below is typed "
        "by hand. Design and attempts: [NOTES.md](NOTES.md); the far share comes from the "
        "laziness map ([LAZINESS.md](LAZINESS.md)).",
        "",
        "Each claim is judged in parts; a part **held**, **did not hold**, or **cannot be shown "
        "at this scale** (with the reason). Seed shares carry a 95 % exact interval, recall a "
        "95 % Wilson interval [lo–hi], paired differences over seeds a 95 % t interval.",
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
        head = ["run", "seed", "inside W_long", "beyond W_long", "beyond T", "cut", "reset",
                "verdict", "memory at (M)", "text loss", "train min"]  # fmt: skip
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

"""REPORT.md of the depth study, from the committed per-run results alone (RULE.md applied by
:mod:`experiments.depth_study.rule`)."""

from __future__ import annotations

from pathlib import Path

from experiments.depth_study import rule as R
from experiments.depth_study.beside import beside_section
from experiments.depth_study.curves import (
    PAST,
    control_losses,
    figure,
    gain_table,
    key_gain_table,
    loss_gaps,
    loss_table,
    passkey_table,
)
from experiments.lab.cli import ROOT, load_archived
from experiments.lab.markdown import table
from swax.sweep import load_sweep

HERE = Path(__file__).resolve().parent
CONFIGS = ("controls.yaml", "sx.yaml", "sd.yaml", "lr.yaml", "reference.yaml")
FAMILIES = {"SX": ("sx.yaml", 5), "SD": ("sd.yaml", 3)}


def load(config: str, here: Path = HERE, quick: bool = False, cfg=None) -> dict:
    """{run name: {seed: archived result}} of one of the study's sweeps."""
    cfg = cfg or load_sweep(here / config, quick=quick)
    runs = load_archived(cfg, lambda rec, seed: (seed, rec))
    return {name: dict(recs) for name, recs in runs.items()}


def controls(runs: dict) -> tuple[list[str], dict]:
    """The controls' table and {"SX"|"SD"|"attention": reading}."""
    head = [
        "control",
        "E over (128, T]",
        "reset's G over (128, T]",
        "E over (32, 128]",
        "passkey d ≤ 128",
        "passes",
    ]
    rows, out = [], {}
    for name, kind in (("sx-w8", "SX"), ("sd-w8", "SD"), ("ss-w128", "attention")):
        rec = runs.get(name, {}).get(0)
        c = R.attention_control(rec) if kind == "attention" else R.memory_control(rec)
        out[kind] = c
        if rec is None:
            rows.append([name, "–", "–", "–", "–", "no result yet"])
            continue
        rows.append(
            [
                name,
                R.efmt(R.excess(rec, "beyond_128")),
                R.fmt(R.gain(rec, "beyond_128", "reset")),
                R.efmt(R.excess(rec, R.INSIDE)),
                R.share(R.pooled(rec, R.NEAR_DISTANCES)),
                "yes" if c["passes"] else f"no: {c['why']}",
            ]
        )
    return table(head, rows), out


def family(name: str, runs: dict, planned: int, ctl: dict) -> dict:
    """Every reading and verdict of one family (SX or SD)."""
    f = name.lower()
    short, long, stoch = (runs.get(f"{f}-{r}", {}) for r in ("short", "long", "stoch"))
    seeds = sorted(s for s in short if s in long)
    c1 = [{"seed": s, **R.claim1_seed(short[s], long[s])} for s in seeds]
    c2 = [
        {
            "seed": s,
            **R.claim2_seed(short[s], long[s]),
            "lasting": (R.lasting_from(short[s]), R.lasting_from(long[s])),
        }
        for s in seeds
    ]
    mech = [{"seed": s, **R.mechanism_seed(short[s], long[s])} for s in seeds]
    # a short run whose long pair has no result yet: its own readings, printed, not judged
    alone = [
        {
            "seed": s,
            **R.claim1_seed(short[s], None),
            "E_short": R.excess(short[s], R.MEMORY),
            "lasting": R.lasting_from(short[s]),
        }
        for s in sorted(short)
        if s not in long
    ]
    mem_ok = ctl.get(name, {}).get("passes", False)
    att_ok = ctl.get("attention", {}).get("passes", False)
    out = {
        "seeds": seeds,
        "c1": c1,
        "c2": c2,
        "mech": mech,
        "alone": alone,
        "v1": R.claim1_verdict(c1, planned, mem_ok),
        "v2": R.claim2_verdict(c2, planned, mem_ok and att_ok),
    }
    pending = [k for k in (name, "attention") if ctl.get(k, {}).get("why") == "no result"]
    if name in pending:
        out["v1"] = out["v2"] = "pending (its control has no result yet)"
    elif pending:
        out["v2"] = "pending (the attention control has no result yet)"
    gaps = {s: R.loss_gap(short[s], long[s]) for s in seeds}
    out["gaps"] = [{"seed": s, "gap": g} for s, g in gaps.items() if g is not None]
    refs = [x for x in c2 if x["reference"]]
    out["p2"] = R.sign_p(sum(x["primary"] == "lazy" for x in refs), len(refs))
    if stoch:
        s3 = sorted(s for s in seeds if s in stoch)
        c3 = [{"seed": s, **R.claim3_seed(short[s], stoch[s])} for s in s3]
        loss = {
            k: [v[s]["text_val_loss"] for s in s3]
            for k, v in (("short", short), ("long", long), ("stoch", stoch))
        }
        out.update(
            c3=c3,
            v3m=R.memory_half(c3, planned, mem_ok),
            q3=R.quality_half(loss["short"], loss["long"], loss["stoch"], planned, mem_ok),
        )
    return out


def _ci(d: dict) -> str:
    if not isinstance(d, dict) or not d.get("n"):
        return "–"
    return f"{d['mean']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"


def verdict_table(fams: dict) -> list[str]:
    head = ["claim", "family", "verdict (RULE.md)", "seeds", "headline"]
    rows = []
    for name, f in fams.items():
        n, holds, lazy, seen = R.tally(f)
        rows.append(
            ["1: retrieval beyond T", name, f["v1"], str(n), f"holds in {holds} of {n} seeds"]
        )
        refs = sum(x["reference"] for x in f["c2"])  # a lazy pair always has one
        rows.append(
            [
                "2: laziness",
                name,
                f["v2"],
                str(n),
                f"lazy in {lazy} of {n} (sign test p {f['p2']:.3f}: {lazy} of the {refs} "
                f"with a reference); mechanism seen in {seen} of {n}",
            ]
        )
        if "c3" in f:
            keeps = sum(x["reading"] == "keeps" for x in f["c3"])
            rows.append(
                [
                    "3: memory half",
                    name,
                    f["v3m"],
                    str(len(f["c3"])),
                    f"keeps the memory in {keeps} of {len(f['c3'])}",
                ]
            )
            q = f["q3"]
            c = q.get("c")
            rows.append(
                [
                    "3: quality half",
                    name,
                    q["verdict"],
                    str(len(f["c3"])),
                    f"short − long {_ci(c)}; stoch − long {_ci(q.get('d'))}"
                    if isinstance(c, dict)
                    else "–",
                ]
            )
    return table(head, rows)


def seed_tables(name: str, f: dict) -> list[str]:
    out = [f"### {name}, per seed", ""]
    head = [
        "seed",
        "memory",
        "E (T, 4T]",
        "passkey 2T–16T short",
        "long",
        "key gain 2T–16T short",
        "long",
        "claim 1",
        "E (256, T] short",
        "long",
        "claim 2 (primary / secondary)",
        "G (256, T]'s lower bound stays > 0 from step (short / long)",
        "mechanism over (32, 128]: (a) reset's G ≥ ½ G, (b) cut's G < short's G",
    ]
    rows = []
    for a, b, m in zip(f["c1"], f["c2"], f["mech"]):
        c1 = "holds" if a["holds"] else "fails" if a["fails"] else "neither"
        if c1 == "neither" and a["memory"]:  # which of the two other parts is missing
            yn = {True: "yes", False: "no"}
            c1 += f" (copies beyond T {yn[a['copies_beyond_T']]}, retrieves {yn[a['retrieves']]})"
        mech = (
            "seen"
            if m["seen"]
            else (
                f"not seen: (a) {'yes' if m['attention_copies'] else 'no'}, "
                f"(b) {'yes' if m['memory_idles'] else 'no'}"
            )
        )
        rows.append(
            [
                str(a["seed"]),
                "yes" if a["memory"] else "no",
                R.efmt(a["E_far"]),
                R.share(a["passkey"]),
                R.share(a["passkey_long"]),
                R.fmt(a["key_gain"]),
                R.fmt(a["key_gain_long"]),
                c1,
                R.efmt(b["E_short"]),
                R.efmt(b["E_long"]),
                f"{b['primary']} / {b['secondary']}",
                " / ".join("never" if x is None else str(x) for x in b["lasting"]),
                mech,
            ]
        )
    for a in f.get("alone", []):
        rows.append(
            [
                str(a["seed"]),
                "yes" if a["memory"] else "no",
                R.efmt(a["E_far"]),
                R.share(a["passkey"]),
                "–",
                R.fmt(a["key_gain"]),
                "–",
                "pending (no long run yet)",
                R.efmt(a["E_short"]),
                "–",
                "pending",
                f"{'never' if a['lasting'] is None else a['lasting']} / –",
                "–",
            ]
        )
    out += table(head, rows)
    if "c3" in f:
        out += [
            "",
            "Claim 3, memory half: "
            + "; ".join(
                f"seed {x['seed']} {x['reading']} (E {R.efmt(x['E_stoch'])})" for x in f["c3"]
            ),
        ]
    return out + [""]


def write_reports(out: Path, here: Path = HERE) -> list[Path]:
    """REPORT.md from the committed results (and the 2-layer text study's, beside them)."""
    from experiments.text_study.readings import verdicts

    runs = {c: load(c, here) for c in CONFIGS}
    return [write_report(runs, out / "REPORT.md", text=verdicts())]


def write_report(
    runs: dict, path: Path, title: str = "The depth study", text: list | None = None
) -> Path:
    ctl_table, ctl = controls(runs.get("controls.yaml", {}))
    fams = {
        name: family(name, runs.get(cfg, {}), planned, ctl)
        for name, (cfg, planned) in FAMILIES.items()
    }
    lines = [
        f"# {title}: the paper's claims at T = 1024, 4 layers, W = T/128 vs T/8",
        "",
        "Written by `python -m experiments.depth_study report` from `results/` alone, by the "
        "rule committed before the main runs (RULE.md). E = copy gain above the placebo "
        "(nats per event, 95 % bootstrap interval over held-out documents).",
        "",
        "## Verdicts",
        "",
        *verdict_table(fams),
        "",
        "## Controls",
        "",
        *ctl_table,
        "",
    ]
    for name, f in fams.items():
        lines += seed_tables(name, f)
    lines += beside_section(fams, text)
    main = {**runs.get("sx.yaml", {}), **runs.get("sd.yaml", {})}
    fig = figure({**main, **runs.get("reference.yaml", {})}, path.parent / "depth_study.png")
    every = {
        **runs.get("controls.yaml", {}),
        **main,
        **runs.get("lr.yaml", {}),
        **runs.get("reference.yaml", {}),
    }
    lo_hi = control_losses(every)
    ceiling = "not measured yet"
    if lo_hi is not None:
        ceiling = f"{lo_hi[0]:.2f}–{lo_hi[1]:.2f} nats per key byte here"
    lines += [
        "## Copy gain above the placebo by reach (mean over seeds, min…max)",
        "",
        *gain_table(every, list(every)),
        "",
        "Past T (the same reach read at positions t ≥ T, rows of 4T):",
        "",
        *gain_table(every, list(every), PAST),
        "",
        "## Passkey retrieved (%) by distance, all seeds pooled",
        "",
        *passkey_table(every, list(every)),
        "",
        "## The planted key's gain by distance (nats per key byte, mean over seeds)",
        "",
        "The control's loss on the 16 key bytes minus the trial's: what the first occurrence "
        f"saves. It can be at most the control's own loss, {ceiling} (ln 16 = 2.77 would be a "
        "model that knows only that the key is hex digits). Read with the window cut to 8, "
        "attention cannot see the first key: what is left is the memory's; read with the "
        "memory reset before the repeat, what is left is attention's. A probe's row is printed "
        "where it differs from the run's own reading.",
        "",
        *key_gain_table(every, list(every)),
        "",
        f"![E by reach and the key gain by distance, per run](./{fig.name})",
        "",
        "## Held-out text loss (nats per byte, 256 held-out rows at each run's T)",
        "",
        "Own window: what claim 3's quality half compares (the stochastic run at 128). A short "
        "window read at W = 128 has never seen a window that long.",
        "",
        *loss_table(every, list(every)),
        "",
        "Paired by seed, each at its own window (the quality half's differences):",
        "",
        *table(
            ["family", "seed", "short − long", "stoch − long"],
            [r for name in FAMILIES for r in loss_gaps(main, name)],
        ),
        "",
    ]
    lines += reference_section(runs.get("reference.yaml", {}), runs.get("sx.yaml", {}))
    lines += lr_section(runs.get("lr.yaml", {}))
    lines += provenance(every)
    path.write_text("\n".join(lines) + "\n")
    return path


def reference_section(ref: dict, sx: dict) -> list[str]:
    """RULE.md section 8: does the T = 4096 reference count, and E over (T, 4T] beside it."""
    recs = ref.get("sx-short-t4096", {})
    if not recs:
        return []
    head = ["seed", "counts (G overlaps at ≤ 512)", "E (T, 4T] short, T = 1024", "reference"]
    rows = []
    for s, rec in sorted(recs.items()):
        short = sx.get("sx-short", {}).get(s)
        r = R.reference_reading(rec, short)
        if short is None:
            rows.append([str(s), "not yet (no T = 1024 short run of this seed)", "–", "–"])
        elif not r["counts"]:
            rows.append([str(s), "no: tune batch and lr first", "–", "–"])
        else:
            rows.append([str(s), "yes", R.efmt(r["E_far_short"]), R.efmt(r["E_far_ref"])])
    return ["## The reference (T = 4096; read, not judged)", "", *table(head, rows), ""]


def lr_section(lr: dict) -> list[str]:
    """RULE.md section 8: claim 2's reading and the loss gap at each learning rate (seed 0)."""
    rates = sorted({n.split("-lr")[1] for n in lr if "-lr" in n}, key=float)
    if not any(lr.values()):
        return []
    rows, readings = [], []
    for rate in rates:
        short = lr.get(f"sx-short-lr{rate}", {}).get(0)
        long = lr.get(f"sx-long-lr{rate}", {}).get(0)
        if short is None or long is None:
            rows.append([rate, "–", "–", "–"])
            continue
        r = R.lr_reading(short, long)
        readings.append(r)
        rows.append([rate, r["primary"], r["secondary"], f"{r['gap']:+.4f}"])
    head = ["lr", "claim 2 primary", "secondary", "loss short − long"]
    says = "yes" if R.hinges(readings) else "no"
    if len(readings) < len(rates):
        says = f"not yet ({len(readings)} of {len(rates)} rates)"
    return [
        "## The learning rate (SX, seed 0, 15.4M tokens; read, not judged)",
        "",
        *table(head, rows),
        "",
        f"Does a reading or the sign of the gap hinge on the learning rate? {says}.",
        "",
    ]


def provenance(every: dict) -> list[str]:
    head = ["run", "seeds", "corpus (Python)", "T", "windows", "lr", "precision", "commit"]
    rows = []
    for name, recs in every.items():
        p = next(iter(recs.values())).get("provenance", {}) if recs else {}
        if not p:
            continue
        w = p["windows"]
        win = f"{w['kind']} {w['fixed']}" if w["kind"] == "fixed" else f"{w['short']}/{w['long']}"
        rows.append(
            [
                name,
                ",".join(map(str, sorted(recs))),
                f"{p['corpus']} ({p['python']})",
                str(p["seq_len"]),
                win,
                f"{p['lr']:g}",
                p["precision"],
                (p.get("git_commit") or "?")[:10],
            ]
        )
    return ["## What each run is (from its provenance)", "", *table(head, rows), ""]


README = ROOT / "README.md"
BEGIN = "<!-- depth-study:begin (written by python -m experiments.depth_study report) -->"
END = "<!-- depth-study:end -->"
PLANNED = {"controls.yaml": 3, "sx.yaml": 15, "sd.yaml": 6, "lr.yaml": 6, "reference.yaml": 2}


def summary_row(name: str, f: dict) -> list[str]:
    """One family's README row: each claim's verdict with the per-seed counts behind it."""
    n, holds, lazy, seen = R.tally(f)
    none = "pending (no runs yet)" if name == "SX" else "– (no stochastic arm)"
    c3m = f["v3m"] if "c3" in f else none
    c3q = f["q3"]["verdict"] if "c3" in f else none
    c1 = f"{f['v1']} (holds in {holds} of {n} seeds)" if n else f["v1"]
    c2 = f"{f['v2']} (lazy in {lazy} of {n}; mechanism seen in {seen})" if n else f["v2"]
    return [name, c1, c2, c3m, c3q]


def readme_block(here: Path = HERE) -> str:
    """The README's table (claim × family: the verdict and its headline) and a few sentences
    on where the study stands, from the committed results alone."""
    runs = {c: load(c, here) for c in CONFIGS}
    _, ctl = controls(runs["controls.yaml"])
    fams = {n: family(n, runs[c], k, ctl) for n, (c, k) in FAMILIES.items()}
    head = [
        "family",
        "1. memory beyond T",
        "2. a long window is lazy",
        "3. stochastic: memory",
        "3. stochastic: quality",
    ]
    rows = [summary_row(name, f) for name, f in fams.items()]
    done = {c: sum(len(v) for v in runs[c].values()) for c in CONFIGS}
    status = ", ".join(f"{c.removesuffix('.yaml')} {done[c]} of {PLANNED[c]}" for c in CONFIGS)
    ok = [k for k, c in ctl.items() if c["passes"]]
    failed = [f"{k} ({c['why']})" for k, c in ctl.items() if not c["passes"]]
    failed = [x for x in failed if not x.endswith("(no result)")]
    waiting = [k for k, c in ctl.items() if c["why"] == "no result"]
    text = [f"Runs committed: {status}."]
    for what, names in (("passed", ok), ("failed", failed), ("not in yet", waiting)):
        if names:
            text.append(f"Controls {what}: {'; '.join(names)}.")
    return "\n".join([*table(head, rows), "", " ".join(text)])


def blocks() -> list:
    from experiments.lab.cli import Block

    return [Block(README, BEGIN, END, readme_block)]

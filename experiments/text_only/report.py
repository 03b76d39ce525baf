"""Laziness on text alone, the first probe: the regime's SX model trained on KJV text, read by
copy gain; TEXT_ONLY.md (textonly.yaml) and TEXT_ONLY_SXSX.md (textonly_sxsx.yaml).

Every run of a config leaves ``results/<archive>/NAME/seedS.json`` (committed); the report reads
them and nothing else. A run is read by the copy gain (swax.probes.copies): what
the earlier occurrence of a repeated context is worth, in nats, on held-out copy events bucketed
by their reach, with the run's own window, the window cut to W_short and the recurrent reset.
On text, **lazy** means the long window gains nothing beyond W_long where the short one does.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from experiments.lab.cli import load_archived
from experiments.lab.markdown import table as _table
from experiments.lab.stats import paired as paired_stats
from swax.sweep import load_sweep

HERE = Path(__file__).resolve().parent
CONFIGS = ("textonly.yaml", "textonly_sxsx.yaml")
COMMAND = "python -m experiments.text_only"
REPORT = "TEXT_ONLY.md"
NOTHING = 0.05
"""Copy gain (nats) below which a window is read as not copying from a distance at all."""
ORDER = ("le_short", "short_long", "long_T", "T_4T")


def load_runs(cfg) -> dict[str, list[dict]]:
    """{run name: [archived result per seed, with "seed"]}."""
    return load_archived(cfg, lambda ev, seed: {**ev, "seed": seed})


def gains(ev: dict) -> dict[str, dict]:
    """{bucket key: bucket row} of a run's copy probe."""
    return {b["key"]: b for b in ev.get("copies", {}).get("buckets", [])}


def fmt_gain(g: dict | None, digits: int = 3) -> str:
    if not g or g.get("n", 0) == 0 or g["mean"] != g["mean"]:
        return "–"
    lo, hi = g["ci"]
    return f"{g['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def paired(a: list[float], b: list[float]) -> tuple[float, float, int]:
    """Mean of a - b over pairs and its standard error, and the number of pairs."""
    d = [x - y for x, y in zip(a, b) if x == x and y == y]
    if not d:
        return math.nan, math.nan, 0
    m = sum(d) / len(d)
    if len(d) < 2:
        return m, math.nan, len(d)
    var = sum((x - m) ** 2 for x in d) / (len(d) - 1)
    return m, math.sqrt(var / len(d)), len(d)


def gain_of(r: dict, key: str, probe: str | None = None) -> float:
    row = gains(r).get(key)
    if not row:
        return math.nan
    g = row.get("probes", {}).get(probe) if probe else row.get("gain")
    return g["mean"] if g and g.get("n") else math.nan


def reading(cfg, runs) -> list[str]:
    """Sentences on laziness on text, each made from the archived numbers: the long window's
    copy gain beyond W_long against the short window's, paired by seed, and which memory
    carries it (the reset and the cut)."""
    roles = cfg.roles
    s, lg, st = (runs.get(roles[r], []) for r in ("short", "long", "stochastic"))
    if not (s and lg):
        return []
    by_long = {r["seed"]: r for r in lg}
    pairs = [(r, by_long[r["seed"]]) for r in s if r["seed"] in by_long]
    out = []
    inner = [(gain_of(x, "short_long"), gain_of(y, "short_long")) for x, y in pairs]
    if inner and all(v == v for p in inner for v in p):
        ls = [y for _, y in inner]
        out.append(
            f"- inside W_long, in (W_short, W_long], where the long window's attention can copy: "
            f"long {sum(ls) / len(ls):.3f} nats (per seed {', '.join(f'{y:.3f}' for y in ls)}), "
            f"short {sum(x for x, _ in inner) / len(inner):.3f} (beyond its own window: memory)."
            + (
                f" Below {NOTHING} nats: the long window's attention does not copy either."
                if sum(ls) / len(ls) < NOTHING
                else ""
            )
        )
    for key, where in (("long_T", "beyond W_long within T"), ("T_4T", "beyond T")):
        a = [gain_of(x, key) for x, _ in pairs]
        b = [gain_of(y, key) for _, y in pairs]
        if not any(v == v for v in a):
            continue
        d = paired_stats(b, a)
        sm = sum(a) / len(a)
        lm = sum(b) / len(b)
        reset_s = sum(gain_of(x, key, "reset") for x, _ in pairs) / len(pairs)
        head = (
            f"- {where}: copy gain short {sm:.3f}, long {lm:.3f} nats (per seed "
            f"{', '.join(f'{x:.3f}' for x in a)} and {', '.join(f'{x:.3f}' for x in b)}); long "
            f"minus short {d['mean']:+.3f} (95 % interval {d['ci'][0]:+.3f} to "
            f"{d['ci'][1]:+.3f}, sign-flip p = {d['p']:.2f})."
        )
        if sm < NOTHING:
            out.append(
                head + f" The short window gains less than {NOTHING} nats here: neither window "
                "copies from this distance, so laziness on text **cannot be shown** here."
            )
            continue
        ratio = lm / sm
        if ratio < 0.25:
            word = "**lazy on text**: it gains less than a quarter of what the short window does"
        elif ratio >= 0.75:
            word = "**not lazy on text**: it gains at least three quarters of the short window's"
        else:
            word = "**partly lazy on text**"
        carried = "the memory carries it" if reset_s < 0.25 * sm else "not the memory alone"
        out.append(
            head + f" The long window is {word}. The short window's gain with its recurrent "
            f"state reset before the prediction: {reset_s:.3f} ({carried})."
        )
    if st:
        m = [gain_of(r, "long_T") for r in st]
        per = ", ".join(f"{x:.3f}" for x in m)
        out.append(
            f"- stochastic windows: copy gain beyond W_long within T {sum(m) / len(m):.3f} nats "
            f"(per seed {per})."
        )
    return out


def curve_lines(cfg, runs) -> list[str]:
    """When the copy gain beyond W_long appeared: per run, the gain at each checkpoint."""
    out = []
    for name, recs in runs.items():
        for r in recs:
            pts = r.get("copy_curve", [])
            if pts:
                out.append(
                    f"- {name} seed {r['seed']}: "
                    + ", ".join(
                        f"{p['tokens'] / 1e6:.1f}M {p['gain'].get('long_T', math.nan):.2f}"
                        for p in pts
                    )
                )
    return out


def report_name(config: str) -> str:
    """TEXT_ONLY.md for textonly.yaml, TEXT_ONLY_SXSX.md for textonly_sxsx.yaml, and so on."""
    stem = Path(config).stem
    return REPORT if stem == "textonly" else f"TEXT_ONLY{stem[len('textonly') :].upper()}.md"


def write_report(
    cfg, runs, out: Path, command: str, report: str = REPORT, design: str = "textonly.yaml"
) -> Path:
    b = cfg.base
    m = b["model"]
    tokens = b["steps"] * b["batch_size"] * b["seq_len"] / 1e6
    w = b["window"]
    done = sum(len(v) for v in runs.values())
    lines = [
        "# Laziness on text alone: the copy gain by distance",
        "",
        f"Generated by `{command}` from the committed per-run results in "
        f"`{Path(os.path.relpath(cfg.archive, HERE)).as_posix()}`; nothing below is typed by "
        f"hand. Design: `{design}`; "
        "the probe: "
        "`swax/probes/copies.py`.",
        "",
        f"- runs: {done} of {len(cfg.runs) * len(cfg.seeds)} planned ({len(cfg.runs)} windows × "
        f"seeds {cfg.seeds}); {m['layer_pattern']} ({m['n_layers']} layers), d_model "
        f"{m['d_model']}, KJV text only (no episodes), "
        f"T = {b['seq_len']}, W_short = {w['short']}, W_long = {w['long']}, {tokens:.1f}M "
        "tokens per run;",
        f"- a copy event: the token after the most recent earlier occurrence of the "
        f"{cfg.eval.copy_context} preceding bytes is the target and the "
        f"{cfg.eval.copy_context}-gram model of the training text guesses it wrong; up to "
        f"{cfg.eval.copy_events} events per bucket of reach (the window the copy needs);",
        "- **copy gain**: the loss on the event's target with every earlier occurrence replaced "
        "by other held-out text, minus the loss with the text as it is (nats; 95 % interval "
        "over events). Own window: the run's (the long one after a stochastic schedule); cut: "
        f"window {w['short']}; reset: the recurrent state emptied right before the predicting "
        "position.",
        "",
    ]
    if not done:
        path = out / report
        path.write_text("\n".join(lines + ["No run is archived yet.", ""]))
        return path
    lines += ["## Copy gain per run", "", *gain_table(runs), ""]
    lines += ["## Long against short, paired by seed", "", *paired_lines(cfg, runs)]
    lines.append("")
    read = reading(cfg, runs)
    if read:
        lines += ["## Reading", "", *read, ""]
    curve = curve_lines(cfg, runs)
    if curve:
        lines += [
            "## Copy gain beyond W_long (within T) over training",
            "",
            "Tokens and the gain (nats, own window) at every kept checkpoint:",
            "",
            *curve,
            "",
        ]
    path = out / report
    path.write_text("\n".join(lines))
    return path


def gain_table(runs) -> list[str]:
    """Copy gain per run, seed and bucket, with the probes."""
    head = ["run", "seed", "bucket", "events", "gain (own window)", "cut", "reset"]
    rows = []
    for name, recs in runs.items():
        for r in recs:
            g = gains(r)
            for key in ORDER:
                if key not in g:
                    continue
                row = g[key]
                probes = row.get("probes", {})
                rows.append(
                    [
                        name,
                        str(r["seed"]),
                        row["bucket"],
                        str(row["n"]),
                        fmt_gain(row["gain"]),
                        fmt_gain(probes.get("window_cut")),
                        fmt_gain(probes.get("reset")),
                    ]
                )
    return _table(head, rows)


def paired_lines(cfg, runs) -> list[str]:
    """Long against short per bucket, paired by seed (mean ± standard error)."""
    out = []
    roles = cfg.roles
    for key in ("short_long", "long_T", "T_4T"):
        vals = {
            role: {
                r["seed"]: gains(r).get(key, {}).get("gain", {}).get("mean", math.nan)
                for r in runs.get(name, [])
            }
            for role, name in roles.items()
        }
        seeds = sorted(set(vals["short"]) & set(vals["long"]))
        if not seeds:
            continue
        m, se, n = paired([vals["long"][s] for s in seeds], [vals["short"][s] for s in seeds])
        label = next(
            (g["bucket"] for r in runs[roles["short"]] for g in [gains(r).get(key)] if g), key
        )
        parts = [
            f"{role} " + ", ".join(f"{vals[role].get(s, math.nan):.3f}" for s in seeds)
            for role in roles
        ]
        out.append(
            f"- {label}: copy gain per seed {seeds}: "
            + "; ".join(parts)
            + f". Long minus short: {m:+.3f} ± {se:.3f} nats (standard error over {n} pairs)."
        )
    return out


def write_reports(out: Path) -> list[Path]:
    """TEXT_ONLY.md and TEXT_ONLY_SXSX.md from the committed archives."""
    written = []
    for config in CONFIGS:
        cfg = load_sweep(HERE / config)
        command = f"{COMMAND} report"
        written.append(write_report(cfg, load_runs(cfg), out, command, report_name(config), config))
    return written


def quick_reports(cfgs: dict, ran: list[str], out: Path, command: str) -> list[Path]:
    """The report of each reduced config that was run (the smoke test)."""
    return [write_report(cfgs[n], load_runs(cfgs[n]), out, command, report_name(n), n) for n in ran]

"""Where the short window's lower text loss comes from (the text study's unforeseen sign).

In the text study (TEXT_STUDY.md) the run trained with W = 8 has a lower held-out text loss at
T = 256 than the run trained with W = 64, in every seed of both families. This script splits that
loss by the query's position in the row, each run at its own window, on the same 256 held-out
stretches the study's ``text_loss`` stage reads (so the differences are paired by stretch):

- positions 0-7: each window sees the whole context; a difference here comes from the
  weights, not from what the windows let the model see;
- positions 8-63: the long window sees the whole context, the short one only its last 8;
- positions 64-255: neither window sees the whole context; the memory carries the rest.

Per family and seed: the loss of each run per range, short - long (and stochastic - long) with
a 95 % t interval over the 256 stretches; per family, the mean over seeds with a t interval over
seeds. Then what the older context is worth to each run (the far-context probe): at a few
positions, the loss with the context older than the last 8 (positions 8-63) or 64 tokens
(64-255) replaced by another stretch's text, minus the loss as it is; at 64-255 neither the 8-
nor the 64-token window reaches the replaced text, so its worth there is the recurrent memory's.

Reads the trained models (``runs/text_code``, not committed) of the runs whose results are
archived, writes ``results/text_code_positions.json``; the report (TEXT_POSITIONS.md) is made
from that file.

    python -m experiments.text_study run --positions   # the models -> JSON, then the reports
    python -m experiments.text_study report            # TEXT_POSITIONS.md from the JSON, too
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from experiments.lab import stats as S
from swax.eval.ppl import position_losses, stretch_starts
from swax.probes.copies import nll_at
from swax.sweep import archive_path, train_config
from swax.sweep.run import load_run_model, run_texts

HERE = Path(__file__).resolve().parent

CONFIG = "text_code.yaml"
RESULT = HERE / "results" / "text_code_positions.json"
REPORT = "TEXT_POSITIONS.md"
RANGES = ((0, 8), (8, 64), (64, 256))
ROLES = ("short", "long", "stochastic")
PROBED = (12, 24, 40, 56, 80, 112, 160, 224, 254)
"""Query positions of the far-context probe (four in 8-63, five in 64-255)."""


def range_means(losses: np.ndarray, ranges=RANGES) -> np.ndarray:
    """(stretches, ranges): each stretch's mean loss over the query positions of each range
    (position t predicts token t + 1 from tokens 0 … t)."""
    return np.stack([losses[:, lo:hi].mean(1) for lo, hi in ranges], 1)


def paired_stretches(a: np.ndarray, b: np.ndarray) -> dict:
    """a - b over paired stretches: mean and 95 % t interval, the stretches taken as
    independent (they lie evenly spread over the held-out text, a few may share a file)."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    m, t = float(d.mean()), S.t_quantile(0.975, n - 1) if n > 1 else math.nan
    return {"mean": m, "ci": [m - t * se, m + t * se], "n": n}


def far_probe(model, tokens, losses: np.ndarray, window: int) -> dict:
    """At each position t of PROBED, on the stretches of ``losses`` (position_losses of the
    same model, tokens and window): the NLL as it is (read from ``losses``) and with the context
    older than the last ``reach(t)`` tokens (8 below 64, else 64) replaced by the same positions
    of another stretch (natural text, so the model stays in its training distribution). Per
    stretch."""
    samples, length = losses.shape[0], losses.shape[1] + 1
    starts = stretch_starts(len(tokens), length, samples)
    rows = np.stack([np.asarray(tokens[s : s + length], np.int64) for s in starts])
    _, swapped, at = swap_far(rows, PROBED)
    far = nll_at(model, swapped, at, window, False, batch=64).reshape(samples, len(PROBED))
    return {"full": losses[:, list(PROBED)], "far swapped": far}


def swap_far(rows: np.ndarray, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows as they are, rows with the far context swapped, query position of each), one
    row per (stretch, position) in that order. The context older than the last reach(t)
    tokens of query t comes from the stretch half the stretches away."""
    n, pos = len(rows), np.asarray(positions)
    other = np.roll(rows, n // 2, 0)
    real = np.repeat(rows, len(pos), 0)
    swapped = real.copy()
    for k, t in enumerate(pos):
        cut = max(0, t - reach(int(t)) + 1)  # positions before cut: older than the last reach(t)
        swapped[k :: len(pos), :cut] = other[:, :cut]
    return real, swapped, np.tile(pos, n)


def reach(t: int) -> int:
    """The context kept as it is at query position t: the last 8 tokens below 64, else 64."""
    return 8 if t < 64 else 64


def probe_ranges(probe: dict, ranges=RANGES[1:]) -> dict:
    """Per range of ``ranges``: the mean NLL as it is, with the far context swapped, and
    swapped - full paired by stretch (what the context older than reach(t) is worth there)."""
    pos = np.array(PROBED)
    res = {"full": [], "far swapped": [], "gain": []}
    for lo, hi in ranges:
        cols = (pos >= lo) & (pos < hi)
        full = probe["full"][:, cols].mean(1)
        swapped = probe["far swapped"][:, cols].mean(1)
        res["full"].append(float(full.mean()))
        res["far swapped"].append(float(swapped.mean()))
        res["gain"].append(paired_stretches(swapped, full))
    return res


def measure(cfg, family: dict, seed: int, samples: int, texts: dict) -> dict | None:
    """{role: per-range mean losses, the paired differences against long, the far-context
    probe}, or None when a run of the trio has no model or no archived result yet. ``texts``
    keeps the held-out text of each data config across calls (it is built once)."""
    per: dict[str, np.ndarray] = {}
    probes: dict[str, dict] = {}
    for role in ROLES:
        tcfg = train_config(cfg, family[role], seed)
        archived = archive_path(cfg, family[role], seed)
        if not (Path(tcfg.run_dir) / "model").is_dir() or not (archived and archived.is_file()):
            return None  # read only runs whose result is archived, as the reports are
        model, tok = load_run_model(tcfg)
        key = (repr(tcfg.data), type(tok).__name__, tok.vocab_size)
        if key not in texts:
            texts[key] = run_texts(tcfg, tok)[1].tokens
        val = texts[key]
        w = tcfg.window.fixed_window if tcfg.window.kind == "fixed" else tcfg.window.long
        losses = position_losses(model, val, tcfg.seq_len + 1, samples, w, progress=False)
        per[role] = range_means(losses)
        probes[role] = probe_ranges(far_probe(model, val, losses, w))
    out = {role: per[role].mean(0).tolist() for role in ROLES}
    out["far"] = probes
    for role in ("short", "stochastic"):
        out[f"{role}-long"] = [
            paired_stretches(per[role][:, i], per["long"][:, i]) for i in range(len(RANGES))
        ]
    return out


def run(cfg, samples: int) -> dict:
    result = {
        "config": CONFIG,
        "samples": samples,
        "ranges": [list(r) for r in RANGES],
        "families": {},
    }
    texts: dict = {}
    for fam, roles in cfg.families.items():
        seeds = {}
        for seed in cfg.seeds if all(roles[r] in cfg.runs for r in ROLES) else []:
            got = measure(cfg, roles, seed, samples, texts)
            if got is not None:
                seeds[str(seed)] = got
                diffs = ", ".join(f"{d['mean']:+.4f}" for d in got["short-long"])
                print(f"{fam} seed {seed}: short - long by range {diffs}", flush=True)
        result["families"][fam] = seeds
    return result


def _ci(d: dict, digits: int = 4) -> str:
    lo, hi = d["ci"]
    return f"{d['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def over_seeds(seeds: dict, key: str, i: int) -> dict:
    """The per-seed mean differences of range ``i``, as a t interval over seeds."""
    p = S.paired([s[key][i]["mean"] for s in seeds.values()], [0.0] * len(seeds))
    return {"mean": p["mean"], "ci": list(p["ci"]), "n": p["n"]}


def report_lines(result: dict) -> list[str]:
    names = [f"{lo}–{hi - 1}" for lo, hi in result["ranges"]]
    lines = [
        "# The short window's lower text loss, by position",
        "",
        "Generated by `python -m experiments.text_study report` from "
        "`results/text_code_positions.json`; nothing below is typed by hand.",
        "",
        f"Held-out pystdlib text, {result['samples']} stretches of T + 1 = 257 bytes (the text "
        "study's `text_loss` stretches), each run at its own window (short 8, long 64, the "
        "stochastic run at 64). Loss in nats per byte by the query's position t (t predicts "
        "byte t + 1): at 0–7 both windows see the whole context, at 8–63 only the long one "
        "does, at 64–255 neither does. Differences are paired by stretch (95 % t interval over "
        "the stretches, taken as independent); the family rows take the per-seed means (t interval "
        "over seeds).",
        "",
    ]
    for fam, seeds in result["families"].items():
        if not seeds:
            continue
        lines += [
            f"## {fam}",
            "",
            "| seed | "
            + " | ".join(f"short / long / stoch at {n}" for n in names)
            + " | "
            + " | ".join(f"short − long at {n}" for n in names)
            + " |",
            "|---" * (1 + 2 * len(names)) + "|",
        ]
        for seed, s in seeds.items():
            losses = [" / ".join(f"{s[r][i]:.4f}" for r in ROLES) for i in range(len(names))]
            diffs = [_ci(d) for d in s["short-long"]]
            lines.append(f"| {seed} | " + " | ".join(losses + diffs) + " |")
        for key, what in (("short-long", "short − long"), ("stochastic-long", "stoch − long")):
            cells = [_ci(over_seeds(seeds, key, i)) for i in range(len(names))]
            row = " | ".join([""] * len(names) + cells)
            lines.append(f"| {what}, {len(seeds)} seeds | {row} |")
        lines.append("")
        lines += far_lines(seeds)
    return lines


def far_lines(seeds: dict) -> list[str]:
    """The far-context probe's table of one family (seeds that have it)."""
    seeds = {k: v for k, v in seeds.items() if "far" in v}
    if not seeds:
        return []
    names = [f"{lo}–{hi - 1}" for lo, hi in RANGES[1:]]
    lines = [
        f"What the older context is worth, at positions {', '.join(map(str, PROBED))}: the loss "
        "with the context older than the last 8 tokens (positions 8–63) or the last 64 "
        "(positions 64–255) replaced by the same positions of another held-out stretch, minus "
        "the loss as it is, paired by stretch. At 64–255 neither window reaches the replaced "
        "text, so its worth is the memory's; at 8–63 the long window's attention reaches it "
        "too. Beside it, the loss gap at the same positions (the probe's unswapped loss).",
        "",
        "| seed | "
        + " | ".join(f"swapped − full, short / long / stoch at {n}" for n in names)
        + " |",
        "|---" * (1 + len(names)) + "|",
    ]
    for seed, s in seeds.items():
        f = s["far"]
        cells = [
            " / ".join(f"{f[r]['gain'][i]['mean']:.4f}" for r in ROLES) for i in range(len(names))
        ]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines.append("")
    for i, n in enumerate(names):
        per = {r: [s["far"][r]["gain"][i]["mean"] for s in seeds.values()] for r in ROLES}
        loss = {r: [s["far"][r]["full"][i] for s in seeds.values()] for r in ROLES}
        for other in ("long", "stochastic"):
            d, g = S.paired(per["short"], per[other]), S.paired(loss["short"], loss[other])
            lines.append(
                f"- at {n}, short − {other} over {d['n']} seeds: the older context's worth "
                f"{d['mean']:+.4f} (95 % t interval {d['ci'][0]:+.4f} to {d['ci'][1]:+.4f}); "
                f"the loss at the same positions {g['mean']:+.4f} ({g['ci'][0]:+.4f} to "
                f"{g['ci'][1]:+.4f})"
            )
    return lines + [""]


def write_report(result: dict, out: Path) -> Path:
    path = out / REPORT
    path.write_text("\n".join(report_lines(result)).rstrip() + "\n")
    return path


def measure_and_report(cfg, samples: int, out: Path, result: Path = RESULT) -> list[Path]:
    """Measure the trained models of ``cfg`` (text_code.yaml, or its quick form) into
    ``result``, then write TEXT_POSITIONS.md from it into ``out``."""
    result.write_text(json.dumps(run(cfg, samples), indent=1) + "\n")
    print(f"wrote {result}")
    return [write_report(json.loads(result.read_text()), out)]

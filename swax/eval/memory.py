"""Memory on text, as evaluations: the copy gain by reach (``swax eval copies``) and the planted
passkey (``swax eval passkey``) for one or more models on the same held-out text, each written as
JSON, a Markdown table and a plot.

The probes themselves are :mod:`swax.probes.copies` and :mod:`swax.probes.passkey`; this module
finds the held-out text (the run's own split of its corpus, or any corpus swax reads), chooses the
ranges of reach and the distances from the run's windows and training length, and writes the
results. How to read them: docs/evaluation.md ("Memory on text").
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import yaml

from swax.core.errors import SwaxError
from swax.core.plotting import format_length, pyplot
from swax.data import DataConfig, build_datasets
from swax.data.copies import NgramBaseline
from swax.model import run_config_file
from swax.probes.copies import copy_gain, copy_ranges, plan_copy_events

COPIES_FILES = ("copies.json", "copies.md", "copies.png")
PASSKEY_FILES = ("passkey.json", "passkey.md", "passkey.png")


@dataclasses.dataclass
class Subject:
    """One model read by the probes, with the windows it is read at."""

    label: str
    path: str
    model: object
    window: int | None
    """Its own window (the run's fixed window, or its long one after a stochastic schedule)."""
    probe_window: int | None
    """The window cut of the probes (the run's shortest training window); None: no probes."""


def run_data(model_dir: str | None) -> dict:
    """The ``data`` section of the ``swax train`` run around ``model_dir`` ({} without one)."""
    path = run_config_file(model_dir) if model_dir else None
    if path is None:
        return {}
    try:
        data = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("data")
    except (OSError, yaml.YAMLError) as e:
        raise SwaxError(f"cannot read the run config {path}: {e}") from None
    return data if isinstance(data, dict) else {}


def text_split(source: str | None, tokenizer, run: dict, field: str = "text"):
    """(training tokens, held-out tokens) of ``source`` (default: the run's own corpus) split as
    the run split it (its val_fraction and split seed) when it is the run's corpus, else with
    swax's defaults; the held-out part is what the probes read, the training part fits the
    copy probe's n-gram baseline."""
    source = source or run.get("source")
    if not source:
        raise SwaxError(
            "--data: give a corpus (kjv, pystdlib, a file or a folder): the model is not in a "
            "swax train run folder that names one"
        )
    keys = ("format", "val_source", "val_fraction", "split_seed")
    same = {k: run[k] for k in keys if k in run and run[k] is not None}
    cfg = DataConfig(source=source, field=field, **(same if source == run.get("source") else {}))
    train, val = build_datasets(cfg, tokenizer, seq_len=1, seed=0)
    if val is None:
        raise SwaxError(f"--data {source}: no held-out split (val_fraction 0)")
    return np.asarray(train.tokens), np.asarray(val.tokens)


def auto_edges(context: int, seq_len: int, windows: list[int]) -> list[int]:
    """Reach edges: the context, then ×4 up to the training length T, then 4T, with every
    window between the context and T added."""
    edges, x = {context, seq_len, 4 * seq_len}, context * 4
    while x < seq_len:
        edges.add(x)
        x *= 4
    edges |= {w for w in windows if w and context < w < seq_len}
    return sorted(edges)


def copies(
    subjects: list[Subject],
    train_tokens,
    val_tokens,
    eot: int | None,
    seq_len: int,
    edges: list[int],
    events: int,
    context: int,
    past: int = 0,
    seed: int = 1234,
    batch_size: int = 32,
    baseline_tokens: int = 0,
    heldout_tokens: int = 0,
    cache_dir: Path | None = None,
    log=print,
) -> dict:
    """The copy gain by range of reach of every subject on the same copy events (with the
    placebo, and with the window cut and the recurrent reset where the subject has a probe
    window); ``past``: also the ranges of reach <= T read at positions past T in rows of
    ``past`` tokens."""
    pooled = sorted({s.window for s in subjects if s.window and context < s.window < seq_len})
    ranges = copy_ranges(edges, seq_len, pooled, past)
    fit = np.asarray(train_tokens[: baseline_tokens or None])
    log(f"copy events: fitting the {context}-gram baseline on {len(fit):,} training tokens")
    baseline = (
        NgramBaseline.cached(fit, context, cache_dir) if cache_dir else NgramBaseline(fit, context)
    )
    held = np.asarray(val_tokens[: heldout_tokens or None])
    plans = plan_copy_events(held, ranges, baseline, events, seed, eot, placebo=True)
    out = []
    for s in subjects:
        log(f"copy gain of {s.label} (window {s.window}) on {len(plans)} ranges ...")
        rows = copy_gain(s.model, plans, s.window, s.probe_window, batch_size, seed=seed)
        out.append(
            {
                "label": s.label,
                "model": s.path,
                "window": s.window,
                "probe_window": s.probe_window,
                "rows": rows,
            }
        )
    return {
        "kind": "copies",
        "seq_len": seq_len,
        "context": context,
        "events": events,
        "edges": edges,
        "past": past,
        "seed": seed,
        "heldout_tokens": int(len(held)),
        "interval": "95 % percentile, bootstrap over held-out documents",
        "models": out,
    }


def _ci(g: dict | None) -> str:
    if not g or not g.get("n"):
        return "–"
    lo, hi = g["ci"]
    star = "*" if g.get("copies") else ""
    return f"{g['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]{star}"


def copies_table(result: dict) -> str:
    """Markdown: per model, one row per range of reach."""
    head = [
        "range of reach",
        "events (docs)",
        "gain",
        "placebo",
        "gain − placebo",
        "window cut",
        "recurrent reset",
    ]
    parts = []
    for m in result["models"]:
        parts.append(f"**{m['label']}** (window {m['window']}, cut {m['probe_window']})\n")
        parts.append("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in m["rows"]:
            pr = r.get("probes", {})
            cells = [
                r["bucket"],
                f"{r['n']} ({r['docs']})",
                _ci(r["gain"]),
                _ci(r.get("placebo")),
                _ci(r.get("excess")),
                _ci(pr.get("window_cut")),
                _ci(pr.get("reset")),
            ]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    parts.append(
        "Nats per event; 95 % intervals from a bootstrap over the held-out documents; * = the "
        "interval lies above 0. gain: the loss with every earlier occurrence of the context "
        "replaced minus the loss as it is; placebo: the same number of tokens replaced at about "
        "the same distance, away from any occurrence; window cut: read with the window cut to "
        "the run's shortest; recurrent reset: the recurrent state emptied right before the "
        "predicting position. 'at t >= T': the same reach read past the training length T."
    )
    return "\n".join(parts) + "\n"


def _mid(r: dict) -> float:
    return math.sqrt(r["lo"] * r["hi"])


def plot_copies(result: dict, path: Path) -> Path:
    """Gain against reach (log axis), one line per model (dashed: the same ranges read past
    T), the windows and T marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    T = result["seq_len"]
    for m in result["models"]:
        for late, style in ((False, "o-"), (True, "s--")):
            rows = [
                r
                for r in m["rows"]
                if r["n"] and r["key"].startswith("r") and r["key"].endswith("_pastT") == late
            ]
            if not rows:
                continue
            xs = [_mid(r) for r in rows]
            ys = [r["gain"]["mean"] for r in rows]
            err = [
                [y - r["gain"]["ci"][0] for y, r in zip(ys, rows)],
                [r["gain"]["ci"][1] - y for y, r in zip(ys, rows)],
            ]
            label = m["label"] + (" (at t ≥ T)" if late else "")
            ax.errorbar(xs, ys, yerr=np.nan_to_num(err), fmt=style, capsize=2, label=label)
        if m["window"]:
            ax.axvline(m["window"], color="gray", ls=":", lw=1)
    ax.axvline(T, color="k", ls="--", lw=1, label=f"T = {format_length(T)}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("reach (tokens; dotted: each model's window)")
    ax.set_ylabel("copy gain (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def passkey_table(result: dict) -> str:
    """Markdown: per model, one row per distance."""
    head = [
        "distance",
        "retrieved",
        "control",
        "gain (nats/token)",
        "cut: retrieved",
        "reset: retrieved",
    ]
    parts = []
    for m in result["models"]:
        parts.append(f"**{m['label']}** (window {m['window']}, cut {m['probe_window']})\n")
        parts.append("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in m["rows"]:
            pr = r.get("probes", {})
            cells = [
                format_length(r["distance"]),
                _share(r),
                _share(r, "control_"),
                _ci(r["gain"]),
                _share(pr.get("window_cut")),
                _share(pr.get("reset")),
            ]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    parts.append(
        f"{result['trials']} trials per distance. retrieved: % of trials whose key greedy "
        "decoding reproduces exactly after the prefix, with its 95 % Wilson interval; control: "
        "the same with the first key replaced by another random key (chance); gain: the "
        "control's loss on the key minus the trial's, 95 % bootstrap interval over trials "
        "(* above 0); cut: read with the window cut to the run's shortest; reset: the recurrent "
        "state emptied right before the repeat."
    )
    return "\n".join(parts) + "\n"


def _share(r: dict | None, pre: str = "") -> str:
    if not r:
        return "–"
    lo, hi = r[f"{pre}retrieved_ci"]
    return f"{100 * r[f'{pre}retrieved']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def plot_passkey(result: dict, path: Path) -> Path:
    """Retrieval against distance (log axis), one line per model, the windows and T marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for m in result["models"]:
        xs = [r["distance"] for r in m["rows"]]
        ys = [100 * r["retrieved"] for r in m["rows"]]
        err = [
            [y - 100 * r["retrieved_ci"][0] for y, r in zip(ys, m["rows"])],
            [100 * r["retrieved_ci"][1] - y for y, r in zip(ys, m["rows"])],
        ]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=2, label=m["label"])
        if m["window"]:
            ax.axvline(m["window"], color="gray", ls=":", lw=1)
    if result.get("seq_len"):
        ax.axvline(result["seq_len"], color="k", ls="--", lw=1, label="T")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-3, 103)
    ax.set_xlabel("distance (tokens; dotted: each model's window)")
    ax.set_ylabel("passkey retrieved (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(out: Path, result: dict, table: str, plot) -> Path:
    """``out``/{kind}.json, .md and .png; returns the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    kind = result["kind"]
    path = out / f"{kind}.json"
    path.write_text(json.dumps(result, indent=1))
    (out / f"{kind}.md").write_text(table)
    plot(result, out / f"{kind}.png")
    return path

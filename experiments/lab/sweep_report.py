"""The report pieces of a sweep read by length (the window sweep and the first regime study):
the figures (recall and answer loss by length, learning curves), the task in words, the tables
of recall by length and window, the learning-curve and probe sections. Every number is read
from the sweep's aggregate (swax.sweep.aggregate) of its runs' evaluations.
"""

from __future__ import annotations

from pathlib import Path

from experiments.lab.markdown import table as _table
from experiments.lab.sweep_claims import LEARNED
from swax.core.plotting import format_length, length_axis, pyplot
from swax.sweep import EMERGED


def fmt(ms, digits=1):
    """'mean ± spread' of an aggregate (swax.sweep.aggregate)."""
    m, s = ms
    return f"{m:.{digits}f} ± {s:.{digits}f}"


# ------------------------------------------------------------------------------ figures


FAMILY_COLORS = {
    "SX": "tab:blue",
    "SD": "tab:red",
    "SA": "tab:green",
    "XX": "tab:purple",
    "AA": "tab:gray",
}


def _style(name: str, a: dict) -> dict:
    """Colour by layer pattern (NoPE a lighter shade), line style by window: short dotted,
    long dashed, stochastic solid."""
    color = FAMILY_COLORS.get(a["pattern"][:2], "black")
    if "nope" in name:
        color = "tab:olive"
    w = a["windows"]
    if a["deploy"] == "train" and w.get("train", w["long"]) < w["long"]:
        ls = ":"
    elif "train" in w:  # evaluated at the long window after a stochastic schedule
        ls = "-"
    else:
        ls = "--"
    return {"color": color, "ls": ls, "marker": "o", "ms": 3, "label": name}


def figures(agg: dict, out: Path, main: list[str], prefix: str) -> dict:
    """The report's figures (PNG next to it); returns {what: file name}."""
    import numpy as np

    plt = pyplot()
    paths = {}
    long_w = agg[main[0]]["windows"]["long"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.6), sharex=True)
    panels = (
        ("episodes_deploy", "recall (%), each run's own window", (-3, 103)),
        ("episodes_long", f"recall (%), the long window ({long_w})", (-3, 103)),
        ("nll_deploy", "answer loss (nats), own window", None),
    )
    for ax, (key, title, ylim) in zip(axes, panels):
        for name in main:
            xs = sorted(agg[name][key])
            ax.plot(xs, [agg[name][key][x][0] for x in xs], **_style(name, agg[name]))
        length_axis(ax)
        ax.grid(alpha=0.3)
        ax.set_title(title)
        ax.set_xlabel("context length (tokens)")
        if ylim:
            ax.set_ylim(*ylim)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths["accuracy"] = f"{prefix}recall_vs_length.png"
    fig.savefig(out / paths["accuracy"], dpi=100)
    plt.close(fig)

    curved = [n for n in main if "curve" in agg[n]]
    if curved:
        mults = sorted(agg[curved[0]]["curve"])
        fig, axes = plt.subplots(1, len(mults), figsize=(6 * len(mults), 4.4), sharey=True)
        for ax, mult in zip(np.atleast_1d(axes), mults):
            for name in curved:
                pts = agg[name]["curve"][mult]
                ax.plot(
                    [t / 1e6 for t, _ in pts], [m for _, (m, _) in pts], **_style(name, agg[name])
                )
            ax.axhline(EMERGED, color="k", ls="--", lw=1)
            ax.set_xlabel("training tokens (millions)")
            ax.set_title(f"recall at {format_length(mult)} tokens (own window)")
            ax.grid(alpha=0.3)
            ax.set_ylim(-3, 103)
        np.atleast_1d(axes)[0].set_ylabel("recall (%)")
        np.atleast_1d(axes)[-1].legend(fontsize=7, ncol=2)
        fig.tight_layout()
        paths["curves"] = f"{prefix}learning_curves.png"
        fig.savefig(out / paths["curves"], dpi=100)
        plt.close(fig)
    return paths


# ------------------------------------------------------------------------------ the task


def distance_text(syn: dict) -> str:
    """The training distribution of the needle-to-question distance, in words."""
    lo, share, far = syn.get("min_distance", 16), syn.get("far_share"), syn.get("far_from")
    if share is None:
        return f"uniform in [{lo}, as far as the sequence allows]"
    return (
        f"beyond {far} tokens (uniform up to as far as the sequence allows) for {share:.0%} "
        f"of the training episodes and uniform in [{lo}, {far}] for the others"
    )


def task_text(cfg) -> str:
    syn = cfg.base.get("data", {}).get("synthetic", {})
    n, q = syn.get("num_needles", 1), syn.get("num_queries", 1)
    if syn.get("task") == "mqar":
        noise = syn.get("mqar_noise", 16)
        filler = "filler tokens from their own range" if noise else "corpus text"
        kv = f"{syn.get('mqar_keys', 16)}/{syn.get('mqar_values', 16)}"
        ranges = (
            f"keys, values and filler each from a dedicated range of {kv}/{noise} token ids"
            if noise
            else f"keys and values each from a dedicated range of {kv} token ids"
        )
        return (
            f"Multi-query associative recall (MQAR, as in Zoology and the xLSTM paper): "
            f"{n} key–value pairs of single tokens ("
            + ranges
            + f") somewhere in a stretch of {filler}, then "
            f"{q} of the keys asked again, each followed by its value (the answer). In "
            f"training the distance from the pairs to the first question is "
            f"{distance_text(syn)}; in evaluation it is uniform, so at lengths beyond the "
            "training length the pairs are beyond any training window. "
            f"{syn.get('fraction', 0):.0%} of the training sequences are episodes"
            + (" (only the answers are supervised)" if syn.get("answers_only") else "")
            + ". Recall is the share of answers that are the model's greedy choice; chance is "
            f"1/{syn.get('mqar_values', 16)}. The answer loss (nats per answer) is reported too."
        )
    return (
        f"Retrieval episodes with {n} needle(s) and {q} question(s) hidden in King James Bible "
        "text (swax.data.synthetic); recall is the share of answers whose every token is the "
        "model's greedy choice."
    )


# ------------------------------------------------------------------------------ report


def recall_rows(agg, names, lengths, unit="") -> list[list[str]]:
    """One row per run: name, layer pattern, its own window, recall there at ``lengths``."""
    rows = []
    for name in names:
        a = agg[name]
        w = a["windows"]
        own = w.get("train", w["long"]) if a["deploy"] == "train" else w["long"]
        rows.append(
            [name, a["pattern"], str(own)]
            + [f"{fmt(a['episodes_deploy'][n])}{unit}" for n in lengths]
        )
    return rows


def results_tables(agg, main, seq_len) -> list[str]:
    lengths = sorted({n for name in main for n in agg[name]["episodes_long"]})
    mult = [f"{n // seq_len}× ({n})" for n in lengths]
    lines = [
        "Recall (%) with each run's **own window** (its fixed training window; the long "
        "window after the stochastic schedule, which ends on it); mean ± half-range over "
        "seeds:",
        "",
    ]
    lines += _table(["run", "pattern", "window"] + mult, recall_rows(agg, main, lengths))
    lines += ["", "Answer loss (nats per answer; ln 16 = 2.77 is a guess), own window:", ""]
    lines += _table(
        ["run"] + mult,
        [
            [n] + [fmt(agg[n]["nll_deploy"][x], 2) for x in lengths]
            for n in main
            if "nll_deploy" in agg[n]
        ],
    )
    lines += [
        "",
        f"Recall (%) with the **long** window ({agg[main[0]]['windows']['long']}) for every "
        "run (the short-window runs then see farther than they were trained to):",
        "",
    ]
    lines += _table(
        ["run"] + mult, [[n] + [fmt(agg[n]["episodes_long"][x]) for x in lengths] for n in main]
    )
    text = [n for n in main if "text_loss_long" in agg[n]]
    if text:
        lines += ["", "Held-out text loss at the training length (nats/token):", ""]
        lines += _table(
            ["run", "long window", "training window"],
            [
                [
                    n,
                    fmt(agg[n]["text_loss_long"], 4),
                    fmt(agg[n].get("text_loss_train", agg[n]["text_loss_long"]), 4),
                ]
                for n in text
            ],
        )
    return lines


def curve_section(agg, main, seq_len, fig) -> list[str]:
    curved = [n for n in main if "curve" in agg[n]]
    if not curved:
        return []
    lines = [
        "## Learning curves",
        "",
        "Recall with each run's own window at every kept checkpoint. Emergence: training "
        f"tokens until recall at 1× first reaches {EMERGED:.0f}% (per seed; – = not within the "
        "run).",
        "",
    ]
    mults = sorted(agg[curved[0]]["curve"])
    rows = []
    for n in curved:
        em = agg[n]["emergence"]
        last = {m: agg[n]["curve"][m][-1][1] for m in mults}
        rows.append(
            [n, ", ".join("–" if e is None else f"{e / 1e6:.2f}M" for e in em)]
            + [fmt(last[m]) for m in mults]
        )
    lines += _table(
        ["run", "emergence (tokens)"] + [f"final recall at {m // seq_len}×" for m in mults], rows
    )
    lines += ["", f"![learning curves]({fig})", ""]
    return lines


def carrier(p: dict) -> str:
    """Which memory carries the answer, read off the probe (accuracies in %): the sliding
    window (what the window cut removes), the recurrent memory (what the reset removes), or
    something neither removes (a full-attention layer)."""
    full, cut, reset, both = (p[k][0] for k in ("full", "window_cut", "reset", "both"))
    if full < LEARNED:
        return "neither learned"
    if both >= 0.5 * full:
        return "full attention (untouched by the probe)"
    att = reset >= 0.5 * full  # still recalls with the recurrent memory emptied
    rec = cut >= 0.5 * full  # still recalls with the window cut below the distance
    if att and rec:
        return "either alone"
    if att:
        return "sliding-window attention"
    if rec:
        return "recurrent memory"
    return "both together"


def probe_section(agg, names, seq_len) -> list[str]:
    probed = [n for n in names if "probe" in agg[n]]
    if not probed:
        return []
    lines = [
        "## Which memory carries retrieval (mechanism probe)",
        "",
        "Recall (%) at 1× the training length with the run's own window (full), with the sliding "
        "window cut to the short training window (shorter than any needle–question distance: "
        "sliding-window attention cannot see the pairs), with the recurrent layers' state "
        "reset right before the question (only attention can carry the pair), and with both "
        "(full-attention layers are touched by neither). A memory carries retrieval when "
        "recall survives removing the other one (keeps ≥ half of the full recall).",
        "",
    ]
    rows = [
        [n]
        + [fmt(agg[n]["probe"][k]) for k in ("full", "window_cut", "reset", "both")]
        + [carrier(agg[n]["probe"])]
        for n in probed
    ]
    lines += _table(["run", "full", "window cut", "recurrent reset", "both", "carried by"], rows)
    return lines + [""]


# ------------------------------------------------------------------------------ header, end

SMOKE_RUN = [
    "> **A smoke run** (`--quick`: a few training steps and evaluation samples). Its numbers and "
    "verdicts check that the pipeline works; they say nothing about the paper's claims. The full "
    "run is the same command without `--quick`.",
    "",
]
"""The note under the header of a report of reduced runs."""


def summed_minutes(*results: dict | None) -> tuple[float, float]:
    """(training, evaluation) minutes summed over the runs of one or more sweeps' results (a
    run that stands for several grid points counted once)."""
    every = {
        (i, e["name"], e["seed"]): e
        for i, res in enumerate(results)
        for evs in (res or {}).values()
        for e in evs
    }
    train = sum(e.get("train_elapsed_s") or 0 for e in every.values())
    return train / 60, sum(e.get("eval_elapsed_s", 0) for e in every.values()) / 60


def closing_lines(cfg, cfg_path: Path) -> list[str]:
    """A report's end: the sweep's notes and its config as run."""
    notes = ["## Notes", "", cfg.notes.strip(), ""] if cfg.notes.strip() else []
    return notes + ["## Config", "", "```yaml", cfg_path.read_text().rstrip(), "```", ""]

"""One archived run of the regime's sweeps read by distance bucket (swax.probes.buckets): the
record the laziness map and the claims share, and recall with its Wilson interval."""

from __future__ import annotations

import math

from swax.probes.buckets import wilson


def record(ev: dict, seed: int) -> dict:
    """The reading of one archived run (its eval.json, swax.sweep.archive) by distance bucket:
    recall (%) inside W_long, beyond it within T and beyond T with their counts, the window-cut
    and recurrent-reset probes, the laziness verdict ("kind"), the text loss, when the memory
    emerged, the training time and tokens."""
    T = ev["seq_len"]
    rows = ev["buckets"]
    mid = [r for r in rows if not r["inside_long"] and r["hi"] <= T]
    inner = [r for r in rows if r["inside_long"] and r["lo"] > 0]  # (W_short, W]

    def pooled(sel, probe=None):
        src = [r["probes"][probe] if probe else r for r in sel]
        n = sum(r["n"] for r in src)
        return 100 * sum(r["correct"] for r in src) / n if n else math.nan

    lz = ev["laziness"]
    T_far = [r for r in rows if r["lo"] >= T]

    def counts(sel):
        return [sum(r["correct"] for r in sel), sum(r["n"] for r in sel)]

    return {
        "counts": {
            "inside": counts([r for r in rows if r["inside_long"]]),
            "beyond": counts(mid),
            "beyond_T": counts(T_far),
        },
        "emergence": ev.get("emergence", {}).get("points", []),
        "curve": ev.get("curve", []),
        "seed": seed,
        "inside": lz["inside_long"],
        "beyond": lz["beyond_long"],
        "beyond_T": lz["beyond_T"],
        "cut_inner": pooled(inner, "window_cut"),
        "reset_beyond": pooled(mid, "reset"),
        "kind": lz["kind"],
        "chance": lz["chance"],
        "n_beyond": sum(r["n"] for r in mid),
        "text": ev.get("text_val_loss", math.nan),
        "text_short_read": ev.get("text_loss", {}).get("train", math.nan),
        "minutes": (ev.get("summary", {}).get("elapsed") or math.nan) / 60,
        "emerged": emerged(ev),
        "tokens": ev.get("summary", {}).get("tokens"),
    }


def emerged(ev: dict) -> float:
    """Training tokens (millions) at the first kept checkpoint whose recall at 1× the training
    length (uniform distances, most answers beyond the window) reached 50 %: when the memory
    emerged; NaN if it did not within the run."""
    for point in ev.get("curve", []):
        if max(point["acc"].values()) >= 50:
            return point["tokens"] / 1e6
    return math.nan


def wilson_text(k: int, n: int) -> str:
    """Recall k / n (%) with its 95 % Wilson interval: '75 [47–92]'; "–" without episodes."""
    if not n:
        return "–"
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.0f} [{lo:.0f}–{hi:.0f}]"


def recall_text(r: dict, key: str) -> str:
    """A record's recall in bucket ``key`` ("inside", "beyond", "beyond_T") with its interval."""
    return wilson_text(*r["counts"][key])

"""Aggregating a sweep's results: mean ± spread over seeds of every evaluation, and when
retrieval emerged on a learning curve."""

from __future__ import annotations

import statistics
from typing import Any


def mean_spread(xs: list[float]) -> tuple[float, float]:
    """Mean and half the range (the spread shown as ±) over seeds."""
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (max(xs) - min(xs)) / 2


def aggregate(results: dict[str, list[dict]]) -> dict[str, dict]:
    """{name: {"val_loss": (m, s), "episodes_long": {length: (m, s)}, ...}}."""
    agg = {}
    for name, evs in results.items():
        a: dict[str, Any] = {
            "val_loss": mean_spread([e["val_loss"] for e in evs]),
            "seeds": len(evs),
            "pattern": evs[0]["pattern"],
            "windows": evs[0]["windows"],
        }
        a["deploy"] = evs[0].get("deploy", "long")
        for label in ("long", "train"):
            key = f"episodes_{label}"
            if key in evs[0]:
                a[key] = {int(n): mean_spread([e[key][n]["acc"] for e in evs]) for n in evs[0][key]}
                if "nll" in next(iter(evs[0][key].values())):
                    a[f"nll_{label}"] = {
                        int(n): mean_spread([e[key][n]["nll"] for e in evs]) for n in evs[0][key]
                    }
        for what in ("episodes", "nll"):  # recall at the window the run is used with
            if f"{what}_{a['deploy']}" in a:
                a[f"{what}_deploy"] = a[f"{what}_{a['deploy']}"]
        if all("text_val_loss" in e for e in evs):
            a["text_val_loss"] = mean_spread([e["text_val_loss"] for e in evs])
        for label in evs[0].get("text_loss", {}):
            a[f"text_loss_{label}"] = mean_spread([e["text_loss"][label] for e in evs])
        if "ppl" in evs[0]:
            a["ppl"] = [
                (r["bucket_end"], mean_spread([e["ppl"][i]["loss"] for e in evs]))
                for i, r in enumerate(evs[0]["ppl"])
            ]
        if evs[0].get("curve"):
            steps = [p["tokens"] for p in evs[0]["curve"]]
            a["curve"] = {
                int(n): [
                    (t, mean_spread([e["curve"][i]["acc"][n] for e in evs]))
                    for i, t in enumerate(steps)
                ]
                for n in evs[0]["curve"][0]["acc"]
            }
            first = str(min(int(n) for n in evs[0]["curve"][0]["acc"]))
            a["emergence"] = [emergence(e["curve"], first) for e in evs]
        if "probe" in evs[0]:
            a["probe"] = {
                k: mean_spread([e["probe"][k]["acc"] for e in evs]) for k in evs[0]["probe"]
            }
            a["probe_nll"] = {
                k: mean_spread([e["probe"][k]["nll"] for e in evs]) for k in evs[0]["probe"]
            }
        agg[name] = a
    return agg


EMERGED = 50.0
"""Recall (%) at 1× the training length that marks retrieval as learned on a learning curve."""


def emergence(curve: list[dict], length: str, threshold: float = EMERGED) -> int | None:
    """Training tokens at the first checkpoint whose recall at ``length`` reaches
    ``threshold`` %; None if none does."""
    for p in curve:
        if p["acc"][length] >= threshold:
            return p["tokens"]
    return None

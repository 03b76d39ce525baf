"""Recall of synthetic key-value episodes at chosen lengths and windows: the window study's
metric (``swax eval recall``, ``swax demo recall``, and every run of ``swax sweep``).

The episodes are those of :mod:`swax.data.mqar` (MQAR: key-value pairs of dedicated token ids)
or :mod:`swax.data.synthetic` (needles in text), drawn with evaluation keys and a seed, so every
model sees the same ones. Results have the shape of the sweeps' ``eval.json``:
``{"episodes_<label>": {"<length>": {"acc", "n", "nll", "by_depth", "by_distance"}}}``, one
label per evaluation window (``long``, the model's own; ``train``, the run's training window).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from swax.config import WindowConfig
from swax.core.configs import from_dict
from swax.core.errors import ConfigError, SwaxError
from swax.data.config import SyntheticConfig
from swax.model import run_config_file
from swax.probes.episodes import episode_accuracy

RECALL_FILES = ("recall.json",)
"""What ``swax eval recall`` writes in its results folder."""


def recall_by_window(
    model,
    tokenizer,
    haystack,
    cfg: SyntheticConfig,
    lengths: list[int],
    samples: int,
    windows: dict[str, int | None],
    seed: int = 1234,
    batch_size: int = 16,
    progress: bool = False,
) -> dict[str, dict]:
    """``{f"episodes_{label}": {str(length): result}}`` for each (label, window) of ``windows``
    (see :func:`swax.probes.episodes.episode_accuracy` for a result)."""
    out = {}
    for label, window in windows.items():
        res = episode_accuracy(
            model,
            tokenizer,
            haystack,
            lengths,
            samples,
            cfg,
            window=window,
            seed=seed,
            progress=progress,
            batch_size=batch_size,
        )
        out[f"episodes_{label}"] = {str(k): v for k, v in res.items()}
    return out


def _run_config(model_dir: str | Path) -> tuple[WindowConfig, int, dict] | None:
    """(its window schedule, its seq_len, its data.synthetic section) of the ``swax train`` run
    around ``model_dir``, read from the run's ``config.yaml`` (which swax train writes in full);
    None when ``model_dir`` is not inside a run folder. Read as YAML, not through the training
    config, so that evaluation does not depend on the training code."""
    run_yaml = run_config_file(model_dir)
    if run_yaml is None:
        return None
    try:
        data = yaml.safe_load(run_yaml.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SwaxError(f"cannot read the run config {run_yaml}: {e}") from None
    window, seq_len = data.get("window"), data.get("seq_len")
    if not isinstance(window, dict) or "long" not in window or not isinstance(seq_len, int):
        raise SwaxError(
            f"{run_yaml} has no window.long or seq_len: not a config written by swax train"
        )
    try:
        schedule = from_dict(WindowConfig, window)
    except ConfigError as e:
        raise SwaxError(f"{run_yaml}: window: {e}") from None
    synthetic = (data.get("data") or {}).get("synthetic") or {}
    return schedule, seq_len, synthetic


def training_setup(model_dir: str | Path) -> tuple[SyntheticConfig | None, dict, int | None]:
    """(the episodes it was trained on, its windows {"train"?: W}, its training length) when
    ``model_dir`` is the ``model/`` folder of a ``swax train`` run (its ``config.yaml`` beside
    it); (None, {}, None) otherwise."""

    found = _run_config(model_dir)
    if found is None:
        return None, {}, None
    window, seq_len, synthetic = found
    train_w = window.train_window
    windows = {} if train_w == window.long else {"train": train_w}
    try:
        syn = from_dict(SyntheticConfig, synthetic)
    except ConfigError as e:
        raise SwaxError(f"the run config of {model_dir}: data.synthetic: {e}") from None
    return (syn if syn.fraction > 0 else None), windows, seq_len


def run_bucket_edges(model_dir: str | Path) -> tuple[int, int, int] | None:
    """(window.short, window.long, seq_len) of the ``swax train`` run around ``model_dir``,
    the edges of its distance buckets (swax.probes.buckets); None without a run folder."""
    found = _run_config(model_dir)
    if found is None:
        return None
    window, seq_len, _ = found
    return min(window.short, window.train_window, window.long), window.long, seq_len


def write_recall(out: Path, results: dict, meta: dict) -> Path:
    """``recall.json`` in ``out``: the results and what they were computed with."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recall.json"
    path.write_text(json.dumps({**meta, **results}, indent=1))
    return path


def recall_table(results: dict, lengths: list[int], base: int | None = None) -> str:
    """Windows × lengths, recall in %, as aligned text (the lengths as multiples of ``base``
    too when given)."""
    head = ["window"] + [f"{n}" + (f" ({n / base:g}x)" if base else "") for n in lengths]
    rows = [
        [key.removeprefix("episodes_")] + [f"{res[str(n)]['acc']:.1f}" for n in lengths]
        for key, res in results.items()
        if key.startswith("episodes_")
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows])


def run_windows(model_dir: str | Path) -> dict | None:
    """The windows of the ``swax train`` run around ``model_dir``: ``own`` (the window it is
    used with: its fixed window, or the long one after a stochastic schedule, which ends on it),
    ``short`` (the shortest it trained with: the probes' window cut), ``long`` and ``seq_len``;
    None without a run folder."""
    found = _run_config(model_dir)
    if found is None:
        return None
    w, seq_len, _ = found
    own = w.train_window if w.kind == "fixed" else w.long
    short = min(w.short, w.train_window, w.long)
    return {"own": own, "short": short, "long": w.long, "seq_len": seq_len}

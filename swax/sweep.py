"""`swax sweep CONFIG`: train and evaluate a family of runs at an equal token budget.

A sweep YAML names a base training config, the variants to compare (each a set of overrides),
the seeds, and the evaluation. Every (variant, seed) run lives in ``out_dir/runs/NAME-sSEED``;
a finished run (its ``summary.json`` exists) is never retrained and a finished evaluation
(``eval.json``) is never redone, so a sweep can be stopped and started again at any time.

    swax sweep experiments/window_sweep/sweep.yaml            # all runs
    swax sweep experiments/window_sweep/sweep.yaml --quick    # the reduced version
    swax sweep experiments/window_sweep/sweep.yaml --only swax-w16,swax-w256

Evaluation of each run: validation loss (from training), retrieval accuracy on evaluation-key
episodes (:mod:`swax.eval.episodes`) at multiples of the training length, with the model's long
window and also with its training window where different, and loss by position
(:mod:`swax.eval.ppl`). ``aggregate`` gathers mean ± spread over seeds.
"""

from __future__ import annotations

import copy
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .configutil import from_dict
from .data.config import SyntheticConfig
from .errors import ConfigError

log = logging.getLogger("swax")


@dataclass
class EvalSpec:
    """How every run of the sweep is evaluated."""

    length_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Episode lengths as multiples of the training sequence length."""
    samples: int = 16
    """Episodes per length."""
    episodes: dict[str, Any] = field(default_factory=dict)
    """SyntheticConfig fields of the evaluation episodes (default: the training episodes')."""
    train_window: bool = True
    """Also evaluate with the training window (short or fixed) where it differs from the long."""
    ppl_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """Loss-by-position bucket edges as multiples of the training length."""
    ppl_samples: int = 2
    """Stretches of held-out text for the loss by position."""
    seed: int = 1234
    """Seed of the evaluation episodes (the same episodes for every run)."""
    text_samples: int = 64
    """Stretches of held-out text, each of the training length, for the text loss with each
    evaluation window (the short-context quality)."""


@dataclass
class SweepConfig:
    """A sweep: base config, variants, seeds, evaluation."""

    name: str = "sweep"
    """Name of the sweep (report titles)."""
    out_dir: str = "runs/sweep"
    """Folder holding runs/ and results/."""
    base: dict[str, Any] = field(default_factory=dict)
    """Training config (TrainConfig keys, nested) shared by every run."""
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Variant name -> overrides of the base (nested TrainConfig keys)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    """Seeds; every variant is trained once per seed."""
    eval: EvalSpec = field(default_factory=EvalSpec)
    """Evaluation of every run."""
    roles: dict[str, str] = field(default_factory=dict)
    """Run names playing the roles `short`, `long` and `stochastic` in a report's claims."""
    notes: str = ""
    """Free text quoted in the report (what else was tried, caveats)."""
    quick: dict[str, Any] = field(default_factory=dict)
    """Overrides applied with --quick: `base` (merged into base), `seeds`, `runs` (a list of
    variant names to keep), `eval` (merged into eval)."""


def _merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in (b or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_sweep(path: str | Path, quick: bool = False) -> SweepConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep config {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"sweep config {p} is not valid YAML: {str(e).splitlines()[0]}") from None
    cfg = from_dict(SweepConfig, data)
    if quick and cfg.quick:
        q = cfg.quick
        cfg.base = _merge(cfg.base, q.get("base", {}))
        if "seeds" in q:
            cfg.seeds = list(q["seeds"])
        if "runs" in q:
            missing = [r for r in q["runs"] if r not in cfg.runs]
            if missing:
                raise ConfigError(f"quick.runs names unknown variant {missing[0]!r}")
            cfg.runs = {r: cfg.runs[r] for r in q["runs"]}
        if "eval" in q:
            cfg.eval = from_dict(EvalSpec, _merge(_as_dict(cfg.eval), q["eval"]))
        if "out_dir" in q:
            cfg.out_dir = q["out_dir"]
    for name, overrides in cfg.runs.items():  # validate every run's config now
        train_config(cfg, name, cfg.seeds[0], overrides)
    return cfg


def _as_dict(obj) -> dict:
    from .configutil import to_dict

    return to_dict(obj)


def run_dir(cfg: SweepConfig, name: str, seed: int) -> Path:
    return Path(cfg.out_dir) / "runs" / f"{name}-s{seed}"


def train_config(cfg: SweepConfig, name: str, seed: int, overrides: dict | None = None):
    from .train.config import TrainConfig

    data = _merge(cfg.base, overrides if overrides is not None else cfg.runs[name])
    data.update(run_dir=str(run_dir(cfg, name, seed)), seed=seed)
    data.setdefault("log", {}).setdefault("progress", False)
    try:
        return from_dict(TrainConfig, data)
    except ConfigError as e:
        raise ConfigError(f"sweep run {name}: {e}") from None


def _train_one(cfg: SweepConfig, name: str, seed: int) -> dict:
    from .train import train
    from .train.checkpoint import latest_checkpoint

    tcfg = train_config(cfg, name, seed)
    rd = Path(tcfg.run_dir)
    if (rd / "summary.json").is_file() and (rd / "model").is_dir():
        return json.loads((rd / "summary.json").read_text())
    if latest_checkpoint(rd) is not None:
        tcfg = tcfg.replace(resume=True)
    elif rd.exists():
        tcfg = tcfg.replace(overwrite=True)  # an unfinished run without a checkpoint
    return train(tcfg)


def evaluate_run(cfg: SweepConfig, name: str, seed: int, progress: bool = False) -> dict:
    """Episodes at every length (long window, and training window where different), loss by
    position, and held-out text loss at the training length with each window; cached in the
    run's eval.json (a cache from before the text loss existed is completed, not redone)."""
    from .data import DataConfig, build_datasets, load_model_tokenizer
    from .eval.ppl import position_losses
    from .model import SwaxLM

    tcfg = train_config(cfg, name, seed)
    rd = Path(tcfg.run_dir)
    cache = rd / "eval.json"
    out = json.loads(cache.read_text()) if cache.is_file() else None
    if out is not None and "text_loss" in out:
        return out
    model = SwaxLM.from_pretrained(rd / "model")
    tok = load_model_tokenizer(rd / "model")
    _, val = build_datasets(
        DataConfig(
            source=tcfg.data.source,
            format=tcfg.data.format,
            field=tcfg.data.field,
            tokenizer=tcfg.data.tokenizer,
            val_source=tcfg.data.val_source,
            val_fraction=tcfg.data.val_fraction,
        ),
        tok,
        seq_len=1,
        seed=0,
    )
    ev = cfg.eval
    long_w = tcfg.window.long
    if tcfg.window.kind == "fixed":
        train_w = tcfg.window.fixed or tcfg.window.long
    else:
        train_w = tcfg.window.short
    windows = {"long": long_w}
    if ev.train_window and train_w != long_w and "S" in model.config.layer_types:
        windows["train"] = train_w
    t0 = time.perf_counter()
    if out is None:
        out = _evaluate_recall(cfg, tcfg, model, tok, val, windows, name, seed, progress)
    # held-out text at the training length, with each evaluation window (added to older caches)
    out["text_loss"] = {
        label: float(
            position_losses(
                model, val.tokens, tcfg.seq_len + 1, ev.text_samples, w, progress=False
            ).mean()
        )
        for label, w in windows.items()
    }
    out["eval_elapsed_s"] = out.get("eval_elapsed_s", 0.0) + time.perf_counter() - t0
    cache.write_text(json.dumps(out, indent=1))
    return json.loads(cache.read_text())  # the same form as a cached result (string keys)


def _evaluate_recall(cfg, tcfg, model, tok, val, windows, name, seed, progress) -> dict:
    from .eval.episodes import episode_accuracy
    from .eval.ppl import bucketize, position_losses

    ev = cfg.eval
    ep_cfg = from_dict(SyntheticConfig, _merge(_as_dict(tcfg.data.synthetic), ev.episodes))
    lengths = [m * tcfg.seq_len for m in ev.length_multiples]
    long_w = windows["long"]
    rd = Path(tcfg.run_dir)
    out: dict[str, Any] = {
        "name": name,
        "seed": seed,
        "windows": windows,
        "pattern": model.config.layer_types,
        "seq_len": tcfg.seq_len,
    }
    for label, w in windows.items():
        res = episode_accuracy(
            model,
            tok,
            val.tokens,
            lengths,
            ev.samples,
            ep_cfg,
            window=w,
            seed=ev.seed,
            progress=progress,
        )
        out[f"episodes_{label}"] = {str(k): v for k, v in res.items()}
    edges = [m * tcfg.seq_len for m in ev.ppl_multiples]
    if len(val.tokens) >= edges[-1] and ev.ppl_samples:
        losses = position_losses(
            model, val.tokens, edges[-1], ev.ppl_samples, long_w, progress=progress
        )
        out["ppl"] = bucketize(losses, edges)
    summary = json.loads((rd / "summary.json").read_text())
    out["val_loss"] = summary["final_val_loss"]
    out["train_elapsed_s"] = summary.get("elapsed")
    return out  # evaluate_run adds eval_elapsed_s, timed around all of the evaluation


def run_sweep(cfg: SweepConfig, only: list[str] | None = None, progress: bool = True) -> dict:
    """Train and evaluate every (variant, seed); return {name: [eval dict per seed]}."""
    names = list(cfg.runs) if not only else only
    unknown = [n for n in names if n not in cfg.runs]
    if unknown:
        raise ConfigError(f"unknown sweep run {unknown[0]!r}; the sweep has {', '.join(cfg.runs)}")
    results: dict[str, list[dict]] = {}
    jobs = [(n, s) for s in cfg.seeds for n in names]  # every variant once before seed 2
    t0 = time.perf_counter()
    for i, (name, seed) in enumerate(jobs, 1):
        done = (run_dir(cfg, name, seed) / "eval.json").is_file()
        if progress:
            elapsed = time.perf_counter() - t0
            print(
                f"[{i}/{len(jobs)}] {name} seed {seed}"
                + (" (cached)" if done else "")
                + (f" | {elapsed / 60:.1f} min so far" if i > 1 else ""),
                flush=True,
            )
        _train_one(cfg, name, seed)
        results.setdefault(name, []).append(evaluate_run(cfg, name, seed))
    return results


# ------------------------------------------------------------------------------ aggregation


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
        for label in ("long", "train"):
            key = f"episodes_{label}"
            if key in evs[0]:
                a[key] = {int(n): mean_spread([e[key][n]["acc"] for e in evs]) for n in evs[0][key]}
                if "nll" in next(iter(evs[0][key].values())):
                    a[f"nll_{label}"] = {
                        int(n): mean_spread([e[key][n]["nll"] for e in evs]) for n in evs[0][key]
                    }
        for label in evs[0].get("text_loss", {}):
            a[f"text_loss_{label}"] = mean_spread([e["text_loss"][label] for e in evs])
        if "ppl" in evs[0]:
            a["ppl"] = [
                (r["bucket_end"], mean_spread([e["ppl"][i]["loss"] for e in evs]))
                for i, r in enumerate(evs[0]["ppl"])
            ]
        agg[name] = a
    return agg

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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .configutil import check_bounds, from_dict, load_yaml_mapping
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
    """Stretches of held-out text for the loss by position (0 = none)."""
    seed: int = 1234
    """Seed of the evaluation episodes (the same episodes for every run)."""
    text_samples: int = 64
    """Stretches of held-out text, each of the training length, for the text loss with each
    evaluation window (the short-context quality; 0 = none)."""
    curve_multiples: list[int] = field(default_factory=list)
    """Learning curves: recall at these multiples of the training length (long window) for
    every checkpoint the run kept (set checkpoint.every and checkpoint.keep in the base);
    empty = no curves."""
    curve_samples: int = 32
    """Episodes per length and checkpoint for the learning curves."""
    probe_multiple: int = 0
    """Mechanism probe at this multiple of the training length (0 = no probe): recall with the
    sliding window cut to probe_window, with the recurrent layers' state reset right after the
    needle, and with both (which memory carries the answer)."""
    probe_window: int | None = None
    """Window of the probe's cut; None = the run's window.short."""
    probe_samples: int = 64
    """Episodes of the probe."""
    batch_size: int = 16
    """Episodes evaluated at once."""

    def __post_init__(self) -> None:
        check_bounds(self, EVAL_BOUNDS, prefix="eval.")


@dataclass
class GridSpec:
    """A grid of runs over two or more config keys (e.g. the phase diagram of which memory
    learns retrieval: mLSTM input-gate bias × window). Every point starts from the overrides of
    ``from_run`` and sets one value per axis; a point whose config equals a run of the sweep
    reuses that run instead of training it again."""

    from_run: str = ""
    """The run whose overrides every grid point starts from ("" = the base alone)."""
    axes: dict[str, list[Any]] = field(default_factory=dict)
    """Dotted TrainConfig key -> values, e.g. {model.mlstm_igate_bias_init: [-10, -4, 0],
    window.fixed: [8, 24, 64]}. Keys joined by "+" move together: each value is set on every
    one of them (window.fixed+data.synthetic.far_from: [16, 32] ties the far-needle threshold
    to the window)."""
    exclude: list[dict[str, Any]] = field(default_factory=list)
    """Points left out of the grid: each entry maps axes to a value or a list of values, and a
    point matching every axis of an entry is not run (e.g. cells that equal another cell)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Dotted key -> short label used in run names (default: the key's last part)."""
    seeds: list[int] = field(default_factory=list)
    """Seeds of the grid runs (default: the sweep's first seed)."""

    def __post_init__(self) -> None:
        check_bounds(self, {"seeds": SEED}, prefix="grid.")


SEED = f"[0, {2**63 - 1}]"
"""The interval of a seed (a signed 64-bit integer that is not negative)."""

EVAL_BOUNDS: dict[str, str] = {
    "length_multiples": "[1, inf)",
    "samples": "[1, inf)",
    "ppl_multiples": "[1, inf)",
    "ppl_samples": "[0, inf)",
    "seed": SEED,
    "text_samples": "[0, inf)",
    "curve_multiples": "[1, inf)",
    "curve_samples": "[1, inf)",
    "probe_multiple": "[0, inf)",
    "probe_window": "[1, inf)",
    "probe_samples": "[1, inf)",
    "batch_size": "[1, inf)",
}
"""The interval of every numeric EvalSpec field (see swax.configutil.check_bounds)."""

SWEEP_BOUNDS: dict[str, str] = {"seeds": SEED, "jobs": "[1, inf)"}
"""The interval of the numeric SweepConfig fields, checked after --quick is applied."""


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
    grid: GridSpec | None = None
    """An optional grid of extra runs (see GridSpec), evaluated like the others."""
    roles: dict[str, str] = field(default_factory=dict)
    """Run names playing the roles `short`, `long` and `stochastic` in a report's claims (the
    SWAX family)."""
    families: dict[str, dict[str, str]] = field(default_factory=dict)
    """Other families judged on the same claims: {family: {short, long, stochastic}} (e.g. the
    Gated DeltaNet hybrid SD and the sliding-window + full-attention hybrid SA)."""
    jobs: int = 1
    """Runs trained and evaluated at the same time, each in its own process (with the base's
    `threads`); 2 on a 2-core machine with threads=1."""
    notes: str = ""
    """Free text quoted in the report (what else was tried, caveats)."""
    quick: dict[str, Any] = field(default_factory=dict)
    """Overrides applied with --quick: `base` (merged into base), `seeds`, `runs` (a list of
    variant names to keep), `eval` (merged into eval), `grid` (merged into grid; null drops
    it), `out_dir`, `jobs`."""
    grid_runs: dict[str, dict] = field(default_factory=dict, init=False)
    """Grid point name -> overrides (filled by load_sweep)."""
    grid_points: dict[str, dict] = field(default_factory=dict, init=False)
    """Grid point name -> {dotted key: value} (filled by load_sweep)."""
    aliases: dict[str, str] = field(default_factory=dict, init=False)
    """Grid point name -> the sweep run with the same config, trained once (by load_sweep)."""


def _merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in (b or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_sweep(path: str | Path, quick: bool = False) -> SweepConfig:
    cfg = from_dict(SweepConfig, load_yaml_mapping(path, "sweep config"))
    if quick and cfg.quick:
        _apply_quick(cfg, cfg.quick)
    check_bounds(cfg, SWEEP_BOUNDS)
    if not cfg.seeds:
        raise ConfigError("seeds must name at least one seed, got []")
    for name, overrides in cfg.runs.items():  # validate every run's config now
        tcfg = train_config(cfg, name, cfg.seeds[0], overrides)
        try:
            _episode_cfg(cfg, tcfg)
        except ConfigError as e:
            raise ConfigError(f"eval.episodes of sweep run {name}: {e}") from None
    for family, roles in {"roles": cfg.roles, **cfg.families}.items():
        unknown = [r for r in roles.values() if r not in cfg.runs]
        if unknown and not quick:
            raise ConfigError(f"{family} names unknown run {unknown[0]!r}")
    _expand_grid(cfg)
    return cfg


def _apply_quick(cfg: SweepConfig, q: dict) -> None:
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
    if "grid" in q:
        g = q["grid"]
        cfg.grid = (
            None
            if g is None
            else from_dict(GridSpec, _merge(_as_dict(cfg.grid) if cfg.grid else {}, g))
        )
    for key in ("out_dir", "jobs"):
        if key in q:
            setattr(cfg, key, q[key])


def _set_dotted(tree: dict, key: str, value) -> dict:
    out = copy.deepcopy(tree)
    node = out
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def _expand_grid(cfg: SweepConfig) -> None:
    """Fill ``cfg.grid_runs`` {name: overrides} and ``cfg.grid_points`` {name: {axis: value}}
    from ``cfg.grid``; a point equal to a sweep run (same config) is recorded in
    ``cfg.aliases`` and trained once."""
    import itertools

    cfg.grid_runs, cfg.grid_points, cfg.aliases = {}, {}, {}
    g = cfg.grid
    if g is None or not g.axes:
        return
    if g.from_run and g.from_run not in cfg.runs:
        raise ConfigError(f"grid.from_run names unknown run {g.from_run!r}")
    start = cfg.runs.get(g.from_run, {})
    keys = list(g.axes)
    resolved = {run: _comparable(cfg, over) for run, over in cfg.runs.items()}
    unknown = [k for ex in g.exclude for k in ex if k not in g.axes]
    if unknown:
        raise ConfigError(f"grid.exclude names {unknown[0]!r}, which is not an axis")
    for values in itertools.product(*(g.axes[k] for k in keys)):
        overrides, point = start, {}
        for k, v in zip(keys, values):
            for part in k.split("+"):
                overrides = _set_dotted(overrides, part, v)
            point[k] = v
        if any(_matches(point, ex) for ex in g.exclude):
            continue
        label = "-".join(
            f"{g.labels.get(k, k.split('+')[0].split('.')[-1])}{v}" for k, v in point.items()
        )
        name = f"grid-{label}"
        cfg.grid_runs[name] = overrides
        cfg.grid_points[name] = point
        train_config(cfg, name, cfg.seeds[0], overrides)  # validate
        mine = _comparable(cfg, overrides)
        same = [run for run, conf in resolved.items() if conf == mine]
        if same:
            cfg.aliases[name] = same[0]


def _matches(point: dict, exclude: dict) -> bool:
    """Whether a grid point matches every axis of an ``exclude`` entry (value or list)."""
    return all(point[k] in (v if isinstance(v, list) else [v]) for k, v in exclude.items())


def _comparable(cfg: SweepConfig, overrides: dict) -> dict:
    return _as_dict(train_config(cfg, "_", 0, overrides))  # same run_dir and seed for all


def grid_seeds(cfg: SweepConfig) -> list[int]:
    return list(cfg.grid.seeds) if cfg.grid and cfg.grid.seeds else cfg.seeds[:1]


def _as_dict(obj) -> dict:
    from .configutil import to_dict

    return to_dict(obj)


def run_dir(cfg: SweepConfig, name: str, seed: int) -> Path:
    """The folder of run ``name`` (a grid point equal to a sweep run uses that run's folder)."""
    name = cfg.aliases.get(name, name)
    return Path(cfg.out_dir) / "runs" / f"{name}-s{seed}"


def run_overrides(cfg: SweepConfig, name: str) -> dict:
    """The overrides of a sweep run or a grid point."""
    if name in cfg.runs:
        return cfg.runs[name]
    if name in cfg.grid_runs:
        return cfg.grid_runs[name]
    raise ConfigError(f"unknown sweep run {name!r}; the sweep has {', '.join(cfg.runs)}")


def train_config(cfg: SweepConfig, name: str, seed: int, overrides: dict | None = None):
    from .train.config import TrainConfig

    data = _merge(cfg.base, overrides if overrides is not None else run_overrides(cfg, name))
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


def _episode_cfg(cfg: SweepConfig, tcfg) -> SyntheticConfig:
    return from_dict(SyntheticConfig, _merge(_as_dict(tcfg.data.synthetic), cfg.eval.episodes))


STAGES = ("recall", "text_loss", "ppl", "curve", "probe")
"""Evaluation stages, each cached in the run's eval.json once done (a cache from an older
version of the sweep is completed with the missing stages, not redone)."""


def evaluate_run(cfg: SweepConfig, name: str, seed: int, progress: bool = False) -> dict:
    """Evaluate one finished run, stage by stage (see STAGES), cached in its eval.json:
    episodes at every length (long window, and training window where different), held-out
    text loss at the training length with each window, loss by position, recall at every kept
    checkpoint (learning curves) and the mechanism probe."""
    from .data import DataConfig, build_datasets, load_model_tokenizer
    from .model import SwaxLM

    tcfg = train_config(cfg, name, seed)
    rd = Path(tcfg.run_dir)
    cache = rd / "eval.json"
    out = json.loads(cache.read_text()) if cache.is_file() else {}
    ev = cfg.eval
    todo = [st for st in STAGES if _wanted(ev, st) and not _done(out, st)]
    if not todo:
        return out
    model = SwaxLM.from_pretrained(rd / "model").eval()
    tok = load_model_tokenizer(rd / "model")
    data_cfg = DataConfig(
        source=tcfg.data.source,
        format=tcfg.data.format,
        field=tcfg.data.field,
        tokenizer=tcfg.data.tokenizer,
        val_source=tcfg.data.val_source,
        val_fraction=tcfg.data.val_fraction,
    )
    _, val = build_datasets(data_cfg, tok, seq_len=1, seed=0)
    windows = {"long": tcfg.window.long}
    train_w = (
        (tcfg.window.fixed or tcfg.window.long)
        if tcfg.window.kind == "fixed"
        else tcfg.window.short
    )
    if ev.train_window and train_w != tcfg.window.long and "S" in model.config.layer_types:
        windows["train"] = train_w
    # The window a run is used with: its own fixed window, or the long one after a stochastic
    # schedule (which ends on it); learning curves and the probe read recall there.
    deploy = "train" if tcfg.window.kind == "fixed" and "train" in windows else "long"
    ctx = _EvalContext(cfg, tcfg, model, tok, val.tokens, windows, windows[deploy], progress)
    t0 = time.perf_counter()
    for stage in todo:
        out.update(getattr(ctx, stage)())
        out.update(
            name=name,
            seed=seed,
            windows=windows,
            deploy=deploy,
            pattern=model.config.layer_types,
            seq_len=tcfg.seq_len,
        )
        if deploy in out.get("text_loss", {}):  # the run's quality: text at its own window
            out["text_val_loss"] = out["text_loss"][deploy]
        summary = json.loads((rd / "summary.json").read_text())
        out["val_loss"] = summary["final_val_loss"]
        out["train_elapsed_s"] = summary.get("elapsed")
        out["eval_elapsed_s"] = out.get("eval_elapsed_s", 0.0) + time.perf_counter() - t0
        t0 = time.perf_counter()
        cache.write_text(json.dumps(out, indent=1))
    return json.loads(cache.read_text())  # the same form as a cached result (string keys)


def _wanted(ev: EvalSpec, stage: str) -> bool:
    return {
        "recall": True,
        "text_loss": ev.text_samples > 0,
        "ppl": ev.ppl_samples > 0 and bool(ev.ppl_multiples),
        "curve": bool(ev.curve_multiples),
        "probe": ev.probe_multiple > 0,
    }[stage]


def _done(out: dict, stage: str) -> bool:
    keys = {
        "recall": ["episodes_long"],
        "text_loss": ["text_loss"],
        "ppl": ["ppl", "ppl_done"],
        "curve": ["curve"],
        "probe": ["probe"],
    }[stage]
    return any(k in out for k in keys)


class _EvalContext:
    """The pieces every evaluation stage of one run needs; one method per stage, each
    returning the keys it adds to eval.json."""

    def __init__(self, cfg, tcfg, model, tok, val_tokens, windows, deploy_window, progress):
        self.cfg, self.tcfg, self.model, self.tok = cfg, tcfg, model, tok
        self.val, self.windows, self.progress = val_tokens, windows, progress
        self.deploy_window = deploy_window
        self.ev = cfg.eval
        self.ep_cfg = _episode_cfg(cfg, tcfg)

    def _episodes(self, model, lengths, samples, window, **kw) -> dict:
        from .eval.episodes import episode_accuracy

        res = episode_accuracy(
            model,
            self.tok,
            self.val,
            lengths,
            samples,
            self.ep_cfg,
            window=window,
            seed=self.ev.seed,
            progress=self.progress,
            batch_size=self.ev.batch_size,
            **kw,
        )
        return {str(k): v for k, v in res.items()}

    def recall(self) -> dict:
        from .eval.recall import recall_by_window

        lengths = [m * self.tcfg.seq_len for m in self.ev.length_multiples]
        return recall_by_window(
            self.model, self.tok, self.val, self.ep_cfg, lengths, self.ev.samples,
            self.windows, seed=self.ev.seed, batch_size=self.ev.batch_size,
            progress=self.progress,
        )  # fmt: skip

    def text_loss(self) -> dict:
        """Held-out text at the training length, with each evaluation window."""
        from .eval.ppl import position_losses

        n = self.tcfg.seq_len + 1
        return {
            "text_loss": {
                label: float(
                    position_losses(
                        self.model, self.val, n, self.ev.text_samples, w, progress=False
                    ).mean()
                )
                for label, w in self.windows.items()
            }
        }

    def ppl(self) -> dict:
        from .eval.ppl import bucketize, position_losses

        edges = [m * self.tcfg.seq_len for m in self.ev.ppl_multiples]
        if len(self.val) < edges[-1]:
            return {"ppl_done": True}
        losses = position_losses(
            self.model,
            self.val,
            edges[-1],
            self.ev.ppl_samples,
            self.windows["long"],
            progress=self.progress,
        )
        return {"ppl": bucketize(losses, edges), "ppl_done": True}

    def curve(self) -> dict:
        """Recall (the run's own window) at every kept checkpoint: what it learned when."""
        from .train.checkpoint import list_checkpoints

        lengths = [m * self.tcfg.seq_len for m in self.ev.curve_multiples]
        points = []
        per_step = self.tcfg.batch_size * self.tcfg.seq_len
        for ckpt in list_checkpoints(self.tcfg.run_dir):
            step = int(ckpt.name.split("_")[1])
            model = _checkpoint_model(self.model.config, ckpt)
            res = self._episodes(model, lengths, self.ev.curve_samples, self.deploy_window)
            points.append(
                {
                    "step": step,
                    "tokens": step * per_step,
                    "acc": {k: v["acc"] for k, v in res.items()},
                    "nll": {k: v["nll"] for k, v in res.items()},
                }
            )
        return {"curve": points}

    def probe(self) -> dict:
        """Recall at probe_multiple × the training length with the run's own window, with the
        window cut, with the recurrent state reset after the needle, and with both."""
        length = [self.ev.probe_multiple * self.tcfg.seq_len]
        cut = self.ev.probe_window or self.tcfg.window.short
        own = self.deploy_window
        n = self.ev.probe_samples
        out = {}
        for label, w, reset in (
            ("full", own, False),
            ("window_cut", cut, False),
            ("reset", own, True),
            ("both", cut, True),
        ):
            r = self._episodes(self.model, length, n, w, reset_recurrent=reset)[str(length[0])]
            out[label] = {"acc": r["acc"], "nll": r["nll"], "n": r["n"]}
        return {"probe": out, "probe_window": cut}


def _checkpoint_model(config, ckpt: Path):
    """The model weights of a training checkpoint (safetensors), in a fresh SwaxLM."""
    from safetensors.torch import load_file

    from .model import SwaxLM

    model = SwaxLM(config)
    sd = {
        k: v
        for k, v in load_file(str(ckpt / "model.safetensors")).items()
        if not k.startswith("__rng__.")
    }
    model.load_state_dict(sd)
    return model.eval()


def all_jobs(cfg: SweepConfig, only: list[str] | None = None) -> list[tuple[str, int]]:
    """(name, seed) of every run to train and evaluate: the sweep's runs (each variant once
    before the second seed), then the grid points that are not sweep runs."""
    names = list(cfg.runs) if not only else only
    unknown = [n for n in names if n not in cfg.runs and n not in cfg.grid_runs]
    if unknown:
        raise ConfigError(
            f"unknown sweep run {unknown[0]!r}; the sweep has {', '.join(cfg.runs)}"
            + (f" and grid points {', '.join(cfg.grid_runs)}" if cfg.grid_runs else "")
        )
    jobs = [(n, s) for s in cfg.seeds for n in names if n in cfg.runs]
    grid = [n for n in cfg.grid_runs if not only or n in only]
    for s in grid_seeds(cfg):
        for n in grid:
            job = (cfg.aliases.get(n, n), s)  # a grid point equal to a run is that run
            if job not in jobs:
                jobs.append(job)
    return jobs


def _job(
    cfg: SweepConfig, name: str, seed: int, threads: int | None, worker: bool = False
) -> tuple[str, int, dict]:
    """Train (unless done) and evaluate one run; the unit of work of a parallel sweep."""
    from .threads import set_threads

    set_threads(threads or 0)
    try:
        _train_one(cfg, name, seed)
        return name, seed, evaluate_run(cfg, name, seed)
    except KeyboardInterrupt as e:  # stopped by a signal (its checkpoint saved): a worker
        if not worker:  # process ends here, so that it starts no other run of the sweep
            raise
        import os

        print(f"swax sweep: {name} seed {seed}: {e or 'interrupted'}", file=sys.stderr, flush=True)
        os._exit(getattr(e, "exit_code", 130))


def run_sweep(
    cfg: SweepConfig, only: list[str] | None = None, progress: bool = True, jobs: int | None = None
) -> dict:
    """Train and evaluate every (variant, seed) and grid point; return {name: [eval dict per
    seed]} (grid points included, under their grid names). ``jobs`` (default cfg.jobs) runs
    that many at once, each in a fresh process."""
    todo = all_jobs(cfg, only)
    jobs = jobs or cfg.jobs
    from .threads import applied_threads

    # each worker process: the base's threads, else the command's --threads / $SWAX_THREADS
    threads = cfg.base.get("threads") or applied_threads() or None
    t0 = time.perf_counter()
    done: dict[tuple[str, int], dict] = {}

    def report(i, name, seed, what):
        if progress:
            print(
                f"[{i}/{len(todo)}] {name} seed {seed} {what} | "
                f"{(time.perf_counter() - t0) / 60:.1f} min",
                flush=True,
            )

    if jobs <= 1:
        for i, (name, seed) in enumerate(todo, 1):
            cached = (run_dir(cfg, name, seed) / "eval.json").is_file()
            report(i, name, seed, "(cached, completing)" if cached else "started")
            done[(name, seed)] = _job(cfg, name, seed, None)[2]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"))
        try:
            with _stop_raises():
                futures = {pool.submit(_job, cfg, n, s, threads, True): (n, s) for n, s in todo}
                for i, fut in enumerate(as_completed(futures), 1):
                    name, seed, out = fut.result()
                    done[(name, seed)] = out
                    report(i, name, seed, "done")
        except BaseException:
            _stop_workers(pool)
            raise
        pool.shutdown()
    names = [n for n in cfg.runs if not only or n in only]
    results = {n: [done[(n, s)] for s in cfg.seeds] for n in names}
    for name in cfg.grid_runs:  # a grid point equal to a sweep run reads that run
        if not only or name in only:
            src = cfg.aliases.get(name, name)
            results[name] = [done[(src, s)] for s in grid_seeds(cfg)]
    return results


class _stop_raises:  # noqa: N801
    """SIGTERM raises KeyboardInterrupt in the sweep's main process while the block runs (as
    Ctrl-C does), so that a scheduler's stop reaches the runs instead of orphaning them."""

    def __enter__(self):
        import signal
        import threading

        self.old = None
        if threading.current_thread() is threading.main_thread():

            def raise_stop(signum, frame):
                raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

            self.old = signal.signal(signal.SIGTERM, raise_stop)
        return self

    def __exit__(self, *exc):
        import signal

        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def _stop_workers(pool, grace: float = 300.0) -> None:
    """Stop a sweep's worker processes: no new run starts, each running one gets SIGTERM (it
    saves a checkpoint at its next step and stops, so the sweep resumes it), and any still
    alive after ``grace`` seconds is killed."""
    import os
    import signal
    import time

    procs = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown clears it
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


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

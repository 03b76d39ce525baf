"""The sweep config: base training config, variants, seeds, grid and evaluation, from YAML.

:func:`load_sweep` reads and checks a sweep YAML (every run's training config is built once
to validate it, and the grid is expanded); :func:`train_config` is the TrainConfig of one
(variant or grid point, seed), trained in :func:`run_dir`.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swax.core.configs import (
    SEED_BOUNDS,
    bounded,
    check_fields,
    from_dict,
    load_yaml_mapping,
    to_dict,
)
from swax.core.errors import ConfigError
from swax.data.config import SyntheticConfig
from swax.train.config import TrainConfig


@dataclass
class EvalSpec:
    """How every run of the sweep is evaluated."""

    length_multiples: list[int] = bounded(
        bounds="[1, inf)", default_factory=lambda: [1, 2, 4, 8, 16, 32]
    )
    """Episode lengths as multiples of the training sequence length."""
    samples: int = bounded(16, "[0, inf)")
    """Episodes per length; 0 = no recall by length (a sweep without retrieval episodes)."""
    episodes: dict[str, Any] = field(default_factory=dict)
    """SyntheticConfig fields of the evaluation episodes (default: the training episodes')."""
    train_window: bool = True
    """Also evaluate with the training window (short or fixed) where it differs from the long."""
    ppl_multiples: list[int] = bounded(bounds="[1, inf)", default_factory=lambda: [1, 2, 4, 8, 16])
    """Loss-by-position bucket edges as multiples of the training length."""
    ppl_samples: int = bounded(2, "[0, inf)")
    """Stretches of held-out text for the loss by position (0 = none)."""
    seed: int = bounded(1234, SEED_BOUNDS)
    """Seed of the evaluation episodes (the same episodes for every run)."""
    text_samples: int = bounded(64, "[0, inf)")
    """Stretches of held-out text, each of the training length, for the text loss with each
    evaluation window (the short-context quality; 0 = none)."""
    curve_multiples: list[int] = bounded(bounds="[1, inf)", default_factory=list)
    """Learning curves: recall at these multiples of the training length (long window) for
    every checkpoint the run kept (set checkpoint.every and checkpoint.keep in the base);
    empty = no curves."""
    curve_samples: int = bounded(32, "[1, inf)")
    """Episodes per length and checkpoint for the learning curves."""
    probe_multiple: int = bounded(0, "[0, inf)")
    """Mechanism probe at this multiple of the training length (0 = no probe): recall with the
    sliding window cut to probe_window, with the recurrent layers' state reset right after the
    needle, and with both (which memory carries the answer)."""
    probe_window: int | None = bounded(None, "[1, inf)")
    """Window of the probe's cut; None = the run's window.short."""
    probe_samples: int = bounded(64, "[1, inf)")
    """Episodes of the probe."""
    batch_size: int = bounded(16, "[1, inf)")
    """Episodes evaluated at once."""
    bucket_samples: int = bounded(0, "[0, inf)")
    """Recall by distance bucket (swax.probes.buckets): episodes per bucket, each bucket also
    with the window-cut and recurrent-reset probes; 0 = not evaluated."""
    bucket_far: list[int] = bounded(bounds="[2, inf)", default_factory=lambda: [4, 16])
    """Upper edges of the buckets beyond the training length, as multiples of it."""
    copy_events: int = bounded(0, "[0, inf)")
    """Copy gain by distance bucket on held-out text (swax.probes.copies): at most this many
    copy events per bucket, with the window-cut and recurrent-reset probes, on the final
    model; 0 = not evaluated."""
    copy_context: int = bounded(4, "[1, inf)")
    """Tokens of the context whose earlier occurrence makes a copy event (and the order of the
    n-gram baseline fitted on the run's training text)."""
    copy_baseline_tokens: int = bounded(0, "[0, inf)")
    """Fit the copy probe's n-gram baseline on the first this many training tokens (0 = all of
    them; a smoke test's shortcut: fewer tokens make a weaker baseline and more copy events)."""
    copy_heldout_tokens: int = bounded(0, "[0, inf)")
    """Look for copy events in the first this many held-out tokens only (0 = all of them; a
    smoke test's shortcut: fewer events to choose from, the same probe)."""
    copy_edges: list[int] = bounded(bounds="[1, inf)", default_factory=list)
    """Reach edges of the copy ranges, e.g. [8, 32, 64, 128, 256]: fine ranges between them
    (swax.probes.copies.copy_ranges); empty = the run's distance buckets (W_short, W_long, T,
    4T)."""
    copy_pooled: list[int] = bounded(bounds="[0, inf)", default_factory=list)
    """Lower edges p of pooled copy ranges (p, T] beside the fine ones (with copy_edges)."""
    copy_curve_events: int = bounded(0, "[0, inf)")
    """Copy gain per bucket (own window only) at every kept checkpoint, this many events per
    bucket; 0 = not evaluated."""
    copy_placebo: bool = False
    """Also the copy probe's placebo (swax.probes.copies.placebo_row) and the gain above it."""
    copy_past: int = bounded(0, "[0, inf)")
    """Read the copy ranges of reach <= T again at positions past T, in rows of copy_past × T
    tokens (the reach × position split; 0 = not read)."""
    copy_far_events: int = bounded(0, "[0, inf)")
    """Copy events per range read in rows longer than T (beyond T, and past T; 0 =
    copy_events): those rows cost several times a row of T."""
    copy_probe_keys: list[str] = field(default_factory=list)
    """Keys of the copy ranges read with the window cut and the recurrent reset (e.g. r8_32,
    beyond_128); empty = every range."""
    copy_probe_events: int = bounded(0, "[0, inf)")
    """The window-cut and reset probes read a random subset of this many of each range's
    events (0 = all): the reset reads each event in a forward of its own."""
    copy_curve_keys: list[str] = field(default_factory=list)
    """Keys of the copy ranges read at every checkpoint (copy_curve_events); empty = every
    range but the past-T ones."""
    passkey_trials: int = bounded(0, "[0, inf)")
    """The planted passkey (swax.probes.passkey): trials per distance; 0 = not evaluated."""
    passkey_distances: list[int] = bounded(bounds="[1, inf)", default_factory=list)
    """Passkey distances in tokens; empty = 32 doubling up to 16 T. The window-cut and reset
    probes are read at distances up to T."""
    emergence_samples: int = bounded(0, "[0, inf)")
    """When the memory emerged: at every checkpoint the run kept (and its final model), recall
    in the bucket (W_long, T] with the run's own window, the window cut to probe_window and the
    recurrent reset, this many episodes each; 0 = not evaluated. Keep every checkpoint
    (checkpoint.keep) for a curve with no gaps."""

    def __post_init__(self) -> None:
        check_fields(self, prefix="eval.")


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
    seeds: list[int] = bounded(bounds=SEED_BOUNDS, default_factory=list)
    """Seeds of the grid runs (default: the sweep's first seed)."""

    def __post_init__(self) -> None:
        check_fields(self, prefix="grid.")


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
    seeds: list[int] = bounded(bounds=SEED_BOUNDS, default_factory=lambda: [0, 1])
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
    jobs: int = bounded(1, "[1, inf)")
    """Runs trained and evaluated at the same time, each in its own process (with the base's
    `threads`); 2 on a 2-core machine with threads=1."""
    notes: str = ""
    """Free text quoted in the report (what else was tried, caveats)."""
    archive: str = ""
    """Folder (relative to the sweep YAML) where each finished and evaluated run leaves
    ``NAME/seedSEED.json`` (its eval.json, training summary and the episode ids it trained
    with, swax.sweep.archive: small, meant to be committed). A run whose archive file exists is
    neither trained nor evaluated again, so a study resumes from committed results on any
    machine; "" = no archive."""
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

    def __post_init__(self) -> None:
        check_fields(self)


def _merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in (b or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_sweep(path: str | Path, quick: bool = False) -> SweepConfig:
    cfg = from_dict(SweepConfig, load_yaml_mapping(path, "sweep config"))
    if quick and cfg.quick:
        _apply_quick(cfg, cfg.quick)
    if cfg.archive:
        cfg.archive = str(Path(path).resolve().parent / cfg.archive)
    check_fields(cfg)  # again: --quick may have changed values
    if not cfg.seeds:
        raise ConfigError("seeds must name at least one seed, got []")
    for name, overrides in cfg.runs.items():  # validate every run's config now
        if overrides is not None and not isinstance(overrides, dict):
            raise ConfigError(f"runs.{name}: expected a mapping of config keys, got {overrides!r}")
        tcfg = train_config(cfg, name, cfg.seeds[0], overrides)
        try:
            episode_config(cfg, tcfg)
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
        cfg.eval = from_dict(EvalSpec, _merge(to_dict(cfg.eval), q["eval"]))
    if "grid" in q:
        g = q["grid"]
        cfg.grid = (
            None
            if g is None
            else from_dict(GridSpec, _merge(to_dict(cfg.grid) if cfg.grid else {}, g))
        )
    for key in ("out_dir", "jobs", "archive"):
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
    return to_dict(train_config(cfg, "_", 0, overrides))  # same run_dir and seed for all


def grid_seeds(cfg: SweepConfig) -> list[int]:
    return list(cfg.grid.seeds) if cfg.grid and cfg.grid.seeds else cfg.seeds[:1]


def run_dir(cfg: SweepConfig, name: str, seed: int) -> Path:
    """The folder of run ``name`` (a grid point equal to a sweep run uses that run's folder)."""
    name = cfg.aliases.get(name, name)
    return Path(cfg.out_dir) / "runs" / f"{name}-s{seed}"


def archive_path(cfg: SweepConfig, name: str, seed: int) -> Path | None:
    """Where run ``name`` seed ``seed`` leaves its committed result (None: no archive)."""
    if not cfg.archive:
        return None
    return Path(cfg.archive) / cfg.aliases.get(name, name) / f"seed{seed}.json"


def run_overrides(cfg: SweepConfig, name: str) -> dict:
    """The overrides of a sweep run or a grid point."""
    if name in cfg.runs:
        return cfg.runs[name]
    if name in cfg.grid_runs:
        return cfg.grid_runs[name]
    raise ConfigError(f"unknown sweep run {name!r}; the sweep has {', '.join(cfg.runs)}")


def train_config(cfg: SweepConfig, name: str, seed: int, overrides: dict | None = None):
    data = _merge(cfg.base, overrides if overrides is not None else run_overrides(cfg, name))
    data.update(run_dir=str(run_dir(cfg, name, seed)), seed=seed)
    data.setdefault("log", {}).setdefault("progress", False)
    try:
        return from_dict(TrainConfig, data)
    except ConfigError as e:
        raise ConfigError(f"sweep run {name}: {e}") from None


def episode_config(cfg: SweepConfig, tcfg) -> SyntheticConfig:
    return from_dict(SyntheticConfig, _merge(to_dict(tcfg.data.synthetic), cfg.eval.episodes))

"""`swax sweep CONFIG`: train and evaluate a family of runs at an equal token budget.

A sweep YAML names a base training config, the variants to compare (each a set of overrides),
the seeds, and the evaluation. Every (variant, seed) run lives in ``out_dir/runs/NAME-sSEED``;
a finished run (its ``summary.json`` exists) is never retrained and a finished evaluation
(``eval.json``) is never redone, so a sweep can be stopped and started again at any time.

    swax sweep experiments/window_sweep/sweep.yaml            # all runs
    swax sweep experiments/window_sweep/sweep.yaml --quick    # the reduced version
    swax sweep experiments/window_sweep/sweep.yaml --only swax-w16,swax-w256

Evaluation of each run: validation loss (from training), retrieval accuracy on evaluation-key
episodes (:mod:`swax.probes.episodes`) at multiples of the training length, with the model's long
window and also with its training window where different, and loss by position
(:mod:`swax.eval.ppl`). ``aggregate`` gathers mean ± spread over seeds.

The package: :mod:`.config` (the sweep YAML: :class:`SweepConfig`, :func:`load_sweep`, each
run's :func:`train_config`), :mod:`.run` (training and evaluating the runs: :func:`run_sweep`),
:mod:`.archive` (a finished run's committed result, with the episode ids it trained with:
:func:`episode_ids`) and :mod:`.aggregate` (mean ± spread over seeds: :func:`aggregate`)."""

from swax.sweep.aggregate import EMERGED, aggregate, emergence, mean_spread
from swax.sweep.archive import episode_ids
from swax.sweep.config import (
    EvalSpec,
    GridSpec,
    SweepConfig,
    archive_path,
    episode_config,
    grid_seeds,
    load_sweep,
    run_dir,
    run_overrides,
    train_config,
)
from swax.sweep.run import STAGES, all_jobs, evaluate_run, run_script, run_sweep

__all__ = [
    "EMERGED",
    "STAGES",
    "EvalSpec",
    "GridSpec",
    "SweepConfig",
    "aggregate",
    "archive_path",
    "all_jobs",
    "emergence",
    "episode_config",
    "episode_ids",
    "evaluate_run",
    "grid_seeds",
    "load_sweep",
    "mean_spread",
    "run_dir",
    "run_overrides",
    "run_script",
    "run_sweep",
    "train_config",
]

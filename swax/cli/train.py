"""`swax train` and `swax plot-run`: a training run from a YAML config with key=value
overrides, and its loss curves."""

from __future__ import annotations

import os
from pathlib import Path

from swax.cli import options as C
from swax.core.errors import SwaxError
from swax.core.paths import check_writable_dir
from swax.train import load_train_config, train
from swax.train.plot import plot_run


def _split_train_args(items: list[str]) -> tuple[str | None, list[str]]:
    config, overrides = None, []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif config is None:
            config = item
        else:
            raise SwaxError(
                f"unexpected argument {item!r}: give one config file, then key=value overrides"
            )
    return config, overrides


def cmd_train(cfg: C.TrainArgs) -> int:

    config, overrides = _split_train_args(cfg.args)
    cfg = load_train_config(config, overrides)
    # keep=True: every rank of a distributed run checks; none may remove what another made
    check_writable_dir(cfg.run_dir, "run_dir", keep=True)
    summary = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        final = summary["final_val_loss"]
        if final == final:  # not NaN: the run had validation data
            print(
                f"validation loss: {summary.get('initial_val_loss', float('nan')):.4f} "
                f"(untrained) -> {final:.4f} (trained)"
            )
        else:
            print("validation loss: none (the run has no validation data; see above)")
        if summary.get("steps_run", 1):
            speed = f"{summary['tok_s']:,.0f} tokens/s"
        else:
            speed = f"no steps to train (the run had already finished its {summary['steps']})"
        print(f"throughput: {speed} | model: {summary['model_dir']}")
    return 0


def cmd_plot_run(cfg: C.PlotRunConfig) -> int:

    if cfg.out:
        check_writable_dir(Path(cfg.out).parent, "--out folder")
    elif Path(cfg.run).is_dir():  # (a missing run is plot_run's error)
        check_writable_dir(cfg.run, "run folder")
    print(plot_run(cfg.run, cfg.out))
    return 0

"""Helpers of the training tests: a small run's config, a hook that stops a run after a step, a
run's losses, the command line in this process (shared by the training, checkpoint, guard and
data tests)."""

import json

from swax.train import load_train_config

SMALL = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "seq_len=64",
    "batch_size=4",
    "window.short=8",
    "window.long=32",
    "log.val_batches=2",
    "log.every=1",
    "log.val_every=0",
    "optim.warmup_steps=2",
    "threads=1",
]


def small_cfg(tmp_path, *extra, name="run"):
    return load_train_config(None, [*SMALL, f"run_dir={tmp_path / name}", *extra])


class Stop(Exception):
    """Raised by :func:`stop_at`'s hook: a run interrupted after a chosen step."""


def stop_at(n):
    """An ``on_step_end`` hook that stops the run after step ``n``."""

    def hook(step, record):
        if step == n:
            raise Stop

    return hook


def losses(run_dir):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def cli(*args):
    """The `swax` command line in this process: its exit status."""
    from swax.cli import main

    return main(list(args))

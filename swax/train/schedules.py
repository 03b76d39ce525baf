"""Window and learning-rate schedules: pure functions of the step number.

A schedule called with a step returns that step's value, the same every time it is asked and
on every rank, with no hidden state — so a resumed run draws exactly the windows the
uninterrupted run would have drawn.

    from swax.train import FixedWindow, StochasticWindow
    sched = StochasticWindow(short=128, long=2048, p_short=0.5, anneal_frac=0.1,
                             total_steps=10_000, seed=0)
    window = sched(step)            # 128 or 2048; always 2048 for the last 10% of steps

:func:`window_schedule` builds a run's schedule from its config; with per-layer draws the
model lays them on its layers (:meth:`swax.config.SwaxConfig.layer_windows`).
"""

from __future__ import annotations

import hashlib
import math
import struct

from swax.config import SwaxConfig
from swax.ops.checks import check_window
from swax.train.config import TrainConfig


def _uniform(seed: int, step: int, stream: int = 0) -> float:
    """A uniform number in [0, 1) determined by (seed, step, stream) alone (counter-based)."""
    digest = hashlib.blake2b(struct.pack("<qqq", seed, step, stream), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


class FixedWindow:
    """The same window at every step."""

    def __init__(self, window: int):
        if window is None:
            raise ValueError("window must be a positive integer, got None")
        self.window = check_window(window)
        self.long = window

    def __call__(self, step: int) -> int:
        return self.window

    def __repr__(self) -> str:
        return f"FixedWindow({self.window})"

    def describe(self) -> str:
        """For a person: ``fixed 32``."""
        return f"fixed {self.window}"


class StochasticWindow:
    """Short window with probability ``p_short``, else long, drawn per optimizer step from a
    generator seeded by (seed, step); the long window for the final ``anneal_frac`` of
    ``total_steps`` (steps ``total_steps - ceil(anneal_frac · total_steps)`` onwards).

    With ``per_layer=n`` the call returns a tuple of n windows, one independent draw per
    sliding-window layer (all long in the anneal phase).
    """

    def __init__(
        self,
        short: int,
        long: int,
        p_short: float,
        anneal_frac: float,
        total_steps: int,
        seed: int = 0,
        per_layer: int | None = None,
    ):
        for name, v in (("short", short), ("long", long)):
            if v is None:
                raise ValueError(f"{name} must be a positive integer, got None")
            check_window(v, name)
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
        if short > long:
            raise ValueError(f"short window {short} must not exceed the long window {long}")
        if not 0 <= p_short <= 1:
            raise ValueError(f"p_short must be in [0, 1], got {p_short}")
        if not 0 <= anneal_frac <= 1:
            raise ValueError(f"anneal_frac must be in [0, 1], got {anneal_frac}")
        self.short, self.long, self.p_short = short, long, p_short
        self.anneal_frac, self.total_steps, self.seed = anneal_frac, total_steps, seed
        self.per_layer = per_layer
        self.anneal_start = total_steps - math.ceil(anneal_frac * total_steps)

    def __call__(self, step: int):
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step >= self.anneal_start:
            return self.long if self.per_layer is None else (self.long,) * self.per_layer
        if self.per_layer is None:
            return self.short if _uniform(self.seed, step) < self.p_short else self.long
        return tuple(
            self.short if _uniform(self.seed, step, 1 + j) < self.p_short else self.long
            for j in range(self.per_layer)
        )

    def __repr__(self) -> str:
        return (
            f"StochasticWindow(short={self.short}, long={self.long}, p_short={self.p_short}, "
            f"anneal_frac={self.anneal_frac}, total_steps={self.total_steps}, "
            f"seed={self.seed}{'' if self.per_layer is None else ', per_layer=True'})"
        )

    def describe(self) -> str:
        """For a person: ``stochastic: 32 with p 0.5, else 128; 128 from step 361 (last 10%)``."""
        each = " (drawn per layer)" if self.per_layer else ""
        text = f"stochastic: {self.short} with p {self.p_short:g}, else {self.long}{each}"
        if self.anneal_start < self.total_steps:
            text += f"; {self.long} from step {self.anneal_start + 1} (last {self.anneal_frac:.0%})"
        return text


class PerLayerWindows:
    """The per-layer draws of ``sched`` (one per windowed layer) laid on the model's layers by
    :meth:`SwaxConfig.layer_windows`: a window for each sliding-window layer, None for the
    layers that take none."""

    def __init__(self, sched: StochasticWindow, model: SwaxConfig):
        self.sched, self.model, self.long = sched, model, sched.long

    def describe(self) -> str:
        return self.sched.describe()

    def __call__(self, step: int) -> tuple[int | None, ...]:
        return self.model.layer_windows(self.sched(step))

    def __repr__(self) -> str:
        return repr(self.sched)


def window_schedule(cfg: TrainConfig, model: SwaxConfig, plan_steps: int | None = None):
    """The run's window schedule: step -> window (or a tuple of per-layer windows), laid over
    ``plan_steps`` (default ``cfg.steps``; steps past it are in the long-window anneal)."""
    w = cfg.window
    if w.kind == "fixed":
        return FixedWindow(w.fixed_window)
    n_windowed = len(model.window_layers)
    sched = StochasticWindow(
        w.short,
        w.long,
        w.p_short,
        w.anneal_frac,
        plan_steps or cfg.steps,
        cfg.seed,
        per_layer=n_windowed if (w.per_layer and n_windowed > 1) else None,
    )
    return sched if sched.per_layer is None else PerLayerWindows(sched, model)


def lr_at(
    step: int,
    total_steps: int,
    lr: float,
    warmup_steps: int,
    schedule: str,
    min_lr_ratio: float = 0.1,
    decay_frac: float = 0.2,
) -> float:
    """Learning rate of optimizer step ``step`` (0-based).

    Linear warmup from lr/warmup to lr over ``warmup_steps``; then ``cosine`` decays to
    ``min_lr_ratio·lr`` at the last step, ``wsd`` stays at lr and decays linearly to
    ``min_lr_ratio·lr`` over the final ``decay_frac`` of steps, ``constant`` stays at lr.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    min_lr = lr * min_lr_ratio
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = max(1, total_steps - 1 - warmup_steps)
        t = min(1.0, (step - warmup_steps) / span)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))
    if schedule == "wsd":
        decay_steps = max(1, math.ceil(decay_frac * total_steps))
        start = total_steps - decay_steps
        if step < start:
            return lr
        t = min(1.0, (step - start + 1) / decay_steps)
        return lr + (min_lr - lr) * t
    raise ValueError(f"unknown lr schedule {schedule!r}; expected cosine, wsd or constant")

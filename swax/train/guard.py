"""Bad steps: the one policy that decides what becomes of a step whose loss or gradient went
wrong (``guard`` in the config). :meth:`StepGuard.judge` reads a step's record and returns a
:class:`Verdict`; the step (:func:`swax.train.step.train_step`) applies the update only on a
``"step"`` verdict, and the loop (:mod:`swax.train.trainer`) acts on the others. The rules:

- A **bad step** (a non-finite gradient norm, or a loss spike when ``guard.spike_z`` > 0) is
  skipped: ``"skip"``. Its gradients are dropped before the optimizer sees them, so weights and
  AdamW moments stay as they were, and the same step is tried again on the next batch.
- The ``guard.max_bad_in_row``-th bad step in a row, or at once a non-finite loss, is a
  ``"rollback"``: the run goes back to its newest checkpoint and skips the batches that went
  wrong (the run of bad steps, or the batch whose loss was not finite) from then on; the data
  loader's position is in the checkpoint, so the replayed steps see the same batches as before,
  less those. A run rolled back this way ends with the weights of a run that was given
  ``guard.skip_batches`` from the start.
- A rollback past ``guard.max_rollbacks``, or with no checkpoint to go back to, is a ``"stop"``:
  the run ends with the verdict's one line, the last good checkpoint untouched.

Batches are counted globally (the n-th optimizer-step batch the run draws, identical on every
rank), so a batch index names the same data whatever the world size; the loss and gradient norm
are reduced over all ranks, so every rank reaches the same verdict.

The fault injector that drives the guard's tests is not a config key: :func:`faults_from_env`
reads ``SWAX_TEST_FAULTS`` (JSON, e.g. ``{"nan_grad": [3], "nan_loss": [5]}``: global batch
indices whose gradients or loss are made NaN), which reaches torchrun's workers too.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from swax.core.errors import ConfigError
from swax.train.config import GuardConfig

Action = Literal["step", "skip", "rollback", "stop"]


@dataclass(frozen=True)
class Verdict:
    """What becomes of one step. ``step``: the update is applied; ``skip``: dropped, the step
    is tried again on the next batch; ``rollback``: dropped, the run goes back to its newest
    checkpoint and skips ``batches`` from then on; ``stop``: dropped, the run ends with ``why``."""

    action: Action
    skipped: str = ""
    """Why the step's gradient was bad (a skipped step, logged as such; the last of a run of bad
    steps too); empty for a good step and for a non-finite loss, which is not a skipped step."""
    why: str = ""
    """rollback: why the run goes back; stop: the one line the run ends with."""
    batches: tuple[int, ...] = ()
    """rollback, stop: the batches skipped from now on because of this verdict."""
    in_row: int = 0
    """Bad steps in a row, this one included (0 unless ``skipped``)."""


class StepGuard:
    """The bad-step state of one run and the policy over it: the batches it skips, the bad
    steps in a row, the rollbacks made, the recent good losses the spike rule compares with."""

    def __init__(self, cfg: GuardConfig, checkpoint_every: int = 0):
        self.cfg = cfg
        self.checkpoint_every = checkpoint_every
        """checkpoint.every, named when there is no checkpoint to roll back to."""
        self.skip: set[int] = set(cfg.skip_batches)
        self.bad_in_row: list[int] = []
        """Global indices of the batches of the current run of bad steps."""
        self.rollbacks = 0
        self.losses: deque[float] = deque(maxlen=cfg.spike_window)

    def judge(self, record: dict, checkpoint: Path | None) -> Verdict:
        """The verdict on a step from its record (``step``, 1-based; ``batch``, its global
        index; ``loss``; ``grad_norm``), with the guard's counters updated to match.
        ``checkpoint``: the newest checkpoint the run can go back to, None when it has none."""
        step, batch, loss = record["step"], record["batch"], record["loss"]
        gnorm, can_roll_back = record["grad_norm"], checkpoint is not None
        if not math.isfinite(loss):
            why = (
                f"loss is {loss} at step {step} (batch {batch}); last good checkpoint: "
                f"{checkpoint if checkpoint else 'none'}"
            )
            return self._roll_back(why, [batch], can_roll_back, skipped="", in_row=0)
        bad = None
        if not math.isfinite(gnorm):
            bad = f"gradient norm {gnorm}"
        elif (z := self.spike(loss)) is not None:
            bad = (
                f"loss spike: {loss:.4f} is {z:.1f} standard deviations above the last "
                f"{self.cfg.spike_window} steps' mean"
            )
        if bad is None:
            self.bad_in_row.clear()
            self.losses.append(loss)
            return Verdict("step")
        self.bad_in_row.append(batch)
        n = len(self.bad_in_row)
        if n < self.cfg.max_bad_in_row:
            return Verdict("skip", skipped=bad, in_row=n)
        why = f"{n} bad steps in a row at step {step}"
        return self._roll_back(why, list(self.bad_in_row), can_roll_back, skipped=bad, in_row=n)

    def _roll_back(
        self, why: str, batches: list[int], can_roll_back: bool, skipped: str, in_row: int
    ) -> Verdict:
        """A rollback skipping ``batches`` from now on, or a stop when guard.max_rollbacks are
        spent or there is no checkpoint (the batches are skipped and the rollback counted either
        way, as the stop's line reports)."""
        self.skip.update(batches)
        self.bad_in_row.clear()
        self.losses.clear()
        self.rollbacks += 1
        limit = self.cfg.max_rollbacks
        stop = None
        if self.rollbacks > limit:
            stop = (
                f"{why}; stopping: guard.max_rollbacks={limit} rollback(s) spent (batches "
                f"skipped: {', '.join(map(str, sorted(self.skip)))}). Lower optim.lr, check "
                "the data, or resume=true with a higher guard.max_rollbacks"
            )
        elif not can_roll_back:
            stop = (
                f"{why}; stopping: no checkpoint to roll back to (checkpoint.every="
                f"{self.checkpoint_every}); lower optim.lr or check the data"
            )
        if stop is not None:
            return Verdict("stop", skipped, stop, tuple(batches), in_row)
        return Verdict("rollback", skipped, why, tuple(batches), in_row)

    def spike(self, loss: float) -> float | None:
        """The loss's distance above the recent mean in standard deviations when the spike rule
        calls it bad, else None (the rule is off, or fewer than spike_window good steps ran)."""
        z = self.cfg.spike_z
        if z <= 0 or len(self.losses) < self.losses.maxlen:
            return None
        n = len(self.losses)
        mean = sum(self.losses) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in self.losses) / (n - 1))
        if std == 0:
            return None if loss <= mean else math.inf
        score = (loss - mean) / std
        return score if score > z else None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"skip_batches": sorted(self.skip), "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's guard state, joined with this run's: batches skipped by the config or
        by a rollback made after the checkpoint stay skipped, and rollbacks stay counted."""
        self.skip.update(int(b) for b in state.get("skip_batches", ()))
        self.rollbacks = max(self.rollbacks, int(state.get("rollbacks", 0)))


# ---------------------------------------------------------------------- the test hook
FAULTS_ENV = "SWAX_TEST_FAULTS"


@dataclass(frozen=True)
class Faults:
    """The fault injector of the guard's tests: the global batch indices whose gradients
    (``nan_grad``) or loss (``nan_loss``) are made NaN."""

    nan_grad: frozenset[int] = frozenset()
    nan_loss: frozenset[int] = frozenset()

    def __call__(self, batch: int, loss: float, model: torch.nn.Module) -> float:
        """The step's loss after the faults of ``batch``; its gradients poisoned when asked
        (one gradient made NaN on every rank, so the global norm is NaN)."""
        if batch in self.nan_grad:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
                    break
        return float("nan") if batch in self.nan_loss else loss


def faults_from_env() -> Faults | None:
    """The injector ``SWAX_TEST_FAULTS`` asks for, None when it is unset or empty; a value that
    is not a JSON mapping of ``nan_grad`` / ``nan_loss`` to lists of batch indices is one
    ConfigError naming it."""
    text = os.environ.get(FAULTS_ENV, "").strip()
    if not text:
        return None
    try:
        spec = json.loads(text)
        if not isinstance(spec, dict) or set(spec) - {"nan_grad", "nan_loss"}:
            raise ValueError
        for v in spec.values():
            if not isinstance(v, list) or any(type(b) is not int or b < 0 for b in v):
                raise ValueError
    except (ValueError, TypeError):
        raise ConfigError(
            f"{FAULTS_ENV}={text!r}: expected JSON like "
            '{"nan_grad": [3], "nan_loss": [5]} (global batch indices >= 0)'
        ) from None
    return Faults(**{k: frozenset(v) for k, v in spec.items()})

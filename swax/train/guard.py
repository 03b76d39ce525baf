"""Bad steps survived: what :func:`swax.train.step.train_step` does with a step whose gradient
or loss went wrong, and what the loop does after too many of them (``guard`` in the config).

- A **bad step** (a non-finite gradient norm, or a loss spike when ``guard.spike_z`` > 0) is
  skipped: its gradients are dropped before the optimizer sees them, so weights and AdamW
  moments stay as they were, and the same step is tried again on the next batch. The skipped
  batch is logged with the step and its global index.
- After ``guard.max_bad_in_row`` bad steps in a row, or at once on a non-finite loss, the run
  **rolls back** to its newest checkpoint and adds the batches that went wrong to
  ``skip_batches``; the data loader's position is in the checkpoint, so the replayed steps see
  the same batches as before, less those. A run rolled back this way ends with the weights of a
  run that was given ``guard.skip_batches`` from the start.
- After ``guard.max_rollbacks`` rollbacks the run stops with one line.

Batches are counted globally (the n-th optimizer-step batch the run draws, identical on every
rank), so a batch index names the same data whatever the world size. The fault injector
(``guard.inject_nan_grad`` / ``inject_nan_loss``) exists for tests: it makes the named batches'
gradients or loss NaN.
"""

from __future__ import annotations

import math
from collections import deque

from swax.train.config import GuardConfig


class StepGuard:
    """The bad-step state of one run: the batches it skips, the bad steps in a row, the
    rollbacks made, and the recent good losses the spike rule compares with."""

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.skip: set[int] = set(cfg.skip_batches)
        self.bad_in_row: list[int] = []
        """Global indices of the batches of the current run of bad steps."""
        self.rollbacks = 0
        self.losses: deque[float] = deque(maxlen=cfg.spike_window)

    # ------------------------------------------------------------------ verdicts
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

    def good(self, loss: float) -> None:
        """A step that updated the weights: the run of bad steps ends."""
        self.bad_in_row.clear()
        self.losses.append(loss)

    def bad(self, batch: int) -> bool:
        """Record a skipped step on ``batch``; True when it makes max_bad_in_row in a row."""
        self.bad_in_row.append(batch)
        return len(self.bad_in_row) >= self.cfg.max_bad_in_row

    def rollback(self, batches: list[int]) -> int:
        """Skip ``batches`` from now on and count a rollback; returns the rollbacks made."""
        self.skip.update(batches)
        self.bad_in_row.clear()
        self.losses.clear()
        self.rollbacks += 1
        return self.rollbacks

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"skip_batches": sorted(self.skip), "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's guard state, joined with this run's: batches skipped by the config or
        by a rollback made after the checkpoint stay skipped, and rollbacks stay counted."""
        self.skip.update(int(b) for b in state.get("skip_batches", ()))
        self.rollbacks = max(self.rollbacks, int(state.get("rollbacks", 0)))

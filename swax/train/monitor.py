"""The laziness monitor: recall by distance bucket while a hybrid trains.

A hybrid of sliding-window attention and a recurrent layer can go *lazy*: attention answers
everything inside its window and the recurrent memory never learns to carry anything beyond
it (the SWAX paper's finding). The loss does not show it (answers within the window are most
of the supervised retrieval). With ``log.laziness_every: N`` the trainer evaluates, every N
steps and at the end, a fixed set of retrieval episodes (``data.synthetic``'s task, distances
drawn per bucket of :mod:`swax.probes.buckets`) with the long window and with the recurrent state
reset before the question, and logs to metrics.jsonl and TensorBoard:

- ``lazy/inside_long``, ``lazy/beyond_long``, ``lazy/beyond_T``: recall (%) inside the long
  window, beyond it within the training length, and beyond the training length;
- ``lazy/reset_beyond_long``: recall beyond the long window with the recurrent state reset
  (what attention alone gets there: near chance for any working memory);
- ``lazy/recall_<bucket>``: recall per bucket (le_short, short_long, long_T, T_4T);
- ``lazy/kind``: lazy, memory, partial or none (:func:`swax.probes.buckets.verdict`).

``swax plot-run`` draws them under the losses.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from swax.core.errors import ConfigError, SwaxError
from swax.probes.buckets import (
    chance_of,
    check_buckets,
    distance_buckets,
    recall_by_bucket,
    verdict,
)

MONITOR_SEED = 4321
"""Seed of the monitor's episodes: the same episodes at every evaluation."""


class LazinessMonitor:
    """Evaluates one model on the monitor's fixed episodes (see the module docstring)."""

    def __init__(self, cfg, haystack, tokenizer):
        w = cfg.window
        self.cfg = cfg
        self.syn = dataclasses.replace(cfg.data.synthetic, far_share=None)
        self.buckets = distance_buckets(w.short, w.long, cfg.seq_len, far=(4,))
        self.haystack, self.tokenizer = haystack, tokenizer
        self.chance = chance_of(self.syn)

    def check(self, model_vocab: int | None = None) -> None:
        """A ConfigError naming the keys when the monitor's episodes cannot be made (checked
        before training, not at the first evaluation)."""
        try:
            check_buckets(self.tokenizer, self.haystack, self.syn, self.buckets, model_vocab)
        except SwaxError as e:
            raise ConfigError(
                f"log.laziness_every={self.cfg.log.laziness_every}: the monitor's episodes do "
                f"not fit: {e}; raise seq_len (now {self.cfg.seq_len}), lower "
                "data.synthetic.min_distance, or set log.laziness_every=0"
            ) from None

    def __call__(self, model, window: int) -> dict:
        """The ``lazy/...`` metrics of ``model`` at ``window`` (the model is left in the mode
        it was in)."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                rows = recall_by_bucket(
                    model,
                    self.tokenizer,
                    self.haystack,
                    self.syn,
                    self.buckets,
                    self.cfg.log.laziness_samples,
                    window,
                    probe_window=self.cfg.window.short,
                    seed=MONITOR_SEED,
                )
        finally:
            model.train(was_training)
        T = self.cfg.seq_len
        v = verdict(rows, self.chance, T)
        out = {f"lazy/{k}": v[k] for k in ("inside_long", "beyond_long", "beyond_T")}
        mid = [r["probes"]["reset"] for r in rows if not r["inside_long"] and r["hi"] <= T]
        k, n = sum(r["correct"] for r in mid), sum(r["n"] for r in mid)
        out["lazy/reset_beyond_long"] = 100.0 * k / n if n else math.nan
        out["lazy/kind"] = v["kind"]
        for r in rows:
            out[f"lazy/recall_{r['key']}"] = r["acc"]
        return out

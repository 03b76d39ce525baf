"""The copy-probe stages of a sweep's evaluation (swax.probes.copies on held-out text): the copy
gain by range of reach on the final model, and its curve over the kept checkpoints. A mixin of
:class:`swax.sweep.run._EvalContext`, whose attributes (the run's configs, model, tokenizer,
held-out and training tokens, checkpoints) it reads."""

from __future__ import annotations

import numpy as np

from swax.data.copies import NgramBaseline
from swax.probes.buckets import distance_buckets
from swax.probes.copies import copy_gain, copy_ranges, plan_copy_events
from swax.train.peak import cache_dir


class CopyStages:
    """The stages ``copies`` and ``copy_curve`` (see swax.sweep.run.STAGES)."""

    def _copy_setup(self):
        w, T, ev = self.tcfg.window, self.tcfg.seq_len, self.ev
        if ev.copy_edges:
            buckets = copy_ranges(ev.copy_edges, T, ev.copy_pooled)
        else:
            buckets = distance_buckets(w.short, w.long, T, (4,))
        d = self.tcfg.data
        key = (d.source, d.format, d.field, d.tokenizer, d.val_source, d.val_fraction,
               d.split_seed, ev.copy_context, ev.copy_baseline_tokens)  # fmt: skip
        if key not in _BASELINES:  # one fit per training text and context in this process
            _BASELINES.clear()
            fit = np.asarray(self.train_tokens[: ev.copy_baseline_tokens or None])
            folder = cache_dir() / "ngram"
            _BASELINES[key] = NgramBaseline.cached(fit, ev.copy_context, folder)
        return buckets, _BASELINES[key]

    def _heldout(self):
        """The held-out tokens the copy events are drawn from (eval.copy_heldout_tokens)."""
        return self.val[: self.ev.copy_heldout_tokens or None]

    def _events(self) -> dict:
        """The copy events of the held-out rows by row length, found once per evaluation (both
        stages read them)."""
        return self.__dict__.setdefault("_copy_events", {})

    def copies(self) -> dict:
        """Copy gain by distance bucket on held-out text, with the window cut and the reset."""
        buckets, baseline = self._copy_setup()
        plans = plan_copy_events(self._heldout(), buckets, baseline, self.ev.copy_events,
                                 self.ev.seed, self.tok.eot_id, self._events())  # fmt: skip
        rows = copy_gain(
            self.model, plans, self.deploy_window,
            probe_window=self.ev.probe_window or self.tcfg.window.short,
            batch_size=self.ev.batch_size, seed=self.ev.seed,
        )  # fmt: skip
        return {"copies": {"context": self.ev.copy_context, "buckets": rows,
                           "interval": "bootstrap over documents"}}  # fmt: skip

    def copy_curve(self) -> dict:
        """Copy gain per bucket (own window) at every kept checkpoint and the final model."""
        buckets, baseline = self._copy_setup()
        per_step = self.tcfg.batch_size * self.tcfg.seq_len
        plans = plan_copy_events(self._heldout(), buckets, baseline,
                                 self.ev.copy_curve_events, self.ev.seed, self.tok.eot_id,
                                 self._events())  # fmt: skip
        points = []
        for step, load in self._checkpoints():
            rows = copy_gain(load(), plans, self.deploy_window, batch_size=self.ev.batch_size,
                             seed=self.ev.seed)  # fmt: skip
            points.append(
                {
                    "step": step,
                    "tokens": step * per_step,
                    "gain": {r["key"]: r["gain"]["mean"] for r in rows},
                    "ci": {r["key"]: r["gain"]["ci"] for r in rows},
                    "n": {r["key"]: r["n"] for r in rows},
                }
            )
        return {"copy_curve": points}


_BASELINES: dict[tuple, NgramBaseline] = {}
"""The n-gram baseline of the copy stages, kept for the next run on the same text."""

"""The copy-probe stages of a sweep's evaluation (swax.probes.copies on held-out text): the copy
gain by range of reach on the final model, and its curve over the kept checkpoints. A mixin of
:class:`swax.sweep.run._EvalContext`, whose attributes (the run's configs, model, tokenizer,
held-out and training tokens, checkpoints) it reads."""

from __future__ import annotations

import numpy as np

from swax.data.copies import NgramBaseline
from swax.probes.buckets import distance_buckets
from swax.probes.copies import copy_gain, copy_ranges, plan_copy_events
from swax.probes.passkey import passkey_retrieval
from swax.train.peak import cache_dir


class CopyStages:
    """The stages ``copies``, ``copy_curve`` and ``passkey`` (see swax.sweep.run.STAGES)."""

    def _copy_setup(self):
        w, T, ev = self.tcfg.window, self.tcfg.seq_len, self.ev
        if ev.copy_edges:
            buckets = copy_ranges(ev.copy_edges, T, ev.copy_pooled, ev.copy_past * T)
        else:
            buckets = distance_buckets(w.short, w.long, T, (4,))
        d = self.tcfg.data
        key = (d.source, d.format, d.field, d.tokenizer, d.val_source, d.val_fraction)
        key += (d.split_seed, ev.copy_context, ev.copy_baseline_tokens)
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

    def _plans(self, buckets, baseline, events: int, placebo: bool = False) -> list:
        """The copy events of ``buckets``: ``events`` per range, or eval.copy_far_events per
        range read in rows longer than T when that is set (drawn separately)."""
        ev, T, held = self.ev, self.tcfg.seq_len, self._heldout()
        kw = dict(seed=ev.seed, eot=self.tok.eot_id, cache=self._events(), placebo=placebo)
        if not ev.copy_far_events:
            return plan_copy_events(held, buckets, baseline, events, **kw)
        near = [b for b in buckets if b.length <= T]
        far = [b for b in buckets if b.length > T]
        plans = plan_copy_events(held, near, baseline, events, **kw)
        far_events = min(events, ev.copy_far_events)
        plans += plan_copy_events(held, far, baseline, far_events, **kw)
        order = {b.key: i for i, b in enumerate(buckets)}
        return sorted(plans, key=lambda p: order[p.row["key"]])

    def copies(self) -> dict:
        """Copy gain by distance bucket on held-out text, with the window cut and the reset
        (and with eval.copy_placebo the placebo and the gain above it)."""
        buckets, baseline = self._copy_setup()
        plans = self._plans(buckets, baseline, self.ev.copy_events, self.ev.copy_placebo)
        rows = copy_gain(
            self.model,
            plans,
            self.deploy_window,
            probe_window=self.ev.probe_window or self.tcfg.window.short,
            batch_size=self.ev.batch_size,
            seed=self.ev.seed,
            probe_keys=set(self.ev.copy_probe_keys) or None,
            probe_events=self.ev.copy_probe_events,
        )
        out = {"context": self.ev.copy_context, "buckets": rows}
        return {"copies": {**out, "interval": "bootstrap over documents"}}

    def copy_curve(self) -> dict:
        """Copy gain per bucket (own window) at every kept checkpoint and the final model (the
        ranges of eval.copy_curve_keys, else all but the past-T ones)."""
        buckets, baseline = self._copy_setup()
        keep = set(self.ev.copy_curve_keys)
        buckets = [
            b for b in buckets if not getattr(b, "min_pos", 0) and (not keep or b.key in keep)
        ]
        per_step = self.tcfg.batch_size * self.tcfg.seq_len
        plans = self._plans(buckets, baseline, self.ev.copy_curve_events)
        points = []
        for step, load in self._checkpoints():
            rows = copy_gain(
                load(), plans, self.deploy_window, batch_size=self.ev.batch_size, seed=self.ev.seed
            )
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

    def passkey(self) -> dict:
        """The planted passkey (swax.probes.passkey) with the run's own window, and the window
        cut and the reset at distances up to T."""
        T, ev = self.tcfg.seq_len, self.ev
        distances = list(ev.passkey_distances)
        d = 32
        while not ev.passkey_distances and d <= 16 * T:
            distances.append(d)
            d *= 2
        rows = passkey_retrieval(
            self.model,
            self.val,
            self.tok,
            distances,
            ev.passkey_trials,
            self.deploy_window,
            probe_window=ev.probe_window or self.tcfg.window.short,
            probe_distances=T,
            seed=ev.seed,
            batch_size=max(1, ev.batch_size // 4),
        )
        return {"passkey": {"trials": ev.passkey_trials, "rows": rows}}


_BASELINES: dict[tuple, NgramBaseline] = {}
"""The n-gram baseline of the copy stages, kept for the next run on the same text."""

"""A planted passkey in real text: the paper's needle-in-a-haystack, in a text model's own tokens.

A **trial** at distance d: held-out text, then ``prefix + key + suffix`` (by default
``key = "`` + 16 random hex digits + ``"``), then more held-out text, then ``prefix + key``
again, its key's first token exactly d tokens after the first key's. The repeat's key tokens
are read: the model's loss on them (nats per token) and whether greedy decoding after the prefix
reproduces the key exactly (every key token the top prediction given the true ones before it,
which is what a greedy decoder produces). The **control** trial is the same row with the first
key replaced by another random key: what the model predicts without the passkey (chance). The
**passkey gain** is the control's loss minus the trial's: what the first occurrence is worth.

d is the reach of the copy: predicting key token i of the repeat at position p + i − 1 needs key
token i of the first occurrence, d − 1 positions back, which a sliding window W sees when
d <= W (a stack of L such layers can relay it up to d <= L·(W − 1)). With the probes, the trial
is also read with the window cut to ``probe_window`` and with the recurrent layers' state emptied
right before the repeat's prefix (only attention can still bring the key to it).

Retrieval shares have 95 % Wilson score intervals over the trials; gains a 95 % percentile
interval from resampling the trials (independent: each draws its own key and its own stretches
of held-out text).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from swax.core.errors import SwaxError
from swax.core.progress import progress_bar
from swax.probes.episodes import reset_recurrent_state

HEX = "0123456789abcdef"
PREFIX = 'key = "'
SUFFIX = '"'
KEY_CHARS = 16
LEAD = 64
"""Held-out tokens before the first key's snippet."""
BOOTSTRAP = 1000


def wilson(k: int, n: int, z: float = 1.959964) -> list[float]:
    """95 % Wilson score interval of a share of k successes in n trials (NaN for n = 0)."""
    if n == 0:
        return [math.nan, math.nan]
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, mid - half), min(1.0, mid + half)]


def mean_interval(x, samples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Mean of ``x`` and its 95 % percentile bootstrap interval (trials resampled)."""
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return {"mean": math.nan, "ci": [math.nan, math.nan], "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), (samples, len(x)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(x.mean()), "ci": [float(lo), float(hi)], "n": int(len(x))}


class PasskeyTrials:
    """The rows of every trial at one distance (same key twice, and the control), built from
    held-out ``tokens`` with ``tokenizer``; everything that does not depend on the model."""

    def __init__(
        self,
        tokens,
        tokenizer,
        distance: int,
        trials: int,
        rng: np.random.Generator,
        prefix: str = PREFIX,
        suffix: str = SUFFIX,
        key_chars: int = KEY_CHARS,
    ):
        tokens = np.asarray(tokens)
        pre, suf = tokenizer.encode(prefix), tokenizer.encode(suffix)
        self.distance = distance
        (
            keys,
            self.same,
            self.ctrl,
        ) = [], [], []
        self.key_len = None
        for _ in range(trials):
            key, other = ("".join(rng.choice(list(HEX), key_chars)) for _ in range(2))
            k, o = tokenizer.encode(key), tokenizer.encode(other)
            while len(o) != len(k) or o == k:  # a control key of the key's token length
                o = tokenizer.encode("".join(rng.choice(list(HEX), key_chars)))
            keys.append(k)
            gap = distance - len(k) - len(suf) - len(pre)
            if gap < 0:
                raise SwaxError(
                    f"passkey distance {distance} is shorter than the key's snippet "
                    f"({len(pre) + len(k) + len(suf)} tokens: prefix {prefix!r}, {key_chars} hex "
                    "digits, suffix); use a longer distance"
                )
            lead, mid = self._filler(tokens, LEAD, rng), self._filler(tokens, gap, rng)
            self.same.append([*lead, *pre, *k, *suf, *mid, *pre, *k])
            self.ctrl.append([*lead, *pre, *o, *suf, *mid, *pre, *k])
        lengths = {len(k) for k in keys}
        if len(lengths) != 1:  # the tokenizer split keys of equal length differently
            n = min(lengths)
            keep = [i for i, k in enumerate(keys) if len(k) == n]
            self.same = [self.same[i] for i in keep]
            self.ctrl = [self.ctrl[i] for i in keep]
        self.key_len = min(lengths)
        self.same, self.ctrl = np.array(self.same), np.array(self.ctrl)
        self.prefix_len = len(pre)

    @staticmethod
    def _filler(tokens: np.ndarray, n: int, rng) -> np.ndarray:
        if n == 0:
            return tokens[:0]
        if len(tokens) <= n:
            raise SwaxError(f"the held-out text has {len(tokens)} tokens, fewer than {n + 1}")
        at = int(rng.integers(len(tokens) - n))
        return tokens[at : at + n]

    @property
    def reset_at(self) -> int:
        """Where the repeat's snippet starts (the reset probe empties the recurrent state here)."""
        return self.same.shape[1] - self.key_len - self.prefix_len


@torch.no_grad()
def read_keys(
    model, rows: np.ndarray, key_len: int, window, reset_at: int | None, batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the mean NLL of its last ``key_len`` tokens and whether each was the top
    prediction (exact greedy retrieval). ``reset_at``: the recurrent layers' state is emptied
    after that many tokens (None: never)."""
    device = model.embed.weight.device
    nll, exact = np.empty(len(rows)), np.empty(len(rows), bool)
    for b in range(0, len(rows), batch):
        x = torch.as_tensor(rows[b : b + batch], device=device)
        tail = x[:, -(key_len + 1) :]
        if reset_at is None:
            logits = model(x, window=window, logits_to_keep=key_len + 1)
        else:
            _, state = model(x[:, :reset_at], window=window, return_state=True, logits_to_keep=1)
            state = reset_recurrent_state(model, state)
            logits = model(x[:, reset_at:], window=window, state=state, logits_to_keep=key_len + 1)
        lp = torch.log_softmax(logits[:, -(key_len + 1) : -1].float(), -1)
        target = tail[:, 1:]
        tok_nll = -lp.gather(-1, target[..., None])[..., 0]
        nll[b : b + len(x)] = tok_nll.mean(1).cpu().numpy()
        exact[b : b + len(x)] = (lp.argmax(-1) == target).all(1).cpu().numpy()
    return nll, exact


def _reading(model, t: PasskeyTrials, window, reset: bool, batch: int, seed: int) -> dict:
    at = t.reset_at if reset else None
    a, hit = read_keys(model, t.same, t.key_len, window, at, batch)
    z, chance = read_keys(model, t.ctrl, t.key_len, window, at, batch)
    n = len(hit)
    return {
        "retrieved": float(hit.mean()),
        "retrieved_ci": wilson(int(hit.sum()), n),
        "control_retrieved": float(chance.mean()),
        "control_retrieved_ci": wilson(int(chance.sum()), n),
        "nll": float(a.mean()),
        "control_nll": float(z.mean()),
        "gain": mean_interval(z - a, seed=seed),
        "n": n,
    }


def passkey_retrieval(
    model,
    tokens,
    tokenizer,
    distances: list[int],
    trials: int,
    window,
    probe_window: int | None = None,
    probe_distances: int | None = None,
    seed: int = 1234,
    batch_size: int = 8,
    progress: bool = False,
    **snippet,
) -> list[dict]:
    """One row per distance of ``distances``: the passkey's retrieval share and gain with
    ``window`` over ``trials`` trials (drawn with ``seed``, the same for every model), and with
    ``probe_window`` set, the same read with the window cut to it and with the recurrent reset,
    at distances up to ``probe_distances`` (None: all). ``snippet``: prefix, suffix, key_chars."""
    if trials < 1:
        raise SwaxError(f"passkey trials must be >= 1, got {trials}")
    if not distances or min(distances) < 1:
        raise SwaxError(f"passkey distances must be >= 1, got {distances}")
    out = []
    bar = progress_bar(len(distances), "passkey", enabled=progress)
    for i, d in enumerate(distances):
        trial = PasskeyTrials(
            tokens, tokenizer, d, trials, np.random.default_rng([seed, i]), **snippet
        )
        row = {"distance": d, "key_tokens": trial.key_len, "row_tokens": trial.same.shape[1]}
        row.update(_reading(model, trial, window, False, batch_size, seed))
        if probe_window is not None and (probe_distances is None or d <= probe_distances):
            row["probes"] = {
                "window_cut": _reading(model, trial, probe_window, False, batch_size, seed),
                "reset": _reading(model, trial, window, True, batch_size, seed),
            }
        out.append(row)
        bar.update(1)
    bar.close()
    return out

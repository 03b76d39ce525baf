"""Recall by distance bucket (swax.probes.buckets) against stand-in models whose memory is known
by construction: one that sees only the last W tokens (purely lazy attention) and one that
sees everything (a perfect memory)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from swax.data import SyntheticConfig
from swax.data.mqar import mqar_ids
from swax.probes.buckets import distance_buckets, recall_by_bucket, verdict, wilson

CFG = SyntheticConfig(task="mqar", num_needles=1, num_queries=1, min_distance=2, mqar_first_id=128)
GUESS = int(mqar_ids(CFG)[1][0])  # what the stand-ins answer when they see no pair


@dataclasses.dataclass(frozen=True)
class _State:
    layers: tuple


class Retriever:
    """At a key token, the value that followed the key's first occurrence, if that value lies
    within the ``window`` the call is given (None: anywhere) -- attention and nothing else;
    otherwise the first value id (a guess, right 1 time in 16). Layer 0 is attention ("S"),
    so resetting the recurrent state changes nothing; with ``memory`` the model also has a
    recurrent layer ("X") that remembers everything, and resetting it forgets the past."""

    V = 257
    embed = torch.nn.Embedding(1, 1)
    training = False

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def __init__(self, memory: bool = False):
        self.memory = memory
        self.config = type("C", (), {"layer_types": "SX" if memory else "S"})

    def __call__(self, x, window=None, state=None, return_state=False, logits_to_keep=None):
        B, T = x.shape
        old = state.layers if state is not None else (None,) * len(self.config.layer_types)
        seen = [list(old[0][b]) if old[0] is not None else [] for b in range(B)]
        mem = [list(old[-1][b]) if self.memory and old[-1] is not None else [] for b in range(B)]
        logits = torch.zeros(B, T, self.V)
        for b in range(B):
            ctx = seen[b] + x[b].tolist()
            base = len(ctx) - T
            lost = len(seen[b]) - len(mem[b]) if self.memory else 0  # forgotten by a reset
            for t in range(base, len(ctx)):
                logits[b, t - base, GUESS] = 1.0
                first = ctx.index(ctx[t])
                if first == t:
                    continue
                reach = t - (first + 1) + 1  # the value at first + 1
                by_attention = window is None or reach <= window
                by_memory = self.memory and first + 1 >= lost
                if by_attention or by_memory:
                    logits[b, t - base, ctx[first + 1]] = 50.0
            seen[b] = ctx
            mem[b] = ctx[lost:] if self.memory else []
        layers = (seen, mem) if self.memory else (seen,)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return (logits, _State(layers)) if return_state else logits


def test_buckets_of_a_run():
    got = [
        (b.label, b.key, b.lo, b.hi, b.length, b.inside_long) for b in distance_buckets(8, 32, 256)
    ]
    assert got == [
        ("≤W_short", "le_short", 0, 8, 256, True),
        ("(W_short, W_long]", "short_long", 8, 32, 256, True),
        ("(W_long, T]", "long_T", 32, 256, 256, False),
        ("(T, 4T]", "T_4T", 256, 1024, 1024, False),
        ("(4T, 16T]", "4T_16T", 1024, 4096, 4096, False),
    ]
    # W_long = T: no bucket between them
    assert [b.hi for b in distance_buckets(8, 64, 64)] == [8, 64, 256, 1024]


def test_wilson_interval():
    # hand-computed: 5 of 10 -> 0.5 ± 1.96·sqrt(0.025 + 0.0096)/1.384 = [23.66, 76.34] %
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(23.659, abs=1e-3) and hi == pytest.approx(76.341, abs=1e-3)
    assert wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == 100.0
    assert all(math.isnan(x) for x in wilson(0, 0))


def _rows(model, samples=24, probe=8):
    buckets = distance_buckets(8, 32, 64, far=(4,))
    return recall_by_bucket(
        model, None, [], CFG, buckets, samples, window=32, probe_window=probe, batch_size=8
    )


def test_a_lazy_model_is_read_as_lazy():
    rows = _rows(Retriever())
    acc = {r["bucket"]: r["acc"] for r in rows}
    assert acc["≤W_short"] == acc["(W_short, W_long]"] == 100.0
    for r in rows:
        assert r["n"] == 24 and r["correct"] == round(r["acc"] * 24 / 100)
        assert r["lo"] < r["hi"]
    # beyond the window: only the guess, right when the value is the first value id
    assert acc["(W_long, T]"] < 30 and acc["(T, 4T]"] < 30
    cut = {r["bucket"]: r["probes"]["window_cut"]["acc"] for r in rows}
    reset = {r["bucket"]: r["probes"]["reset"]["acc"] for r in rows}
    assert cut["≤W_short"] == 100.0 and cut["(W_short, W_long]"] < 30  # cut to 8 tokens
    assert reset == acc  # no recurrent memory to reset
    v = verdict(rows, chance=6.25, seq_len=64)
    assert v["inside_long"] == 100.0 and v["beyond_long"] == acc["(W_long, T]"]
    assert v["kind"] == ("lazy" if v["beyond_long"] <= 16.25 else "partial")


def test_a_model_with_memory_is_read_as_memory():
    rows = _rows(Retriever(memory=True))
    assert all(r["acc"] == 100.0 for r in rows)
    for r in rows:
        assert r["probes"]["window_cut"]["acc"] == 100.0  # the memory still has it
        # reset before the question: only attention is left
        assert (r["probes"]["reset"]["acc"] == 100.0) == (r["hi"] <= 32)
    v = verdict(rows, chance=6.25, seq_len=64)
    assert v["kind"] == "memory" and v["beyond_T"] == 100.0


def test_verdict_classes():
    def row(lo, hi, inside, k, n=100):
        return {"lo": lo, "hi": hi, "inside_long": inside, "correct": k, "n": n}

    def kind(a, b, c):
        rows = [row(0, 32, True, a), row(32, 256, False, b), row(256, 1024, False, c)]
        return verdict(rows, 6.25, 256)["kind"]

    assert kind(95, 10, 6) == "lazy"
    assert kind(95, 20, 6) == "partial"  # 20 > 6.25 + 10
    assert kind(95, 60, 40) == "memory"
    assert kind(40, 6, 6) == "none"
    assert kind(85, 6, 6) == "partial"  # below 90 inside


# ------------------------------------------------------------------------------ the monitor


def _train_cfg(tmp_path, **log):
    from swax.train.config import load_train_config

    over = [
        f"run_dir={tmp_path / 'run'}",
        "steps=6",
        "seq_len=64",
        "batch_size=4",
        "threads=1",
        "window.kind=fixed",
        "window.short=8",
        "window.long=16",
        "model.d_model=32",
        "model.n_layers=2",
        "data.synthetic.task=mqar",
        "data.synthetic.fraction=0.5",
        "data.synthetic.answers_only=true",
        "data.synthetic.min_distance=2",
        "log.val_every=0",
        "log.tensorboard=false",
        "log.every=1",
    ]
    return load_train_config(None, over + [f"log.{k}={v}" for k, v in log.items()])


def test_monitor_reads_a_lazy_and_a_remembering_model(tmp_path):
    from swax.train.monitor import LazinessMonitor

    cfg = _train_cfg(tmp_path, laziness_samples=16)
    cfg.data.synthetic.mqar_first_id = 128  # the stand-ins' vocabulary (257 ids)
    mon = LazinessMonitor(cfg, [], None)
    lazy = mon(Retriever(), 16)
    assert lazy["lazy/inside_long"] == 100.0 and lazy["lazy/recall_le_short"] == 100.0
    assert lazy["lazy/beyond_long"] < 40 and lazy["lazy/reset_beyond_long"] < 40
    assert lazy["lazy/kind"] in ("lazy", "partial")
    mem = mon(Retriever(memory=True), 16)
    assert mem["lazy/beyond_long"] == mem["lazy/beyond_T"] == 100.0
    assert mem["lazy/reset_beyond_long"] == lazy["lazy/reset_beyond_long"]  # attention alone
    assert mem["lazy/kind"] == "memory"


def test_training_logs_the_monitor_and_plot_run_draws_it(tmp_path):
    import json

    from swax.train import train
    from swax.train.plot import plot_run

    train(_train_cfg(tmp_path, laziness_every=4, laziness_samples=4))
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lazy_steps = [r["step"] for r in recs if "lazy/inside_long" in r]
    assert lazy_steps == [4, 6]  # every 4 steps and at the end
    rec = next(r for r in recs if r["step"] == 4)
    assert rec["lazy/kind"] in ("lazy", "memory", "partial", "none")
    assert {"lazy/recall_short_long", "lazy/recall_long_T", "lazy/recall_T_4T"} <= set(rec)
    assert plot_run(tmp_path / "run").is_file()

"""``swax demo``: the default job (train the tiny model on the KJV, then generate), and
``swax demo recall``: the paper's window effect on a laptop, in about 4 minutes.

Two small SWAX models (2 layers, d_model 64) learn one-pair associative recall (MQAR: a key and
its value somewhere in a stretch of filler, the key asked again at the end) at a training
length of 64 tokens, one with a short sliding window (8) and one with a long one (64, the whole
training sequence). Then both are asked at 1× … 32× the training length with their own window.
The long-window model solves the task with attention and fails once the pair is out of its
window; the short-window model had to learn it in its recurrent mLSTM memory, which carries the
pair far beyond the training length. The full study, with seeds, the stochastic schedule and
other layer types, is experiments/window_sweep/.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from swax.cli import options as C
from swax.cli.common import fmt_bytes
from swax.core.paths import check_writable_dir
from swax.data import (
    DataConfig,
    SyntheticConfig,
    build_datasets,
    load_model_tokenizer,
)
from swax.data.sources import kjv_documents
from swax.eval.recall import (
    recall_by_window,
)
from swax.generate import generate, prefill
from swax.model import SwaxLM
from swax.train import load_train_config, train
from swax.train.checkpoint import latest_checkpoint

SEQ_LEN = 64
WINDOWS = {"short": 8, "long": 64}
MULTIPLES = (1, 2, 4, 8, 16, 32)
BASE = [
    "model.preset=tiny",
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.recurrent_heads=2",
    "model.qk_dim_factor=1.0",
    "model.mlstm_igate_bias_init=-4",
    "data.source=kjv",
    "data.tokenizer=byte",
    "data.synthetic.task=mqar",
    "data.synthetic.fraction=1.0",
    "data.synthetic.num_needles=1",
    "data.synthetic.num_queries=1",
    "data.synthetic.answers_only=true",
    "data.synthetic.min_distance=8",
    "window.kind=fixed",
    "window.short=8",
    "window.long=64",
    f"seq_len={SEQ_LEN}",
    "batch_size=32",
    "steps=1200",
    "optim.lr=3e-3",
    "optim.schedule=cosine",
    "optim.warmup_steps=50",
    "checkpoint.every=400",
    "log.every=200",
    "log.val_every=0",
    "log.val_batches=1",
    "log.tensorboard=false",
]
"""The window study's one-pair setting (experiments/window_sweep/sweep.yaml), shortened."""


def train_pair(run_dir: Path, overrides: list[str]) -> dict[str, Path]:
    """Train (or reuse, or resume) the short- and long-window models; {role: model folder}."""

    models = {}
    for role, window in WINDOWS.items():
        rd = run_dir / role
        if not ((rd / "summary.json").is_file() and (rd / "model").is_dir()):
            resume = ["resume=true"] if latest_checkpoint(rd) is not None else []
            print(f"swax demo recall: training the {role}-window model (W = {window}) in {rd}")
            cfg = load_train_config(
                None, [*BASE, f"window.fixed={window}", f"run_dir={rd}", *overrides, *resume]
            )
            train(cfg)
        else:
            print(f"swax demo recall: reusing the finished {role}-window run in {rd}")
        models[role] = rd / "model"
    return models


def evaluate_pair(models: dict[str, Path], samples: int = 64) -> dict:
    """Recall (%) of each model with its own window at every multiple: {role: {length: acc}}."""

    episodes = SyntheticConfig(
        task="mqar", fraction=1.0, num_needles=1, num_queries=1, min_distance=8
    )
    lengths = [m * SEQ_LEN for m in MULTIPLES]
    out = {}
    for role, path in models.items():
        model = SwaxLM.from_pretrained(path).eval()
        tok = load_model_tokenizer(path)
        _, val = build_datasets(DataConfig(), tok, seq_len=1, seed=0)
        res = recall_by_window(
            model, tok, val.tokens, episodes, lengths, samples, {"own": WINDOWS[role]}
        )
        out[role] = {int(n): r["acc"] for n, r in res["episodes_own"].items()}
    return out


def run(run_dir: str | Path, overrides: list[str], samples: int = 64) -> dict:
    """Train both models, evaluate them, print the table and what it shows; returns the
    recall table (also written to RUN_DIR/recall.json)."""
    run_dir = Path(run_dir)
    recall = evaluate_pair(train_pair(run_dir, overrides), samples)
    lengths = sorted(recall["short"])
    print(
        f"\nrecall (%) of the key's value, {samples} episodes per length (chance 6.25%), "
        "each model with its own window:"
    )
    print(f"{'context':>16}  {'short W=8':>9}  {'long W=64':>9}")
    for n in lengths:
        print(
            f"{n:>6} ({n // SEQ_LEN:>2}x train)  {recall['short'][n]:>9.1f}  "
            f"{recall['long'][n]:>9.1f}"
        )
    beyond = {r: sum(recall[r][n] for n in lengths[1:]) / (len(lengths) - 1) for r in recall}
    print(
        f"\nbeyond the training length the short-window model keeps {beyond['short']:.0f}% on "
        f"average, the long-window model {beyond['long']:.0f}%: "
        + (
            "the short window made the recurrent memory learn recall that extrapolates; the "
            "long window let attention do it, which stops at the window (the paper's effect)."
            if beyond["short"] >= beyond["long"] + 20
            else "no clear window effect in this run (too few steps? the full run uses 1200)."
        )
    )
    (run_dir / "recall.json").write_text(
        json.dumps({r: {str(n): v for n, v in t.items()} for r, t in recall.items()}, indent=1)
    )
    return recall


def cmd_demo(args: C.DemoConfig) -> int:
    """Train the tiny SWAX model on the embedded corpus (or reuse a finished demo run), show the
    loss it reached, generate a sample, and show that its decode state does not grow."""

    if args.overrides[:1] == ["recall"]:  # swax demo recall [--run-dir DIR] [key=value ...]
        run_dir = args.run_dir if args.run_dir != C.DemoConfig.run_dir else "runs/demo-recall"
        check_writable_dir(run_dir, "--run-dir", keep=True)
        run(run_dir, args.overrides[1:])
        return 0
    run_dir = Path(args.run_dir)
    overrides = [f"run_dir={run_dir}", *args.overrides]
    summary_file = run_dir / "summary.json"
    if summary_file.is_file() and (run_dir / "model").is_dir():
        summary = json.loads(summary_file.read_text())
        print(f"swax demo: reusing the finished run in {run_dir} (delete it to train again)")
    else:
        check_writable_dir(run_dir, "--run-dir", keep=True)
        resume = latest_checkpoint(run_dir) is not None
        print(
            f"swax demo: training the tiny SWAX model on the King James Bible "
            f"({'resuming' if resume else 'a few minutes on a CPU'}) into {run_dir}"
        )
        summary = train(load_train_config(None, overrides + (["resume=true"] if resume else [])))
    print(
        f"\nvalidation loss (nats/byte): untrained {summary['initial_val_loss']:.3f} -> "
        f"trained {summary['final_val_loss']:.3f}"
    )
    model = SwaxLM.from_pretrained(run_dir / "model")
    tok = load_model_tokenizer(run_dir / "model")
    prompt = "And God said unto Moses,"
    ids = torch.tensor([tok.encode(prompt)])
    out = generate(model, ids, max_new_tokens=200, temperature=0.7, top_k=40, seed=0)
    print(
        f"\nsample (temperature 0.7, window {model.config.window}):\n{prompt}"
        f"{tok.decode(out[0, ids.shape[1] :].tolist())}\n"
    )
    text = "\n".join(kjv_documents()[-40:])  # Revelation and its neighbours: ~100k bytes
    ctx_ids = tok.encode(text)
    for n in (1024, args.context):
        ctx = torch.tensor([(ctx_ids * (n // len(ctx_ids) + 1))[:n]])
        _, state = prefill(model, ctx)
        print(f"decode state after {n:>6,} tokens of context: {fmt_bytes(state.nbytes())}")
    return 0

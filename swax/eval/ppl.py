"""`swax eval ppl`: loss by position on held-out text, far beyond the training length.

Each sample is a stretch of ``max(lengths)`` consecutive tokens of held-out text, fed through
the model in chunks with the decode state carried across them (so memory is bounded by the
chunk, whatever the length). The per-position negative log-likelihood is averaged over samples
inside the buckets (0, l1], (l1, l2], … given by ``lengths``: a flat curve means the model
extrapolates; a rising one means it does not.

Writes ``ppl.csv`` (bucket_start, bucket_end, loss, ppl, tokens), ``ppl.json`` (the settings
and the same rows) and ``ppl.png``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from swax.core.errors import SwaxError
from swax.core.plotting import save_curves
from swax.core.progress import progress_bar
from swax.generate import PREFILL_CHUNK
from swax.state import DEFAULT_WINDOW

RESULT_FILES = ("ppl.csv", "ppl.json", "ppl.png")
"""The files :func:`write_ppl` (``swax eval ppl``) writes in its results folder."""


def stretch_starts(n_tokens: int, length: int, samples: int) -> list[int]:
    """Where ``samples`` stretches of ``length`` tokens start, spread evenly over ``n_tokens``
    (the first at 0, the last at the end)."""
    if samples == 1:
        return [0]
    span = n_tokens - length
    return [int(round(i * span / (samples - 1))) for i in range(samples)]


@torch.no_grad()
def position_losses(
    model,
    tokens: np.ndarray,
    length: int,
    samples: int,
    window=DEFAULT_WINDOW,
    chunk: int = PREFILL_CHUNK,
    progress: bool = True,
) -> np.ndarray:
    """(samples, length - 1) NLL of token t+1 given tokens ≤ t, for ``samples`` stretches of
    ``length`` tokens spread evenly over ``tokens``. ``window``: keys each query sees, None for
    full attention, DEFAULT_WINDOW (the default) for ``model.config.window``."""
    if len(tokens) < length:
        raise SwaxError(
            f"the held-out text has {len(tokens):,} tokens, fewer than the longest "
            f"length {length:,}; pass longer --data or shorter --lengths"
        )
    starts = stretch_starts(len(tokens), length, samples)
    w = model.config.window if window is DEFAULT_WINDOW else window
    out = np.zeros((samples, length - 1), dtype=np.float64)
    steps = samples * math.ceil(length / chunk)
    bar = progress_bar(steps, "ppl", "chunk", enabled=progress)
    device = model.embed.weight.device
    for i, s in enumerate(starts):
        ids = torch.as_tensor(np.asarray(tokens[s : s + length], dtype=np.int64))[None].to(device)
        state = None
        for c in range(0, length, chunk):
            x = ids[:, c : c + chunk]
            logits, state = model(x, window=w, state=state, return_state=True)
            # targets: the next token; the chunk's last position predicts the next chunk's first
            tgt = ids[:, c + 1 : c + 1 + x.shape[1]]
            n = tgt.shape[1]
            nll = F.cross_entropy(logits[0, :n].float(), tgt[0], reduction="none")
            out[i, c : c + n] = nll.double().cpu().numpy()
            bar.update(1)
    bar.close()
    return out


def bucketize(losses: np.ndarray, edges: list[int]) -> list[dict]:
    """Mean loss in the position buckets (0, e1], (e1, e2], … (positions are 1-based targets)."""
    rows, lo = [], 0
    for hi in edges:
        seg = losses[:, lo : min(hi, losses.shape[1])]  # predictions with lo+1 … hi tokens seen
        if seg.size:
            m = float(seg.mean())
            rows.append(
                {
                    "bucket_start": lo,
                    "bucket_end": hi,
                    "loss": m,
                    "ppl": math.exp(m),
                    "tokens": int(seg.size),
                }
            )
        lo = hi
    return rows


def write_ppl(
    out_dir: str | Path, rows: list[dict], settings: dict, train_len: int | None = None
) -> tuple[Path, Path]:

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "ppl.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["bucket_start", "bucket_end", "loss", "ppl", "tokens"])
        w.writeheader()
        w.writerows(rows)
    (out / "ppl.json").write_text(json.dumps({"settings": settings, "buckets": rows}, indent=1))
    png = save_curves(
        out / "ppl.png",
        {
            settings.get("label", "model"): (
                [r["bucket_end"] for r in rows],
                [r["loss"] for r in rows],
            )
        },
        "position (end of bucket, tokens)",
        "loss (nats/token)",
        figsize=(7, 4),
        vlines=[(train_len, f"training length {train_len}")] if train_len else (),
        ylim=(0, None),  # from zero: a flat curve must look flat
        legend_size=10,
    )
    return csv_path, png

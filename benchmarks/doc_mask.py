"""What document masking costs in training: tokens/s with and without ``doc_ids``, same run.

For each preset, pattern and sequence length: one randomly initialised model, one training step
(forward, cross-entropy, backward, AdamW) on packed rows without document ids and one with
them, timed in interleaved rounds (so a slow spell of a shared machine hits both alike). The
documents of a row have lengths drawn from an exponential distribution (mean ``--mean-doc``
tokens, at least 1), as packed web text roughly is. Printed: tokens/s of both and their ratio.

    python benchmarks/doc_mask.py                           # tiny and small; SX SD; 2048 8192
    python benchmarks/doc_mask.py --presets tiny --seq 2048 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402


def packed_doc_ids(batch: int, seq: int, mean: float, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        ids, doc = [], 0
        while len(ids) < seq:
            n = max(1, int(rng.exponential(mean)))
            ids += [doc] * n
            doc += 1
        rows.append(ids[:seq])
    return torch.tensor(rows)


def measure(preset, pattern, seq, tokens_per_step, rounds, mean_doc, seed=0):
    torch.manual_seed(seed)
    cfg = SwaxConfig.preset(preset, layer_pattern=pattern)
    model = SwaxLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = max(1, tokens_per_step // seq)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    doc = packed_doc_ids(batch, seq, mean_doc, seed)

    def step(doc_ids):
        extra = {} if doc_ids is None else {"doc_ids": doc_ids}
        logits = model(ids[:, :-1], window=cfg.window, **extra)
        F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(None), step(doc)  # warm-up
    times = {"plain": [], "masked": []}
    for _ in range(rounds):
        for name, d in (("plain", None), ("masked", doc)):
            t0 = time.perf_counter()
            step(d)
            times[name].append(time.perf_counter() - t0)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    docs = int(doc.max(dim=1).values.sum()) + batch
    return batch * seq / med["plain"], batch * seq / med["masked"], docs / batch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--patterns", nargs="+", default=["SX", "SD"])
    ap.add_argument("--seq", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--tokens-per-step", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mean-doc", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine_line())
    print(
        f"# training step = forward + cross-entropy + backward + AdamW; {args.tokens_per_step:,} "
        f"tokens per step; float32; documents ~ exponential, mean {args.mean_doc:g} tokens; "
        f"median of {args.rounds} interleaved rounds after 1 warm-up step"
    )
    print(
        f"{'preset':>6} {'pattern':>7} {'seq':>6} {'docs/row':>8} {'plain tok/s':>12} "
        f"{'doc_mask tok/s':>15} {'masked/plain':>13}"
    )
    for preset in args.presets:
        for pattern in args.patterns:
            for seq in args.seq:
                plain, masked, per_row = measure(
                    preset, pattern, seq, args.tokens_per_step, args.rounds, args.mean_doc
                )
                print(
                    f"{preset:>6} {pattern:>7} {seq:>6} {per_row:>8.1f} {plain:>12,.0f} "
                    f"{masked:>15,.0f} {masked / plain:>12.2f}x",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Token budget, FLOPs and wall-time estimate of the paper-scale runs, from the configs.

    python experiments/paper_scale/estimate.py
    python experiments/paper_scale/estimate.py --gpus 64 --peak-tflops 989 --mfu 0.4

FLOPs per token come from ``SwaxLM.flops_per_token`` (forward + backward = 3× forward, at the
config's sequence length and, for a stochastic schedule, the expected window:
p_short·(1 − anneal) of the steps at the short window, the rest at the long one). The model is
built on the meta device, so nothing is allocated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from swax.model import SwaxLM
from swax.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]


def estimate(path: Path, gpus: int, peak_tflops: float, mfu: float) -> dict:
    cfg = load_train_config(path)
    with torch.device("meta"):
        model = SwaxLM(cfg.model)
    w = cfg.window
    if w.kind == "stochastic":
        share_short = w.p_short * (1 - w.anneal_frac)
        fpt = share_short * model.flops_per_token(cfg.seq_len, w.short) + (
            1 - share_short
        ) * model.flops_per_token(cfg.seq_len, w.long)
    else:
        fpt = model.flops_per_token(cfg.seq_len, w.fixed or w.long)
    tokens = cfg.steps * cfg.batch_size * cfg.seq_len
    total = fpt * tokens
    gpu_hours = total / (peak_tflops * 1e12 * mfu) / 3600
    return {
        "config": str(path.relative_to(ROOT)),
        "params": model.num_parameters(),
        "tokens": tokens,
        "flops_per_token": fpt,
        "total_flops": total,
        "gpu_hours": gpu_hours,
        "wall_hours": gpu_hours / gpus,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "configs",
        nargs="*",
        default=[str(ROOT / "configs/swax-1.4b.yaml"), str(ROOT / "configs/swax-7b.yaml")],
    )
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument(
        "--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU (989: H100 SXM)"
    )
    ap.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation")
    args = ap.parse_args(argv)
    print(f"# {args.gpus} GPUs at {args.peak_tflops:g} TFLOP/s peak, {args.mfu:.0%} MFU")
    print(
        "| config | parameters | tokens | GFLOP/token (train) | total FLOPs | GPU-hours "
        f"| wall time on {args.gpus} GPUs |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in args.configs:
        e = estimate(Path(c).resolve(), args.gpus, args.peak_tflops, args.mfu)
        print(
            f"| {e['config']} | {e['params'] / 1e9:.2f}B | {e['tokens'] / 1e9:.0f}B | "
            f"{e['flops_per_token'] / 1e9:.2f} | {e['total_flops']:.2e} | "
            f"{e['gpu_hours']:,.0f} | {e['wall_hours']:.1f} h |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

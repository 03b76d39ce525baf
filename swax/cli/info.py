"""`swax info`: parameters, layers, FLOPs per token and the backends on this machine."""

from __future__ import annotations

import torch

from swax.cli import options as C
from swax.cli.common import preset_name
from swax.config import SwaxConfig
from swax.model import SwaxLM


def cmd_info(cfg: C.InfoConfig) -> int:

    if cfg.model:
        model = SwaxLM.from_pretrained(cfg.model)
    else:
        with torch.device("meta"):  # shapes only: no memory
            model = SwaxLM(SwaxConfig.preset(preset_name(cfg)))
    mc = model.config
    print(f"layers        {mc.n_layers}  pattern {mc.layer_types}")
    print(f"d_model       {mc.d_model}  heads {mc.n_heads}  window {mc.window}")
    print(
        f"parameters    {model.num_parameters():,} "
        f"({model.num_parameters(exclude_embeddings=True):,} without embeddings)"
    )
    for T in cfg.seq_len:
        f = model.flops_per_token(T)
        print(f"train FLOPs/token at T={T}: {f / 1e9:.3f} GFLOP")
    _print_backends()
    return 0


def _print_backends() -> None:
    """Each op's backends on this machine's device: usable or why not, with the versions of
    the packages each one uses (a kernel may still turn some inputs away: head dims, dtypes)."""
    from swax.ops.registry import backend_report
    from swax.ops.triton_env import INTERPRET_ENV, interpreting

    device = "cuda" if torch.cuda.is_available() else "cpu"
    note = f", Triton's interpreter on ({INTERPRET_ENV})" if interpreting() else ""
    print(f"backends on {device}{note} (most preferred first):")
    for row in backend_report(device):
        pk = ", ".join(f"{p} {v or 'not installed'}" for p, v in row["packages"].items())
        state = "usable" if row["reason"] is None else f"unusable: {row['reason']}"
        print(f"  {row['op']:<13}{row['name']:<14}{state}" + (f" [{pk}]" if pk else ""))

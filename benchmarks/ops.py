"""Speed of swax's ops against references measured in the same run.

For each sequence length T: forward and forward+backward tokens/s of

- ``swa``: ``sliding_window_attention`` (window W) vs ``scaled_dot_product_attention`` with an
  explicit T×T band mask (skipped when that mask's scores would not fit in memory);
- ``mlstm``: ``mlstm(mode="chunk")`` vs mlstm_kernels' ``chunkwise--native_custbw`` and
  ``chunkwise--native_autograd`` (when mlstm_kernels is installed);
- ``gdn``: ``gated_delta_rule(mode="chunk")`` (no external CPU reference exists; its
  recurrent mode is timed at the shortest length as a baseline).

Ratios are swax / reference (> 1 means swax is faster). Achieved GFLOP/s counts the useful
FLOPs of each op (forward; forward+backward counted as 3× forward) and is shown as a fraction of
the n×n matmul GFLOP/s measured at the start of the same run.

    python benchmarks/ops.py                      # T = 1k … 16k, B=1, H=4, D=64, float32
    python benchmarks/ops.py --T 4096 8192 --ops swa mlstm --csv out.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, matmul_gflops, print_table, timeit, write_csv  # noqa: E402

from swax.ops import gated_delta_rule, mlstm, sliding_window_attention  # noqa: E402


def swa_flops(B, H, T, D, W):
    Wt = min(W, T)
    avg_keys = (Wt * (Wt + 1) / 2 + (T - Wt) * Wt) / T
    return 4.0 * B * H * T * avg_keys * D


def recurrent_flops(B, H, T, Dqk, Dv, L):
    return B * H * T * (4.0 * Dqk * Dv + 2.0 * (Dqk + Dv) * min(L, T))


def run_case(fn, inputs, backward: bool, repeat: int) -> float:
    def step():
        if backward:
            xs = [x.detach().requires_grad_() for x in inputs]
            out = fn(*xs)
            out = out[0] if isinstance(out, tuple) else out
            out.sum().backward()
        else:
            with torch.no_grad():
                fn(*inputs)

    return timeit(step, repeat=repeat)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--ops", nargs="+", default=["swa", "mlstm", "gdn"],
                    choices=["swa", "mlstm", "gdn"])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-mask-gb", type=float, default=6.0,
                    help="skip masked SDPA when its T×T scores exceed this many GB")
    ap.add_argument("--csv", default="benchmarks/results/ops.csv")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, H, D, W, L = args.B, args.H, args.D, args.window, args.chunk
    ceiling = matmul_gflops()
    print(f"# {machine_line()}")
    print(f"# matmul ceiling: {ceiling:.1f} GFLOP/s (float32 2048³, this run)")
    print(f"# B={B} H={H} D={D} window={W} chunk={L} float32\n")

    try:
        from mlstm_kernels.torch import get_mlstm_kernel
    except ImportError:
        get_mlstm_kernel = None
        print("# mlstm_kernels not installed: mLSTM references skipped")

    rows = []
    for T in args.T:
        q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
        for op in args.ops:
            if op == "swa":
                ours = lambda q, k, v: sliding_window_attention(q, k, v, W)  # noqa: E731
                inputs = (q, k, v)
                flops = swa_flops(B, H, T, D, W)
                refs = {}
                if 2 * B * H * T * T * 4 / 1e9 <= args.max_mask_gb:
                    idx = torch.arange(T)
                    mask = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] < W)
                    refs["sdpa+mask"] = lambda q, k, v, m=mask: (
                        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m))
            elif op == "mlstm":
                i = torch.randn(B, H, T)
                f = torch.randn(B, H, T) + 3
                ours = lambda q, k, v, i, f: mlstm(q, k, v, i, f, mode="chunk",  # noqa: E731
                                                   chunk_size=L)[0]
                inputs = (q, k, v, i, f)
                flops = recurrent_flops(B, H, T, D, D, L)
                refs = {}
                if get_mlstm_kernel is not None and T % L == 0:
                    for name in ("chunkwise--native_custbw", "chunkwise--native_autograd"):
                        kern = get_mlstm_kernel(name)
                        refs[name.split("--")[1]] = (
                            lambda q, k, v, i, f, kern=kern: kern(q, k, v, i, f, chunk_size=L))
            else:
                qn = torch.nn.functional.normalize(q, dim=-1)
                kn = torch.nn.functional.normalize(k, dim=-1)
                g = -torch.nn.functional.softplus(torch.randn(B, H, T))
                beta = torch.rand(B, H, T)
                ours = lambda q, k, v, g, b: gated_delta_rule(q, k, v, g, b, mode="chunk",  # noqa
                                                              chunk_size=L)[0]
                inputs = (qn, kn, v, g, beta)
                flops = recurrent_flops(B, H, T, D, D, L) * 1.5  # + the UT transform
                refs = {}
                if T == min(args.T):
                    refs["recurrent"] = lambda q, k, v, g, b: gated_delta_rule(
                        q, k, v, g, b, mode="recurrent")[0]
            for backward in (False, True):
                pas = "fwd+bwd" if backward else "fwd"
                t = run_case(ours, inputs, backward, args.repeat)
                mult = 3.0 if backward else 1.0
                gf = flops * mult / t / 1e9
                row = {"op": op, "T": T, "pass": pas, "swax_tok_s": f"{B * T / t:,.0f}",
                       "GFLOP/s": f"{gf:.1f}", "of_matmul": f"{gf / ceiling:.1%}"}
                for name, ref in refs.items():
                    try:
                        tr = run_case(ref, inputs, backward, args.repeat)
                        row[f"{name}_tok_s"] = f"{B * T / tr:,.0f}"
                        row[f"x_vs_{name}"] = f"{tr / t:.2f}"
                    except (RuntimeError, MemoryError) as e:  # e.g. out of memory
                        row[f"x_vs_{name}"] = f"failed: {str(e)[:40]}"
                rows.append(row)
                print(f"  measured {op} T={T} {pas}", file=sys.stderr, flush=True)
    for op in args.ops:
        op_rows = [r for r in rows if r["op"] == op]
        print(f"\n## {op}")
        print_table(op_rows, list(dict.fromkeys(c for r in op_rows for c in r)))
    out = Path(args.csv)
    write_csv(rows, out)
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

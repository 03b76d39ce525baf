"""Speed of swax's ops against references measured in the same run.

For each sequence length T: forward and forward+backward tokens/s of

- ``swa``: ``sliding_window_attention`` (each window of ``--window``) vs
  ``scaled_dot_product_attention`` with an explicit T×T band mask (skipped when that mask's
  scores would not fit in ``--max-mask-gb``) and, forward only (its CPU backward does not
  exist), torch's compiled ``flex_attention`` with a sliding-window block mask
  (``create_block_mask``, default 128 blocks; compiled mask creation above 8k);
- ``mlstm``: ``mlstm(mode="chunk")`` (the automatic backend: ``native`` on the CPU, with its
  hand-written backward) vs mlstm_kernels' ``chunkwise--native_custbw`` and
  ``chunkwise--native_autograd`` (when mlstm_kernels is installed) and swax's own chunkwise
  form under autograd (``backend="autograd"``, the path before the custom backward);
- ``gdn``: ``gated_delta_rule(mode="chunk")`` (no external CPU reference exists; its
  recurrent mode is timed at the shortest length as a baseline).

Every case is timed in interleaved rounds (swax, then each reference, repeated), medians
reported, so a slow spell of a shared machine hits all of them. Ratios are reference time /
swax time (> 1: swax faster). Achieved GFLOP/s counts the useful FLOPs of each op (forward;
forward+backward counted as 3× forward) and is shown as a fraction of the n×n float32 matmul
GFLOP/s measured at the start of the same run. Writes a CSV and a PNG next to it.

    python benchmarks/ops.py                      # T = 1k … 64k, B=1, H=4, D=64, float32
    python benchmarks/ops.py --T 4096 8192 --ops swa mlstm --csv out.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    machine_line,
    matmul_gflops,
    print_table,
    save_png,
    timeit_interleaved,
    write_csv,
)

from swax.core.plotting import length_axis  # noqa: E402
from swax.ops import gated_delta_rule, mlstm, sliding_window_attention  # noqa: E402

DEFAULT_T = [1024, 2048, 4096, 8192, 16384, 32768, 65536]


def swa_flops(B, H, T, D, W):
    Wt = min(W, T)
    avg_keys = (Wt * (Wt + 1) / 2 + (T - Wt) * Wt) / T
    return 4.0 * B * H * T * avg_keys * D


def recurrent_flops(B, H, T, Dqk, Dv, L):
    return B * H * T * (4.0 * Dqk * Dv + 2.0 * (Dqk + Dv) * min(L, T))


def make_case(fn, inputs, backward: bool):
    def step():
        if backward:
            xs = [x.detach().requires_grad_() for x in inputs]
            out = fn(*xs)
            out = out[0] if isinstance(out, tuple) else out
            out.sum().backward()
        else:
            with torch.no_grad():
                fn(*inputs)

    return step


FWD_ONLY = {"flex"}  # references without a backward on the CPU


def flex_reference(T, W):
    """What a user would write: compiled flex attention with a sliding-window block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < W)

    # the dense mask behind create_block_mask is T×T: compiled (blockwise) creation above 8k
    mask = create_block_mask(mask_mod, None, None, T, T, device="cpu", _compile=T > 8192)
    flex = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: flex(q, k, v, block_mask=mask)


def cases_for(op, T, args, get_mlstm_kernel, W=None):
    """(our fn, inputs, useful FLOPs, {reference name: fn})."""
    B, H, D, L = args.B, args.H, args.D, args.chunk
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    if op == "swa":
        refs = {}
        if 2 * B * H * T * T * 4 / 1e9 <= args.max_mask_gb:
            idx = torch.arange(T)
            mask = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] < W)
            refs["sdpa+mask"] = lambda q, k, v, m=mask: (
                torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
            )
        if not args.no_flex:
            refs["flex"] = flex_reference(T, W)
        if args.fwd_only:  # the autograd path's kernel, the CPU default before blockwise_fwd
            refs["blockwise"] = lambda q, k, v: sliding_window_attention(
                q, k, v, W, backend="blockwise"
            )
        ours = lambda q, k, v: sliding_window_attention(q, k, v, W, backend=args.swa_backend)  # noqa: E731
        return ours, (q, k, v), swa_flops(B, H, T, D, W), refs
    if op == "mlstm":
        i = torch.randn(B, H, T)
        f = torch.randn(B, H, T) + 3
        refs = {}
        if get_mlstm_kernel is not None and T % L == 0:
            for name in ("chunkwise--native_custbw", "chunkwise--native_autograd"):
                if name.endswith("autograd") and T > args.max_autograd_T:
                    continue
                kern = get_mlstm_kernel(name)
                refs[name.split("--")[1]] = lambda q, k, v, i, f, kern=kern: kern(
                    q, k, v, i, f, chunk_size=L
                )
        if T <= args.max_autograd_T:
            refs["swax_autograd"] = lambda q, k, v, i, f: mlstm(
                q, k, v, i, f, chunk_size=L, backend="autograd"
            )[0]
        ours = lambda q, k, v, i, f: mlstm(
            q,
            k,
            v,
            i,
            f,
            mode="chunk",  # noqa: E731
            chunk_size=L,
        )[0]
        return ours, (q, k, v, i, f), recurrent_flops(B, H, T, D, D, L), refs
    qn = torch.nn.functional.normalize(q, dim=-1)
    kn = torch.nn.functional.normalize(k, dim=-1)
    g = -torch.nn.functional.softplus(torch.randn(B, H, T))
    beta = torch.rand(B, H, T)
    refs = {}
    if T == min(args.T):
        refs["recurrent"] = lambda q, k, v, g, b: gated_delta_rule(q, k, v, g, b, mode="recurrent")[
            0
        ]
    ours = lambda q, k, v, g, b: gated_delta_rule(
        q,
        k,
        v,
        g,
        b,
        mode="chunk",  # noqa: E731
        chunk_size=L,
    )[0]
    return ours, (qn, kn, v, g, beta), recurrent_flops(B, H, T, D, D, L) * 1.5, refs


def windows(op, args):
    return args.window if op == "swa" else [None]


def plot(rows, ops, path, title):
    def draw(fig):
        for j, op in enumerate(ops):
            ax = fig.add_subplot(1, len(ops), j + 1)
            for pas, style in (("fwd", "--"), ("fwd+bwd", "-")):
                rs = [r for r in rows if r["op"] == op and r["pass"] == pas]
                cols = ["swax"] + sorted(
                    {c[:-6] for r in rs for c in r if c.endswith("_tok_s") and c != "swax_tok_s"}
                )
                for c in cols:
                    pts = [
                        (r["T"], float(r[f"{c}_tok_s"].replace(",", "")))
                        for r in rs
                        if r.get(f"{c}_tok_s")
                    ]
                    if pts:
                        ax.plot(*zip(*pts), style, marker="o", ms=3, label=f"{c} {pas}")
            length_axis(ax)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel("tokens / s")
            ax.set_title(op)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)

    return save_png(path, draw, title)


def swa_choice(inputs, window, backward, args) -> str:
    """The backend swax's sliding-window attention runs for these inputs (``--swa-backend`` or
    the automatic choice), as the registry picks it."""
    from swax.ops import select_backend

    q, k, v = (x.detach().requires_grad_(backward) for x in inputs[:3])
    with torch.set_grad_enabled(backward):
        return select_backend("swa", args.swa_backend, q, k, v, window).name


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=DEFAULT_T)
    ap.add_argument(
        "--ops", nargs="+", default=["swa", "mlstm", "gdn"], choices=["swa", "mlstm", "gdn"]
    )
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--window", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--no-flex", action="store_true", help="skip the compiled flex reference")
    ap.add_argument("--fwd-only", action="store_true", help="measure the forward pass only")
    ap.add_argument(
        "--swa-backend", default=None, help="backend of the swax swa column (default: auto)"
    )
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="seconds per case after which no further rounds are started",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--max-mask-gb",
        type=float,
        default=6.0,
        help="skip masked SDPA when its T×T scores exceed this many GB",
    )
    ap.add_argument(
        "--max-autograd-T",
        type=int,
        default=16384,
        help="skip the autograd references above this length (slow, memory)",
    )
    ap.add_argument("--csv", default="benchmarks/results/ops.csv")
    return ap.parse_args(argv)


def measure(op, T, W, backward, case, args, ceiling) -> dict:
    """One row: swax and its references on one case (op, T, W, pass), timed interleaved."""
    ours, inputs, flops, refs = case
    pas = "fwd+bwd" if backward else "fwd"
    fns = {"swax": make_case(ours, inputs, backward)}
    fns.update(
        {
            n: make_case(fn, inputs, backward)
            for n, fn in refs.items()
            if not (backward and n in FWD_ONLY)
        }
    )
    try:
        times = timeit_interleaved(fns, repeat=args.repeat, budget_s=args.budget)
    except (RuntimeError, MemoryError) as e:  # a reference out of memory
        print(f"  {op} T={T} {pas}: failed ({str(e)[:60]}); measuring swax alone", file=sys.stderr)
        times = timeit_interleaved({"swax": fns["swax"]}, repeat=args.repeat, budget_s=args.budget)
    t = times["swax"]
    gf = flops * (3.0 if backward else 1.0) / t / 1e9
    row = {
        "op": op,
        "T": T,
        **({"W": W} if W is not None else {}),
        "pass": pas,
        **({"swax_backend": swa_choice(inputs, W, backward, args)} if op == "swa" else {}),
        "swax_tok_s": f"{args.B * T / t:,.0f}",
        "GFLOP/s": f"{gf:.1f}",
        "of_matmul": f"{gf / ceiling:.1%}",
    }
    for name in refs:
        if name in times:
            gr = flops * (3.0 if backward else 1.0) / times[name] / 1e9
            row[f"{name}_tok_s"] = f"{args.B * T / times[name]:,.0f}"
            if name == "flex":
                row["flex_GFLOP/s"] = f"{gr:.1f}"
                row["flex_of_matmul"] = f"{gr / ceiling:.1%}"
            row[f"x_vs_{name}"] = f"{times[name] / t:.2f}"
    print(f"  measured {op} T={T} W={W} {pas}", file=sys.stderr, flush=True)
    return row


def print_acceptance(rows, ceiling) -> None:
    """The issues' targets, read from the rows (issue 5: mLSTM and SWA fwd+bwd against their
    references; issue 22: SWA forward against compiled flex)."""
    print("\n## acceptance (issue 5)")
    for op, T, ref, need in (("mlstm", 4096, "native_custbw", 1.5), ("swa", 8192, "sdpa+mask", 3)):
        r = next(
            (r for r in rows if r["op"] == op and r["T"] == T and r["pass"] == "fwd+bwd"), None
        )
        if r is None or f"x_vs_{ref}" not in r:
            print(f"{op} T={T} fwd+bwd vs {ref}: not measured")
            continue
        x = float(r[f"x_vs_{ref}"])
        print(
            f"{op} T={T} fwd+bwd: {x:.2f}x {ref} (need >= {need}: "
            f"{'yes' if x >= need else 'NO'}); {r['GFLOP/s']} GFLOP/s = {r['of_matmul']} "
            f"of the {ceiling:.1f} GFLOP/s matmul"
        )
    print("\n## acceptance (issue 22): swa forward vs compiled flex, need >= 1.0 at every T and W")
    for r in rows:
        if r["op"] == "swa" and r["pass"] == "fwd" and "x_vs_flex" in r:
            x = float(r["x_vs_flex"])
            same = " — swax runs compiled flex itself here" if r["swax_backend"] == "flex" else ""
            ok = "yes" if x >= 1 else "NO"
            print(f"swa T={r['T']} W={r['W']} fwd: {x:.2f}x flex ({ok}){same}")


def main(argv=None) -> int:
    args = parse_args(argv)
    # one flex compilation per (T, W) for the reference: more than dynamo's default limit of 8,
    # past which flex would run eagerly (unfused, T×T scores)
    torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ceiling = matmul_gflops()
    print(f"# {machine_line()}")
    print(f"# matmul ceiling: {ceiling:.1f} GFLOP/s (float32 2048³, this run)")
    print(
        f"# B={args.B} H={args.H} D={args.D} windows={args.window} chunk={args.chunk} float32; "
        f"medians of up to {args.repeat} interleaved rounds\n"
    )
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
    except ImportError:
        get_mlstm_kernel = None
        print("# mlstm_kernels not installed: mLSTM references skipped")

    rows = []
    grid = [(T, o, W) for T in args.T for o in args.ops for W in windows(o, args)]
    for T, op, W in grid:
        case = cases_for(op, T, args, get_mlstm_kernel, W)
        for backward in (False,) if args.fwd_only else (False, True):
            rows.append(measure(op, T, W, backward, case, args, ceiling))
    for op in args.ops:
        op_rows = [r for r in rows if r["op"] == op]
        print(f"\n## {op}")
        print_table(op_rows, list(dict.fromkeys(c for r in op_rows for c in r)))
    print_acceptance(rows, ceiling)
    out = Path(args.csv)
    write_csv(rows, out)
    png = plot(
        rows,
        args.ops,
        out.with_suffix(".png"),
        f"swax ops vs references, B={args.B} H={args.H} D={args.D} W={args.window} "
        f"chunk={args.chunk}, {torch.get_num_threads()} threads",
    )
    print(f"# wrote {out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

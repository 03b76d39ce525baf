"""Gradients of mlstm_kernels' Triton mLSTM kernel, raw and as swax's ``triton`` backend uses it.

For each case (length T, empty or given initial state) it prints the normwise relative error of
h and of every input gradient against swax's ``native`` kernel (float32, itself tested against
a float64 loop over time), for

- ``raw``: mlstm_kernels' ``chunkwise--triton_xl_chunk`` called directly (its backward holds
  the denominator and the stabiliser constant: dq, dk, di, df are far off, dv is exact);
- ``swax``: swax's ``triton`` backend, which restores the missing terms.

Runs on CUDA, or on the CPU under Triton's interpreter (float32 arithmetic, no TF32)::

    TRITON_INTERPRET=1 python benchmarks/mlstm_triton_grad.py     # needs numpy < 2 with Triton 3.6

Needs ``mlstm_kernels`` and ``triton``. Writes ``benchmarks/results/mlstm_triton_grad.json``
(``--out`` to change). Exit status 1 when the swax column exceeds its tolerance (float32 on the
interpreter; TF32/bf16 on CUDA, see ``TOL``), so it can serve as a check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "results" / "mlstm_triton_grad.json"
# normwise relative error allowed for the swax column: float32 arithmetic (interpreter) leaves
# ~1e-5 on these sizes; on CUDA the kernel's float32 tiles go through TF32 tl.dot (unit
# roundoff 2^-11) and the gradient sums amplify it a few times
TOL = {"interpreter": 1e-4, "cuda": 2e-2}


def _inputs(T, seed, device):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2, T, 64, generator=g), torch.randn(2, 2, T, 64, generator=g)
    v = torch.randn(2, 2, T, 64, generator=g)
    i = 2 * torch.randn(2, 2, T, generator=g)
    f = torch.randn(2, 2, T, generator=g) + 3
    dh = torch.randn(2, 2, T, 64, generator=g)
    return [x.to(device) for x in (q, k, v, i, f)], dh.to(device)


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--lengths", default="64,100,256", help="comma-separated T")
    args = ap.parse_args(argv)
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
    except ImportError as e:
        print(f"mlstm_triton_grad: mlstm_kernels is not installed ({e})", file=sys.stderr)
        return 2
    if torch.cuda.is_available():
        device, mode = "cuda", "cuda"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        device, mode = "cpu", "interpreter"
    else:
        print(
            "mlstm_triton_grad: no CUDA device; run with TRITON_INTERPRET=1 to use Triton's "
            "interpreter on the CPU",
            file=sys.stderr,
        )
        return 2
    from swax.ops import mlstm

    mod = sys.modules["swax.ops.mlstm"]
    try:
        raw_kernel = get_mlstm_kernel("chunkwise--triton_xl_chunk")
    except Exception as e:  # noqa: BLE001 - no triton: the kernel is not registered
        print(f"mlstm_triton_grad: the Triton kernel is not available ({e})", file=sys.stderr)
        return 2
    cases = [(int(t), False) for t in args.lengths.split(",")] + [(300, True)]
    rows, ok = [], True
    print(f"# mode {mode}; error of h and each gradient against swax native (float32)")
    print(
        f"{'T':>5} {'state':>6} {'impl':>5} "
        + " ".join(f"{n:>9}" for n in "h dq dk dv di df".split())
    )
    for T, with_state in cases:
        xs, dh = _inputs(T, 2, device)
        st = None
        if with_state:
            with torch.no_grad():
                _, st = mlstm(*_inputs(50, 5, device)[0], backend="native", output_final_state=True)
        ref = [x.clone().requires_grad_() for x in xs]
        h_ref, _ = mlstm(*ref, initial_state=st, backend="native")
        h_ref.backward(dh)
        results = {}
        if not with_state and T % 64 == 0:  # the raw kernel, from its own (m = 0) empty state
            gx = [x.clone().requires_grad_() for x in xs]
            h = raw_kernel(*gx, chunk_size=128 if T % 128 == 0 else 64)
            h = h[0] if isinstance(h, tuple) else h
            h.backward(dh)
            results["raw"] = (h, gx)
        gx = [x.clone().requires_grad_() for x in xs]
        state = mod._init_state(st, 2, 2, 64, 64, torch.device(device))
        h, _ = mod._triton_backend(*gx, state, 64, 1e-6)
        h.float().backward(dh)
        results["swax"] = (h, gx)
        for impl, (h, gx) in results.items():
            errs = [_rel(h, h_ref)] + [_rel(x.grad, r.grad) for x, r in zip(gx, ref)]
            if impl == "swax" and max(errs) > TOL[mode]:
                ok = False
            rows.append(
                {
                    "T": T,
                    "initial_state": with_state,
                    "impl": impl,
                    "rel_err": dict(zip(["h", "dq", "dk", "dv", "di", "df"], errs)),
                }
            )
            print(f"{T:>5} {str(with_state):>6} {impl:>5} " + " ".join(f"{e:9.2e}" for e in errs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"mode": mode, "device": device, "tolerance_swax": TOL[mode], "ok": ok, "rows": rows}
    if device == "cuda":
        report["device_name"] = torch.cuda.get_device_name()
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"# swax column within {TOL[mode]:g}: {ok}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

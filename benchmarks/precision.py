"""float32 against bfloat16 on the CPU, measured in one run (issue 60).

For each case the same model and batch run in float32 and in bfloat16, in interleaved rounds (a
slow spell of a shared machine hits both), one thread and then two; the speed-up is the ratio
of the best round of each (bfloat16 / float32 tokens/s, > 1: bfloat16 faster). Training steps
are what ``swax train dtype=bfloat16`` runs: float32 master weights, the forward under bfloat16
autocast, the backward after it, AdamW on the float32 weights; the prefill runs a bfloat16
model (what ``swax generate --dtype bfloat16`` loads).

Cases: the 4-layer d_model 128 SXSX and SDSD at T = 1024 (preset tiny, batch 4); the 2-layer
d_model 64 SX and SD at T = 256 (batch 8, 2 heads, recurrent_heads 2, qk_dim_factor 1: the
studies' model); the 125m preset at T = 1024 (batch 1, a few steps); the chunked prefill of the
small preset's SX model over 8k tokens. The ceiling is printed first: the machine's float32 and
bfloat16 matmul GFLOP/s at 2048² (and at the d128 model's projection shape), measured now.
On a CPU without bfloat16 matrix units (AMX, AVX-512 BF16) a bfloat16 product is emulated,
tens of times slower: there a case whose bfloat16 step would take longer than ``--max-case-s``
by its FLOPs at the measured bfloat16 rate is not run, and its estimate is printed instead.

``--profile`` prints instead where a step spends its time in each dtype (torch.profiler, self
CPU time of the ATen ops): the matrix products, the casts and the rest (the 4-layer SXSX model
unless ``--cases`` names others).

    python benchmarks/precision.py                  # everything, 1 and 2 threads
    python benchmarks/precision.py --threads 1 --cases sx128 sd128
    python benchmarks/precision.py --profile
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, matmul_gflops, print_table, write_csv  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.generate import prefill  # noqa: E402
from swax.train.peak import bf16_matrix_units  # noqa: E402

BF = torch.bfloat16
STUDY = dict(n_heads=2, recurrent_heads=2, qk_dim_factor=1.0)


@dataclass
class Case:
    name: str
    preset: str
    pattern: str
    seq: int
    batch: int
    overrides: dict
    kind: str = "train"  # or "prefill"


CASES = {
    "sx128": Case("SXSX d128 T=1024", "tiny", "SX", 1024, 4, {}),
    "sd128": Case("SDSD d128 T=1024", "tiny", "SD", 1024, 4, {}),
    "sx64": Case("SX d64 2L T=256", "tiny", "SX", 256, 8, dict(d_model=64, n_layers=2, **STUDY)),
    "sd64": Case("SD d64 2L T=256", "tiny", "SD", 256, 8, dict(d_model=64, n_layers=2, **STUDY)),
    "125m": Case("125m SX T=1024", "125m", "SX", 1024, 1, {}),
    "prefill": Case("small SX prefill 8k", "small", "SX", 8192, 1, {}, kind="prefill"),
}


def _train_fn(model, opt, ids, window, amp):
    def step():
        with torch.autocast("cpu", dtype=BF, enabled=amp):
            logits = model(ids[:, :-1], window=window)
        loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _prefill_fn(model, ids, window):
    def run():
        with torch.inference_mode():
            prefill(model, ids, window=window, chunk_size=2048)

    return run


def step_flops(case: Case) -> float:
    """The model FLOPs of one step of the case (forward and backward for training)."""
    cfg = SwaxConfig.preset(case.preset, layer_pattern=case.pattern, **case.overrides)
    with torch.device("meta"):
        model = SwaxLM(cfg)
    per_token = model.flops_per_token(case.seq, cfg.window, training=case.kind == "train")
    return per_token * case.seq * case.batch


def make_runs(case: Case, seed: int = 0) -> dict:
    """{"float32": fn, "bfloat16": fn}: one step of the case (the same weights and batch)."""
    torch.manual_seed(seed)
    cfg = SwaxConfig.preset(case.preset, layer_pattern=case.pattern, **case.overrides)
    ids = torch.randint(0, cfg.vocab_size, (case.batch, case.seq + 1))
    if case.kind == "prefill":
        model = SwaxLM(cfg).eval()
        low = SwaxLM(cfg).eval()
        low.load_state_dict(model.state_dict())
        low = low.to(BF)
        return {
            "float32": _prefill_fn(model, ids[:, :-1], cfg.window),
            "bfloat16": _prefill_fn(low, ids[:, :-1], cfg.window),
        }
    runs = {}
    for name, amp in (("float32", False), ("bfloat16", True)):
        torch.manual_seed(seed)
        model = SwaxLM(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        runs[name] = _train_fn(model, opt, ids, cfg.window, amp)
    return runs


def time_case(runs: dict, rounds: int) -> dict[str, float]:
    """Best seconds of each function over interleaved rounds, after one warm-up each."""
    for fn in runs.values():
        fn()
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            best[name] = min(best[name], _timed(fn))
    return best


def ceiling(threads: int) -> list[dict]:
    """Measured matmul GFLOP/s, float32 and bfloat16: 2048² (512² for bfloat16 without matrix
    units) and the d128 model's projection shape [4096, 128] x [128, 384]."""
    torch.set_num_threads(threads)
    n16 = 2048 if bf16_matrix_units() else 512
    rows = [
        {"dtype": "float32", "shape": "2048³", "rate": matmul_gflops(2048, torch.float32)},
        {"dtype": "bfloat16", "shape": f"{n16}³", "rate": matmul_gflops(n16, BF)},
    ]
    for dt in (torch.float32, BF):
        name = str(dt).removeprefix("torch.")
        rows.append({"dtype": name, "shape": "4096x128x384", "rate": _rate(4096, 128, 384, dt)})
    for r in rows:
        r["threads"] = threads
        r["GFLOP/s"] = f"{r['rate']:,.1f}"
    return rows


def _rate(m: int, k: int, n: int, dtype: torch.dtype, reps: int = 5) -> float:
    """GFLOP/s of [m, k] x [k, n] in ``dtype``: the best of ``reps`` after two warm-ups."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(2):
        a @ b
    return 2 * m * k * n / min(_timed(lambda: a @ b) for _ in range(reps)) / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile(threads: int, key: str) -> None:
    """Where a step of case ``key`` spends its time, per dtype (ATen ops' self CPU time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    torch.set_num_threads(threads)
    runs = make_runs(CASES[key])
    products = ("mm", "bmm", "addmm", "baddbmm", "linalg_solve_triangular", "_scaled_dot_product")
    casts = ("to", "_to_copy", "copy_")
    for name, fn in runs.items():
        fn()
        with prof(activities=[ProfilerActivity.CPU]) as p:
            fn()
        events = [e for e in p.key_averages() if e.key.startswith("aten::")]
        total = sum(e.self_cpu_time_total for e in events)
        kinds = {"matrix products": 0.0, "casts": 0.0, "the rest": 0.0}
        for e in events:
            op = e.key.removeprefix("aten::")
            kind = "matrix products" if op.startswith(products) else "the rest"
            kinds["casts" if op in casts else kind] += e.self_cpu_time_total
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in kinds.items())
        print(
            f"\n## {CASES[key].name}, {threads} thread(s), {name}: {total / 1e6:.2f} s of ATen "
            f"ops per step ({shares})"
        )
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
        for e in top:
            print(f"  {e.key:36s} {e.self_cpu_time_total / 1e3:9.1f} ms  x{e.count}")


def measure_case(case: Case, threads: int, rounds: int, max_s: float, bf16_rate: float) -> dict:
    """One table row: tokens/s of each dtype and their ratio; without bfloat16 units a bfloat16
    step estimated (its FLOPs at ``bf16_rate`` GFLOP/s) above ``max_s`` seconds is not run."""
    runs = make_runs(case)
    estimate = step_flops(case) / (bf16_rate * 1e9)
    skip = not bf16_matrix_units() and estimate > max_s
    if skip:
        del runs["bfloat16"]
    best = time_case(runs, rounds)
    tokens = case.batch * case.seq
    row = {"threads": threads, "case": case.name, "kind": case.kind}
    row["float32 tok/s"] = f"{tokens / best['float32']:,.0f}"
    if skip:
        row["bfloat16 tok/s"] = f"~{tokens / estimate:,.0f} (est.)"
        row["bf16/fp32"] = f"~{best['float32'] / estimate:.3f}x (est., not run)"
    else:
        row["bfloat16 tok/s"] = f"{tokens / best['bfloat16']:,.0f}"
        row["bf16/fp32"] = f"{best['float32'] / best['bfloat16']:.2f}x"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--max-case-s",
        type=float,
        default=120.0,
        help="without bfloat16 units: skip a bfloat16 step estimated longer",
    )
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--csv", default="benchmarks/results/precision.csv")
    args = ap.parse_args(argv)
    cap = torch.backends.cpu.get_cpu_capability()
    print(f"# {machine_line()}; bfloat16 matrix units: {bf16_matrix_units()} ({cap})")
    if args.profile:
        for t in args.threads:
            for key in args.cases if args.cases != list(CASES) else ["sx128"]:
                profile(t, key)
        return 0
    print("\n## matmul ceiling (this run)")
    ceil = [r for t in args.threads for r in ceiling(t)]
    print_table(ceil, ["threads", "dtype", "shape", "GFLOP/s"])
    rows = []
    for t in args.threads:
        torch.set_num_threads(t)
        bf16_rate = min(r["rate"] for r in ceil if r["threads"] == t and r["dtype"] == "bfloat16")
        for key in args.cases:
            rows.append(measure_case(CASES[key], t, args.rounds, args.max_case_s, bf16_rate))
            print(rows[-1], flush=True)
    print("\n## speed, best of interleaved rounds (bf16/fp32 > 1: bfloat16 faster)")
    print_table(rows, ["threads", "case", "kind", "float32 tok/s", "bfloat16 tok/s", "bf16/fp32"])
    write_csv([*({k: v for k, v in r.items() if k != "rate"} for r in ceil), *rows], args.csv)
    print(f"# wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

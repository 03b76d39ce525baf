"""Chunked prefill of a very long prompt in bounded memory.

Feeds a random prompt of ``--tokens`` tokens (default 131 072) through a randomly initialised
preset in chunks, as ``swax generate`` does, and prints the time, the peak resident memory, the
decode state's size, and the largest tensor any op produced — compared with the T×T attention
matrix and the T×vocab logits that a naive forward would make.

    python benchmarks/prefill.py                       # tiny SWAX, 131k tokens
    python benchmarks/prefill.py --pattern A --tokens 16384
    python benchmarks/prefill.py --compare-flex --presets tiny small --patterns SX SD \
        --lengths 32768 131072 --window 2048             # tok/s vs swa forced to compiled flex

``--compare-flex`` times, in interleaved rounds and without the tensor tracking, the prefill with
the automatic attention backend against the same prefill with every sliding-window attention
forced to compiled flex attention (``forced_backends(swa="flex")``), for each preset, pattern
and length: the whole-model counterpart of ``ops.py``'s flex column. ``swax eval niah`` prefills
its prompts the same way (chunks of 2048), so these tokens/s are its prefill throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, peak_rss_bytes, print_table, timeit_interleaved  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.generate import prefill  # noqa: E402
from swax.ops.registry import forced_backends  # noqa: E402


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.max_numel, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.max_numel:
                self.max_numel, self.op = t.numel(), str(func)
        return out


def measure(
    preset: str,
    pattern: str | None,
    tokens: int,
    chunk: int,
    window: int | None,
    track: bool = True,
    seed: int = 0,
) -> dict:
    torch.manual_seed(seed)
    overrides = {"layer_pattern": pattern} if pattern else {}
    model = SwaxLM(SwaxConfig.preset(preset, **overrides)).eval()
    V = model.config.vocab_size
    ids = torch.randint(0, V, (1, tokens))
    w = model.config.window if window is None else window
    mode = LargestTensor() if track else None
    t0 = time.perf_counter()
    if mode is not None:
        with mode:
            _, state = prefill(model, ids, window=w, chunk_size=chunk)
    else:
        _, state = prefill(model, ids, window=w, chunk_size=chunk)
    dt = time.perf_counter() - t0
    return {
        "tokens": tokens,
        "seconds": dt,
        "tok_s": tokens / dt,
        "peak_rss": peak_rss_bytes(),
        "state_bytes": state.nbytes(),
        "max_numel": mode.max_numel if mode else None,
        "max_op": mode.op if mode else None,
        "vocab": V,
        "pattern": model.config.layer_types,
    }


def compare_flex(args) -> int:
    """tok/s of the automatic backend vs swa forced to flex, interleaved, per configuration."""
    rows = []
    for preset in args.presets:
        for pattern in args.patterns:
            torch.manual_seed(0)
            model = SwaxLM(SwaxConfig.preset(preset, layer_pattern=pattern)).eval()
            w = model.config.window if args.window is None else args.window
            for tokens in args.tokens:
                ids = torch.randint(0, model.config.vocab_size, (1, tokens))

                def run(ids=ids, model=model, w=w):
                    with torch.no_grad():
                        prefill(model, ids, window=w, chunk_size=args.chunk)

                def run_flex():
                    with forced_backends(swa="flex"):
                        run()

                warm = torch.randint(0, model.config.vocab_size, (1, 2 * args.chunk + 1))
                for fn in (run, run_flex):  # compile flex's shapes outside the timing
                    with forced_backends(swa="flex") if fn is run_flex else _null():
                        run(ids=warm)
                t = timeit_interleaved(
                    {"swax": run, "flex": run_flex},
                    repeat=args.rounds,
                    warmup=0,
                    budget_s=args.budget,
                )
                rows.append(
                    {
                        "preset": preset,
                        "pattern": pattern,
                        "window": w,
                        "tokens": f"{tokens:,}",
                        "swax_tok_s": f"{tokens / t['swax']:,.0f}",
                        "flex_tok_s": f"{tokens / t['flex']:,.0f}",
                        "x_vs_flex": f"{t['flex'] / t['swax']:.2f}",
                    }
                )
                print(f"  measured {preset} {pattern} {tokens}", file=sys.stderr, flush=True)
    print(
        f"# prefill in chunks of {args.chunk}, random weights, float32; medians of up to "
        f"{args.rounds} interleaved rounds"
    )
    print_table(rows, list(rows[0]))
    return 0


def _null():
    from contextlib import nullcontext

    return nullcontext()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pattern", default=None, help="override the preset's layer pattern")
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument(
        "--no-track", action="store_true", help="do not record tensor sizes (slightly faster)"
    )
    ap.add_argument("--compare-flex", action="store_true", help="auto vs swa forced to flex")
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--patterns", nargs="+", default=["SX", "SD"])
    ap.add_argument("--lengths", dest="tokens_list", type=int, nargs="+", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {machine_line()}")
    if args.compare_flex:
        args.tokens = args.tokens_list or [32768, 131072]
        return compare_flex(args)
    r = measure(
        args.preset, args.pattern, args.tokens, args.chunk, args.window, track=not args.no_track
    )
    T, V = r["tokens"], r["vocab"]
    print(
        f"preset {args.preset} pattern {r['pattern']}: prefill of {T:,} tokens in chunks of "
        f"{args.chunk}"
    )
    print(f"  time           {r['seconds']:.1f} s ({r['tok_s']:,.0f} tok/s)")
    print(f"  peak RSS       {r['peak_rss'] / 2**30:.2f} GiB")
    print(f"  decode state   {r['state_bytes'] / 2**20:.2f} MiB")
    if r["max_numel"] is not None:
        print(f"  largest tensor {r['max_numel']:,} elements ({r['max_op']})")
        print(f"  for scale: T×T = {T * T:,}, T×vocab = {T * V:,} elements")
        if "A" in r["pattern"]:
            print("  (full-attention layers: their cache and masks grow with the context)")
            return 0
        ok = r["max_numel"] < T * V and r["max_numel"] < T * T
        print(f"  no T×T or T×vocab tensor: {'yes' if ok else 'NO'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

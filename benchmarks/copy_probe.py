"""What the copy probe's evaluation saves by keeping its work: same data, same run.

The copy stages of a sweep (swax.sweep.copystages) need the training text's n-gram baseline and
the copy events of the held-out rows. Timed here on the Python standard library's bytes (the
text study's corpus, tenth of the documents held out as a sweep holds them):

- the baseline fitted (``NgramBaseline(tokens, k)``) against read back from the cache folder
  (``NgramBaseline.cached`` after a first call wrote it); the tables are compared for equality;
- the copy events planned for the study's ranges with an empty per-evaluation cache (the first
  stage) against with the filled one (the second stage, and every checkpoint of the curve);
  the planned events are compared for equality.

Printed: seconds of each and their ratio, beside the machine's float32 matmul rate (the
ceiling the other benchmarks quote; these stages are memory- and sort-bound, not matmul-bound).

    python benchmarks/copy_probe.py                          # 4M training tokens for the fit
    python benchmarks/copy_probe.py --fit-tokens 200000 --heldout-tokens 100000 --rounds 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, matmul_gflops, print_table, timeit  # noqa: E402

from swax.data.copies import NgramBaseline, split_documents, stream  # noqa: E402
from swax.data.sources import pystdlib_documents  # noqa: E402
from swax.data.tokenizer import ByteTokenizer  # noqa: E402
from swax.probes.copies import copy_ranges, plan_copy_events  # noqa: E402

TOK = ByteTokenizer()
EOT = TOK.eot_id


def tokens_of(docs, idx) -> np.ndarray:
    """The documents' bytes, each followed by the end-of-text id, as a sweep streams them."""
    return stream(TOK.encode_batch([docs[i] for i in idx]), EOT)[0]


def timed(fn):
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit-tokens", type=int, default=4_000_000, help="training tokens fitted")
    ap.add_argument("--context", type=int, default=8, help="n-gram order / copy context")
    ap.add_argument("--events", type=int, default=1000, help="copy events per range")
    ap.add_argument("--heldout-tokens", type=int, default=0, help="held-out tokens (0: all)")
    ap.add_argument("--rounds", type=int, default=3, help="timed repeats of the fast paths")
    args = ap.parse_args(argv)
    print(machine_line())
    print(f"float32 matmul: {matmul_gflops():.1f} GFLOP/s (measured now)")
    t0 = time.perf_counter()
    docs = pystdlib_documents()
    train_idx, held_idx = split_documents(docs, 0.1)
    train = tokens_of(docs, train_idx)[: args.fit_tokens]
    held = tokens_of(docs, held_idx)[: args.heldout_tokens or None]
    print(
        f"pystdlib: {len(train):,} training tokens fitted, {len(held):,} held out "
        f"(read in {time.perf_counter() - t0:.1f} s)"
    )
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        # the first call finds an empty folder: it fits (timed once) and writes the tables
        t_fit, first = timed(lambda: NgramBaseline.cached(train, args.context, folder))
        t_read = timeit(
            lambda: NgramBaseline.cached(train, args.context, folder), repeat=args.rounds, warmup=1
        )
        again = NgramBaseline.cached(train, args.context, folder)
        same = all(
            np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
            for a, b in zip(first.tables, again.tables, strict=True)
        )
        rows.append(
            {
                "stage": "n-gram baseline",
                "first (s)": f"{t_fit:.2f}",
                "kept (s)": f"{t_read:.3f}",
                "ratio": f"{t_fit / t_read:.0f}x",
                "same result": "yes" if same else "NO",
            }
        )
        buckets = copy_ranges([8, 32, 64, 128, 256, 1024], 256, [32, 64])
        cache: dict = {}

        def plan(c):
            return plan_copy_events(held, buckets, first, args.events, 1234, EOT, c)

        t_cold, cold = timed(lambda: plan(cache))  # the empty cache: planned and kept
        t_warm = timeit(lambda: plan(cache), repeat=args.rounds, warmup=0)
        warm = plan(cache)
        same = all(
            a.row == b.row
            and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("pos", "orig", "repl"))
            for a, b in zip(cold, warm, strict=True)
        )
        rows.append(
            {
                "stage": "copy events (7 ranges)",
                "first (s)": f"{t_cold:.2f}",
                "kept (s)": f"{t_warm:.3f}",
                "ratio": f"{t_cold / t_warm:.0f}x",
                "same result": "yes" if same else "NO",
            }
        )
    print_table(rows, ["stage", "first (s)", "kept (s)", "ratio", "same result"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

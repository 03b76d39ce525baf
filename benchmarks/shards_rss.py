"""Peak memory of training from a memory-mapped shard set, at two corpus sizes.

Writes a synthetic byte-tokenizer shard set of each size directly (the KJV tokenized once,
then its uint16 block written over and over: 1B tokens take seconds, not a tokenizer's hours),
runs a few training steps of a tiny model from each in its own process (``swax train
data.source=DIR threads=1``) and reports each run's peak RSS (ru_maxrss from wait4) and the
ratio largest/smallest of the medians over ``--repeat`` interleaved runs (peak RSS of a small
torch process varies by tens of MB from run to run). Constant-memory loading means a ratio near
1. The generated data is deleted afterwards (``--keep`` keeps it).

    python benchmarks/shards_rss.py                 # 10M and 1B tokens (needs ~2.1 GB of disk)
    python benchmarks/shards_rss.py --quick         # 200k and 4M tokens, one run each
    python benchmarks/shards_rss.py --sizes 10M 100M --steps 5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swax.data import ByteTokenizer, kjv_documents, save_tokenizer  # noqa: E402
from swax.data.prepare import make_index, write_index  # noqa: E402
from swax.data.shards import TOKENIZER_DIR, shard_name  # noqa: E402


def parse_size(text: str) -> int:
    mult = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}
    t = text.strip().lower()
    try:
        return int(float(t[:-1]) * mult[t[-1]]) if t[-1] in mult else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"expected a token count like 10M or 1B, got {text!r}"
        ) from None


def kjv_block() -> np.ndarray:
    """The KJV chapters as byte tokens, each followed by end-of-text (256): ~4.2M uint16."""
    eot = ByteTokenizer.eot_id
    parts = []
    for d in kjv_documents():
        parts.append(np.frombuffer(d.encode("utf-8"), np.uint8).astype(np.uint16))
        parts.append(np.array([eot], np.uint16))
    return np.concatenate(parts)


def write_split(folder: Path, split: str, block: np.ndarray, n: int, shard_tokens: int):
    """``n`` tokens of ``block`` repeated, in shards of ``shard_tokens``; the shard records."""
    records, pos, i = [], 0, 0
    while pos < n:
        size = min(shard_tokens, n - pos)
        h = hashlib.sha256()
        with open(folder / shard_name(split, i), "wb") as f:
            left, at = size, pos % len(block)
            while left:
                piece = block[at : at + left]
                b = piece.tobytes()
                f.write(b)
                h.update(b)
                left -= len(piece)
                at = 0
        records.append({"file": shard_name(split, i), "tokens": size, "sha256": h.hexdigest()})
        pos += size
        i += 1
    return records


def make_shard_set(folder: Path, tokens: int, block: np.ndarray, shard_tokens: int) -> None:
    folder.mkdir(parents=True)
    tok = ByteTokenizer()
    save_tokenizer(tok, folder / TOKENIZER_DIR)
    shards = {
        "train": write_split(folder, "train", block, tokens, shard_tokens),
        "val": write_split(folder, "val", block[-200_000:], 200_000, shard_tokens),
    }
    docs_per_token = len(kjv_documents()) / len(block)
    documents = {s: round(sum(r["tokens"] for r in shards[s]) * docs_per_token) for s in shards}
    settings = {"source": "synthetic: the KJV repeated (benchmarks/shards_rss.py)"}
    write_index(
        folder, make_index(tok, "byte", np.uint16, shard_tokens, settings, shards, documents)
    )


def train_peak_rss(folder: Path, run_dir: Path, steps: int, seq_len: int) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of ``swax train`` on the shard set, in its own process."""
    cmd = [
        sys.executable,
        "-m",
        "swax",
        "train",
        f"data.source={folder}",
        f"run_dir={run_dir}",
        "model.d_model=64",
        "model.n_layers=2",
        "model.n_heads=2",
        f"seq_len={seq_len}",
        "batch_size=8",
        f"steps={steps}",
        "window.short=32",
        "window.long=128",
        "log.val_batches=2",
        "log.every=1",
        "log.val_every=0",
        "optim.warmup_steps=1",
        "threads=1",
    ]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"training on {folder} failed:\n{out.decode(errors='replace')[-3000:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - t0  # Linux: ru_maxrss is in KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=parse_size, default=None, metavar="N")
    ap.add_argument("--quick", action="store_true", help="200k and 4M tokens, 2 steps")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="training runs per size (median)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--shard-tokens", type=parse_size, default=100_000_000)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated shard sets")
    args = ap.parse_args()
    sizes = args.sizes or ([200_000, 4_000_000] if args.quick else [10**7, 10**9])
    steps = 2 if args.quick and args.steps == 5 else args.steps
    if args.quick and args.repeat == 3:
        args.repeat = 1
    base = Path(args.dir or tempfile.mkdtemp(prefix="swax-shards-rss-"))
    base.mkdir(parents=True, exist_ok=True)
    need = 2 * sum(sizes) + 2 * 200_000 * len(sizes)
    free = shutil.disk_usage(base).free
    if free < need * 1.1 + 2**30:
        sys.exit(
            f"error: {base} has {free / 2**30:.1f} GiB free; the shard sets need "
            f"{need / 2**30:.1f} GiB (+1 GiB margin); use --dir or smaller --sizes"
        )
    block = kjv_block()
    print(
        f"# byte tokens, uint16 shards of {args.shard_tokens:,}; tiny SX model, seq "
        f"{args.seq_len}, batch 8, {steps} steps, threads=1; data in {base}"
    )
    print(
        f"{'tokens':>14} {'shards':>6} {'write_s':>8} {'train_s':>8} {'peak_rss_MiB':>13} "
        f"{'(runs)':>24}"
    )
    rss: dict[int, list[float]] = {n: [] for n in sizes}
    secs: dict[int, list[float]] = {n: [] for n in sizes}
    write_s: dict[int, float] = {}
    try:
        for n in sizes:
            t0 = time.perf_counter()
            make_shard_set(base / f"tokens_{n}", n, block, args.shard_tokens)
            write_s[n] = time.perf_counter() - t0
        for r in range(args.repeat):  # interleaved rounds: a noisy spell hits every size
            for n in sizes if r % 2 == 0 else sizes[::-1]:
                run_dir = base / f"run_{n}_{r}"
                peak, sec = train_peak_rss(base / f"tokens_{n}", run_dir, steps, args.seq_len)
                shutil.rmtree(run_dir, ignore_errors=True)
                rss[n].append(peak)
                secs[n].append(sec)
        for n in sizes:
            n_shards = len(list((base / f"tokens_{n}").glob("train_*.bin")))
            runs = " ".join(f"{x:.0f}" for x in rss[n])
            print(
                f"{n:>14,} {n_shards:>6} {write_s[n]:>8.1f} {statistics.median(secs[n]):>8.1f} "
                f"{statistics.median(rss[n]):>13.1f} {runs:>24}"
            )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    lo, hi = min(sizes), max(sizes)
    ratio = statistics.median(rss[hi]) / statistics.median(rss[lo])
    print(f"peak RSS ratio (medians of {args.repeat}) {hi:,} / {lo:,} tokens: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

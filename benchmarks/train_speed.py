"""Training throughput against sequence length: linear for the hybrids, quadratic for attention.

For each preset and layer pattern, trains a randomly initialised model for a few steps at each
sequence length and reports tokens/s of a full training step (forward, cross-entropy, backward,
AdamW update), timed in rounds that step every sequence length once (interleaved).
**Tokens per step are held constant** (``--tokens-per-step``, default 16 384):
the batch is ``tokens_per_step // seq_len`` sequences (16 × 1k … 1 × 16k), so every column does
the same number of tokens and only the sequence length changes. A model whose cost is linear in
the sequence length keeps its tokens/s; full attention (``"A"``) loses throughput as the
sequence grows. The window of the sliding-window layers is the preset's (128).

Printed per preset: a table of tokens/s and, per pattern, the ratio
tokens/s(shortest) / tokens/s(longest) — the slowdown from 1k to 16k. Writes a CSV and a PNG.

    python benchmarks/train_speed.py                                  # tiny and small; SX SD X A
    python benchmarks/train_speed.py --presets tiny --patterns SX A --seq 1024 16384
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, print_table, save_png, write_csv  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.core.plotting import length_axis  # noqa: E402

DEFAULT_SEQ = [1024, 2048, 4096, 8192, 16384]


def pattern_tok_s(
    preset: str,
    pattern: str,
    seqs: list[int],
    tokens_per_step: int,
    steps: int,
    budget_s: float,
    seed: int = 0,
) -> dict[int, tuple[float, int]]:
    """{seq: (median tokens/s, batch)} for one pattern: a model and optimizer per sequence
    length, one warm-up step each, then ``steps`` rounds that time one step at every length
    (interleaved, so a slow spell of a shared machine hits all lengths alike)."""
    cases = []
    for seq in seqs:
        torch.manual_seed(seed)
        cfg = SwaxConfig.preset(preset, layer_pattern=pattern)
        model = SwaxLM(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = max(1, tokens_per_step // seq)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
        cases.append((seq, batch, model, opt, ids, cfg.window))

    def step(model, opt, ids, window):
        logits = model(ids[:, :-1], window=window)
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times: dict[int, list[float]] = {seq: [] for seq in seqs}
    for _, _, *case in cases:  # warm-up (allocations, AdamW state)
        step(*case)
    start = time.perf_counter()
    for _ in range(steps):
        for seq, _, *case in cases:
            t0 = time.perf_counter()
            step(*case)
            times[seq].append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    out = {}
    for seq, batch, *_ in cases:
        t = sorted(times[seq])[len(times[seq]) // 2]
        out[seq] = (batch * seq / t, batch)
    return out


def plot(rows, presets, patterns, path, title):
    def draw(fig):
        for j, preset in enumerate(presets):
            ax = fig.add_subplot(1, len(presets), j + 1)
            for pat in patterns:
                pts = [
                    (r["seq"], r["tok_s"])
                    for r in rows
                    if r["preset"] == preset and r["pattern"] == pat and r["tok_s"]
                ]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=pat)
            length_axis(ax)
            ax.set_xlabel("sequence length")
            ax.set_ylabel("training tokens / s")
            ax.set_title(f"{preset} preset")
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
            ax.legend()

    return save_png(path, draw, title)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--patterns", nargs="+", default=["SX", "SD", "X", "A"])
    ap.add_argument("--seq", type=int, nargs="+", default=DEFAULT_SEQ)
    ap.add_argument("--tokens-per-step", type=int, default=16384)
    ap.add_argument(
        "--steps",
        type=int,
        default=3,
        help="timed rounds per pattern (one step at every length; median)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=300.0,
        help="seconds per pattern after which no further rounds are started",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--csv", default="benchmarks/results/train_speed.csv")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {machine_line()}")
    print(
        f"# training step = forward + cross-entropy + backward + AdamW; "
        f"{args.tokens_per_step:,} tokens per step (batch = tokens / seq); float32; "
        f"median of up to {args.steps} interleaved rounds after 1 warm-up step"
    )
    rows = []
    for preset in args.presets:
        for pattern in args.patterns:
            res = pattern_tok_s(
                preset, pattern, args.seq, args.tokens_per_step, args.steps, args.budget
            )
            for seq, (tok_s, batch) in res.items():
                rows.append(
                    {
                        "preset": preset,
                        "pattern": pattern,
                        "seq": seq,
                        "batch": batch,
                        "tok_s": tok_s,
                    }
                )
                print(
                    f"  {preset} {pattern} seq={seq} batch={batch}: {tok_s:,.0f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    lo, hi = min(args.seq), max(args.seq)
    for preset in args.presets:
        print(f"\n## {preset} preset: training tokens/s")
        table = []
        for pattern in args.patterns:
            r = {
                x["seq"]: x["tok_s"]
                for x in rows
                if x["preset"] == preset and x["pattern"] == pattern
            }
            row = {"pattern": pattern}
            row.update({f"{s}": f"{r[s]:,.0f}" for s in args.seq})
            row[f"slowdown {lo}->{hi}"] = f"{r[lo] / r[hi]:.2f}x"
            table.append(row)
        print_table(table, list(table[0]))
    if "tiny" in args.presets and {"SX", "A"} <= set(args.patterns):
        r = {(x["pattern"], x["seq"]): x["tok_s"] for x in rows if x["preset"] == "tiny"}
        sx, a = r["SX", lo] / r["SX", hi], r["A", lo] / r["A", hi]
        print(
            f"\n## acceptance (issue 5): tiny SX slows down {sx:.2f}x from {lo} to {hi} "
            f"(need <= 1.3: {'yes' if sx <= 1.3 else 'NO'}); A slows down {a:.2f}x "
            f"({'more' if a > sx else 'NOT more'})"
        )
    out = Path(args.csv)
    write_csv([{**r, "tok_s": f"{r['tok_s']:.0f}"} for r in rows], out)
    png = plot(
        rows,
        args.presets,
        args.patterns,
        out.with_suffix(".png"),
        f"training tokens/s at {args.tokens_per_step:,} tokens per step, "
        f"{torch.get_num_threads()} threads",
    )
    print(f"# wrote {out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

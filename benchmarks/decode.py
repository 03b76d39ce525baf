"""Decode cost against context length: constant for SWAX, growing for full attention.

For each layer pattern (tiny preset, random weights, batch 1): prefill a random prompt of each
context length with ``swax.generate.prefill`` (chunks of ``--prefill-chunk``), then time
``--steps`` single-token decode steps (greedy, the model's own next token fed back) and report
the per-token latency and the bytes held by the decode state (``SwaxState.nbytes()``: ring
buffers of W keys/values for S, (C, n, m) for X, the growing KV cache for A).

The decode steps are timed in interleaved rounds over all contexts of a pattern (each round
continues every context's own state), so a slow spell of a shared machine hits every context
alike; the median over rounds is reported. Full attention is capped at ``--max-context-A``
(its prefill is quadratic and its cache grows: the cap keeps the script at a few minutes).
Writes a CSV and a PNG.

    python benchmarks/decode.py                       # SX and A at 1k … 128k
    python benchmarks/decode.py --patterns SX SD --contexts 1024 131072

``--compare`` measures instead the time per decode step of the compiled step against the eager
one, the compute and memory bounds and Hugging Face's ``LlamaForCausalLM.generate`` (issue 34;
see ``benchmarks/decode_compare.py``); ``--quick`` is a short version of it (tiny, 1k, batch 1
and 4).

    python benchmarks/decode.py --compare --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, print_table, save_png, write_csv  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.core.plotting import length_axis  # noqa: E402
from swax.generate import prefill  # noqa: E402

DEFAULT_CONTEXTS = [1024, 4096, 16384, 32768, 65536, 131072]


@torch.no_grad()
def measure_pattern(
    pattern: str,
    contexts: list[int],
    preset: str,
    steps: int,
    rounds: int,
    chunk: int,
    seed: int = 0,
) -> list[dict]:
    torch.manual_seed(seed)
    model = SwaxLM(SwaxConfig.preset(preset, layer_pattern=pattern)).eval()
    W, V = model.config.window, model.config.vocab_size
    live = []
    for T in contexts:
        ids = torch.randint(0, V, (1, T))
        t0 = time.perf_counter()
        logits, state = prefill(model, ids, window=W, chunk_size=chunk)
        pre = time.perf_counter() - t0
        live.append(
            {
                "T": T,
                "state": state,
                "tok": logits.argmax(-1),
                "prefill_s": pre,
                "state_bytes": state.nbytes(),
                "times": [],
            }
        )
        print(f"  {pattern} prefilled {T:,} tokens in {pre:.1f} s", file=sys.stderr, flush=True)

    def run(entry):
        state, tok = entry["state"], entry["tok"]
        t0 = time.perf_counter()
        for _ in range(steps):
            logits, state = model(tok[:, None], window=W, state=state, return_state=True)
            tok = logits[:, -1].argmax(-1)
        entry["times"].append((time.perf_counter() - t0) / steps)
        entry["state"], entry["tok"] = state, tok

    for entry in live:  # warm-up round
        run(entry)
        entry["times"].clear()
    for _ in range(rounds):
        for entry in live:
            run(entry)
    rows = []
    for e in live:
        lat = sorted(e["times"])[len(e["times"]) // 2]
        rows.append(
            {
                "pattern": pattern,
                "context": e["T"],
                "ms_per_token": lat * 1e3,
                "state_bytes": e["state_bytes"],
                "state_bytes_after": e["state"].nbytes(),
                "prefill_s": e["prefill_s"],
            }
        )
    return rows


def plot(rows, patterns, path, title):
    def draw(fig):
        ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        for pat in patterns:
            rs = [r for r in rows if r["pattern"] == pat]
            ax1.plot(
                [r["context"] for r in rs], [r["ms_per_token"] for r in rs], marker="o", label=pat
            )
            ax2.plot(
                [r["context"] for r in rs],
                [r["state_bytes"] / 2**20 for r in rs],
                marker="o",
                label=pat,
            )
        for ax, yl in ((ax1, "ms per decoded token"), (ax2, "decode state, MiB")):
            length_axis(ax)
            ax.set_yscale("log")
            ax.set_xlabel("context length (tokens)")
            ax.set_ylabel(yl)
            ax.grid(alpha=0.3)
            ax.legend()

    return save_png(path, draw, title)


def compare(args) -> int:
    """The --compare / --quick run (see benchmarks/decode_compare.py)."""
    import decode_compare as dc

    if args.quick:
        presets, contexts, batches = ["tiny"], [1024], [1, 4]
        steps, long_steps, repeats = min(args.steps, 32), 8, 1
    else:
        presets, contexts, batches = args.presets, args.compare_contexts, args.batches
        steps, long_steps, repeats = args.steps, args.long_steps, args.repeats
    formats = [f for f in args.weights if f != "float32"]
    print(f"# {machine_line()}")
    print(f"# {dc.header(' '.join(sys.argv[1:]))}")
    res = dc.measure(
        presets, contexts, batches, steps, long_steps, repeats, args.max_kv_gib, formats
    )
    copies = ", ".join(f"{c / 1e9:.1f}" for c in res["copies"])
    print(f"# compute bound from {res['peak'].describe()}")
    print(
        f"# memory bound from a {res['bandwidth'] / 1e9:.1f} GB/s tensor copy (read + write; "
        f"the best of {copies} GB/s before and after the cells)"
    )
    print(
        f"# ms = CPU milliseconds of the one thread per decode step (one new token per row), "
        f"the best of up to {repeats} rounds of t({steps} + 8) - t(8) ({long_steps} for the "
        f"long Llama cells); medians and wall-clock times in the CSV"
    )
    print()
    table = dc.table_rows(res["rows"])
    print_table(table, list(table[0]))
    for line in res["skipped"]:
        print(f"# {line}")
    print("\n## compile time (first call of each preset and batch, inductor)")
    for r in res["rows"]:
        if r["compile_s"]:
            print(f"{r['preset']} x{r['batch']}: {r['compile_s']:.1f} s")
    print("\n## targets (issue 34)")
    for line in dc.targets(res["rows"]):
        print(line)
    if res["weights"]:
        print_weights(dc, res, steps, repeats)
    agree = []
    if args.agreement_model:
        print(
            f"\n## greedy agreement with float32 ({args.agreement_model}, "
            f"{len(dc.PROMPTS)} prompts x {args.agreement_tokens} new tokens)"
        )
        agree = dc.agreement(args.agreement_model, formats, args.agreement_tokens)
        table = [
            {
                "weights": a["weights"],
                "prefix": f"{a['prefix']:.3f}",
                "overall": f"{a['overall']:.3f}",
                "forced": f"{a['forced']:.4f}",
                "max |dlogit|": f"{a['max_logit_diff']:.3f}",
                "logit std": f"{a['logit_std']:.2f}",
            }
            for a in agree
        ]
        print_table(table, list(table[0]))
        print(
            "# prefix: fraction of new tokens before the first that differs; overall: of all"
            " positions; forced: argmax agreement reading float32's tokens (teacher forcing)"
        )
    print(f"# {dc.header('end')}")
    rows = [{k: v for k, v in r.items()} for r in res["rows"]]
    out = (
        Path(args.csv).with_name("decode_compare.csv")
        if args.csv == DEFAULT_CSV
        else Path(args.csv)
    )
    write_csv(
        [{k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows], out
    )
    print(f"# wrote {out}")
    if res["weights"] or agree:
        wout = out.with_name(out.stem + "_weights.csv")
        wrows = res["weights"] + [{"agreement": 1, **a} for a in agree]
        write_csv(
            [{k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()} for r in wrows],
            wout,
        )
        print(f"# wrote {wout}")
    return 0


def print_weights(dc, res, steps: int, repeats: int) -> None:
    """The decode-weights table (issue 45) and its targets."""
    print(
        f"\n## decode weights at batch 1 (issue 45): compiled ms per step, the best of "
        f"{repeats} rounds of t({steps} + 8) - t(8), float32 and the converted weights "
        f"interleaved in each round"
    )
    table = dc.weights_table(res["weights"], res["bandwidth"])
    print_table(table, list(table[0]))
    print(
        "# mem f32 = float32 weights + decode state; mem = the weights as stored (int8 + "
        "scales, bf16; the tied head's converted copy, not the embedding table) + decode "
        "state; both / the copy bandwidth"
    )
    print("\n## targets (issue 45)")
    for line in dc.weights_targets(res["weights"], res["bandwidth"]):
        print(line)
    cache = res["cache_bandwidth"]
    print(
        f"# the same against a {dc.CACHE_MIB} MiB copy, {cache / 1e9:.1f} GB/s (the best of two;"
        f" it stays in the last-level cache, as these weights do between steps):"
    )
    for line in dc.weights_targets(res["weights"], cache, f", {dc.CACHE_MIB} MiB copy rate"):
        print(line)


DEFAULT_CSV = "benchmarks/results/decode.csv"


def _compare_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of --compare / --quick."""
    ap.add_argument("--compare", action="store_true", help="compiled vs eager vs Llama (issue 34)")
    ap.add_argument("--quick", action="store_true", help="a short --compare (tiny, 1k, x1 x4)")
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"], help="with --compare")
    ap.add_argument("--compare-contexts", type=int, nargs="+", default=[1024, 32768])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16], help="with --compare")
    ap.add_argument("--long-steps", type=int, default=16, help="steps of the long Llama cells")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per cell with --compare")
    ap.add_argument("--max-kv-gib", type=float, default=2.5, help="largest Llama cache to try")
    ap.add_argument(
        "--weights",
        nargs="*",
        default=["int8", "bf16"],
        choices=["float32", "int8", "bf16"],
        help="decode weights timed against float32 at batch 1 (issue 45); none: skip",
    )
    ap.add_argument(
        "--agreement-model",
        metavar="DIR",
        help="a trained checkpoint: greedy agreement of the --weights with its float32 tokens",
    )
    ap.add_argument("--agreement-tokens", type=int, default=256, help="new tokens per prompt")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--patterns", nargs="+", default=["SX", "A"])
    ap.add_argument("--contexts", type=int, nargs="+", default=DEFAULT_CONTEXTS)
    ap.add_argument(
        "--max-context-A",
        type=int,
        default=32768,
        help="skip contexts above this for patterns with full attention",
    )
    ap.add_argument("--steps", type=int, default=32, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefill-chunk", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--csv", default=DEFAULT_CSV)
    _compare_arguments(ap)
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare or args.quick:
        return compare(args)
    print(f"# {machine_line()}")
    print(
        f"# preset {args.preset}, batch 1, random weights; prefill in chunks of "
        f"{args.prefill_chunk}; per-token latency = median over {args.rounds} interleaved "
        f"rounds of {args.steps} greedy decode steps"
    )
    rows, skipped = [], []
    for pattern in args.patterns:
        ctx = args.contexts
        if "A" in pattern:
            skipped += [(pattern, T) for T in ctx if T > args.max_context_A]
            ctx = [T for T in ctx if T <= args.max_context_A]
        rows += measure_pattern(
            pattern, ctx, args.preset, args.steps, args.rounds, args.prefill_chunk
        )
    table = [
        {
            "pattern": r["pattern"],
            "context": f"{r['context']:,}",
            "ms/token": f"{r['ms_per_token']:.2f}",
            "state": f"{r['state_bytes'] / 2**20:.2f} MiB",
            "state bytes": f"{r['state_bytes']:,}",
            "prefill": f"{r['prefill_s']:.1f} s",
        }
        for r in rows
    ]
    print()
    print_table(table, list(table[0]))
    for pattern, T in skipped:
        print(
            f"# {pattern} at {T:,}: skipped (above --max-context-A={args.max_context_A:,}; "
            f"quadratic prefill, cache of O(T))"
        )
    for pattern in args.patterns:
        rs = sorted((r for r in rows if r["pattern"] == pattern), key=lambda r: r["context"])
        if len(rs) < 2:
            continue
        a, b = rs[0], rs[-1]
        lat, mem = b["ms_per_token"] / a["ms_per_token"], b["state_bytes"] / a["state_bytes"]
        line = (
            f"{pattern}: {b['context']:,} vs {a['context']:,} context: latency x{lat:.2f}, "
            f"state bytes x{mem:.2f}"
        )
        if "A" not in pattern:
            ok = abs(lat - 1) <= 0.10 and abs(mem - 1) <= 0.10
            line += f" (acceptance, within 10%: {'yes' if ok else 'NO'})"
        print(line)
    out = Path(args.csv)
    write_csv(
        [{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows], out
    )
    png = plot(
        rows,
        args.patterns,
        out.with_suffix(".png"),
        f"decode, {args.preset} preset, batch 1, {torch.get_num_threads()} threads",
    )
    print(f"# wrote {out}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The measurements of the GPU check (tools/gpu_check.py), one stage per process: op timings
against a same-run reference, training and decode speed. The check runs each stage as

    python tools/gpu_stages.py --stage ops|train|decode --out FILE [--limit S] [--cpu-smoke]

and reads FILE, which is rewritten after every row (a stage cut short keeps what it finished).
"""

# ruff: noqa: B023 - the timed closures run within their loop iteration

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpu_check import SMOKE_TRAIN_RUNS, TRAIN_RUNS, run_group


def _bench(fn, warmup=3, reps=10) -> float:
    """Median milliseconds of fn() (CUDA-synchronised; plain wall time on the CPU)."""
    import torch

    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def stage_ops(smoke: bool, save) -> dict:
    """fwd+bwd of attention (swax SWA via flex/flash vs full causal SDPA, the reference) and of
    the mLSTM (triton vs native), bf16; TFLOP/s counted on the visible band."""
    import torch
    import torch.nn.functional as F

    from swax.ops import available_backends, mlstm, select_backend, sliding_window_attention

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    B, H, D = (2, 16, 128) if not smoke else (1, 2, 16)
    lengths = [4096, 16384] if not smoke else [256]
    windows = [128, 2048] if not smoke else [16]
    rows = []
    res = {"device": dev, "dtype": str(dt), "shape": {"B": B, "H": H, "D": D}, "rows": rows}

    def fwd_bwd(f, *xs):
        xs = [x.detach().requires_grad_() for x in xs]
        f(*xs).float().sum().backward()

    for T in lengths:
        q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=dt) for _ in range(3))
        full = _bench(
            lambda: fwd_bwd(
                lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v
            )
        )
        pairs_full = T * (T + 1) / 2
        tf = lambda ms, pairs: 3.5 * 4 * B * H * D * pairs / (ms * 1e-3) / 1e12  # noqa: E731
        rows.append(
            {
                "op": "sdpa_causal",
                "T": T,
                "window": None,
                "ms": full,
                "tflops": tf(full, pairs_full),
            }
        )
        save(res)
        for W in windows:
            backend = select_backend("swa", None, q, k, v, W).name
            ms = _bench(
                lambda: fwd_bwd(lambda a, b, c: sliding_window_attention(a, b, c, W), q, k, v)
            )
            pairs = W * T - W * (W - 1) / 2
            rows.append(
                {
                    "op": f"swa[{backend}]",
                    "T": T,
                    "window": W,
                    "ms": ms,
                    "tflops": tf(ms, pairs),
                    "ref": "sdpa_causal",
                    "ref_ms": full,
                    "per_flop_vs_ref": (ms / pairs) / (full / pairs_full),
                }
            )
            save(res)
    Hm, Dqk, Dv = (8, 128, 256) if not smoke else (2, 16, 16)
    for T in lengths:
        xs = [torch.randn(B, Hm, T, d, device=dev, dtype=dt) for d in (Dqk, Dqk, Dv)]
        xs += [torch.randn(B, Hm, T, device=dev), torch.randn(B, Hm, T, device=dev) + 3]
        names = [n for n in available_backends("mlstm", *xs) if n != "autograd"]  # a reference
        ref = _bench(lambda: fwd_bwd(lambda *a: mlstm(*a, backend="native")[0], *xs))
        for name in names:
            ms = (
                ref
                if name == "native"
                else _bench(lambda n=name: fwd_bwd(lambda *a: mlstm(*a, backend=n)[0], *xs))
            )
            flops = 3.5 * B * Hm * T * (4 * Dqk * Dv + 2 * (Dqk + Dv) * 64)
            rows.append(
                {
                    "op": f"mlstm[{name}]",
                    "T": T,
                    "ms": ms,
                    "tflops": flops / (ms * 1e-3) / 1e12,
                    "ref": "mlstm[native]",
                    "ref_ms": ref,
                    "speedup_vs_ref": ref / ms,
                }
            )
            save(res)
    return res


def _tok_s_records(metrics: Path) -> list[dict]:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return []
    recs = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if "tok_s" in rec:
            recs.append(rec)
    return recs


def stage_train(smoke: bool, logs: Path, limit: float, save) -> dict:
    """`swax train` per configuration until it has logged three throughput intervals (the
    first includes compilation), then stopped (killed: no final validation, checkpoint or
    export, and its folder deleted); tok/s and MFU of the last interval. The stage's time
    limit is shared among the runs still to go."""
    runs = SMOKE_TRAIN_RUNS if smoke else TRAIN_RUNS
    every = 2 if smoke else 4
    out = []
    res = {"runs": out, "sx_over_a_tok_s_at_16384": None}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for j, (preset, pattern, seq, batch, extra) in enumerate(runs):
            run_dir = Path(tmp) / f"run{j}"
            fixed = [e for e in extra if e.startswith("window.fixed=")]
            keys = [
                f"run_dir={run_dir}",
                "steps=1000",
                f"seq_len={seq}",
                f"batch_size={batch}",
                f"model.preset={preset}",
                f"model.layer_pattern={pattern}",
                "data.tokenizer=byte",  # the preset's vocabulary is kept: the same cost
                "window.kind=fixed",
                f"window.short={min(seq, 16)}",
                f"window.long={min(seq, 2048)}",
                *(fixed or [f"window.fixed={min(seq, 2048)}"]),
                f"log.every={every}",
                "log.val_every=100000",
                "log.val_batches=1",
                "checkpoint.every=100000",
                "log.tensorboard=false",
                *(e for e in extra if not e.startswith("window.fixed=")),
                "device=cpu" if smoke else "dtype=bfloat16",
            ]
            cmd = [sys.executable, "-m", "swax", "train", *keys]
            left = limit - (time.monotonic() - start) - 5  # inner runs end before the stage
            if left < 5:
                out.append(
                    {
                        "preset": preset,
                        "pattern": pattern,
                        "seq_len": seq,
                        "batch": batch,
                        "options": extra,
                        "rc": None,
                        "error": "not run: the stage's time limit was reached",
                    }
                )
                save(res)
                continue
            per_run = left / (len(runs) - j)
            t0 = time.perf_counter()
            log = logs / f"train_{j}_{preset}_{pattern}_{seq}.log"
            metrics = run_dir / "metrics.jsonl"
            rc = run_group(cmd, log, per_run, until=lambda m=metrics: len(_tok_s_records(m)) >= 3)
            entry = {
                "preset": preset,
                "pattern": pattern,
                "seq_len": seq,
                "batch": batch,
                "options": extra,
                "rc": rc,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            recs = _tok_s_records(metrics)
            if len(recs) >= 2:  # an interval without compilation
                entry.update(tok_s=recs[-1]["tok_s"], mfu=recs[-1]["mfu"], step=recs[-1]["step"])
            else:
                entry["error"] = f"{rc}: " + log.read_text(errors="replace")[-600:]
            shutil.rmtree(run_dir, ignore_errors=True)
            out.append(entry)
            res["sx_over_a_tok_s_at_16384"] = _ratio(out, "SX", "A", 16384)
            save(res)
            print(json.dumps(entry), flush=True)
    return res


def _ratio(runs, a, b, seq):
    get = {(r["preset"], r["pattern"], r["seq_len"]): r.get("tok_s") for r in runs}
    x, y = get.get(("350m", a, seq)), get.get(("350m", b, seq))
    return x / y if x and y else None


def stage_decode(smoke: bool, save) -> dict:
    """Decode tokens/s at 1k and 128k context, batch 1 and 16, for the 1.4B preset SX and A
    (random weights, bf16); a configuration that does not fit says so."""
    import torch

    from swax import SwaxConfig, SwaxLM
    from swax.generate import prefill

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    preset, contexts, batches, steps = ("1.4b", [1024, 131072], [1, 16], 16)
    if smoke:
        preset, contexts, batches, steps = ("tiny", [64, 256], [1, 2], 4)
    rows = []
    res = {"preset": preset, "rows": rows}
    for pattern in ("SX", "A"):
        torch.manual_seed(0)
        with torch.device(dev):  # initialise on the device: a 1.4B model is slow on the CPU
            model = SwaxLM(SwaxConfig.preset(preset, layer_pattern=pattern)).eval()
        if dev == "cuda":
            model = model.bfloat16()
        W, V = model.config.window, model.config.vocab_size
        for ctx in contexts:
            for bs in batches:
                row = {"pattern": pattern, "context": ctx, "batch": bs}
                try:
                    with torch.no_grad():
                        ids = torch.randint(0, V, (bs, ctx), device=dev)
                        logits, state = prefill(model, ids, window=W, chunk_size=4096)
                        tok = logits.argmax(-1, keepdim=True)  # (B, 1)

                        def step():
                            nonlocal tok, state
                            lg, state = model(
                                tok, window=W, state=state, return_state=True, logits_to_keep=1
                            )
                            tok = lg[:, -1:].argmax(-1)

                        ms = _bench(step, warmup=2, reps=steps)
                    row.update(ms_per_step=ms, tok_s=bs / (ms * 1e-3), state_bytes=state.nbytes())
                except torch.OutOfMemoryError as e:
                    row["error"] = f"out of memory: {str(e).splitlines()[0][:120]}"
                finally:
                    state = logits = None
                    if dev == "cuda":
                        torch.cuda.empty_cache()
                rows.append(row)
                save(res)
                print(json.dumps(row), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, choices=("ops", "train", "decode"))
    ap.add_argument("--out", type=Path, required=True, help="the stage's JSON, row by row")
    ap.add_argument("--limit", type=float, default=600.0, help="the stage's time limit (s)")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU (plumbing)")
    args = ap.parse_args(argv)

    def save(obj):  # after every row, so that a stage cut short keeps what it finished
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(obj, indent=1) + "\n")
        os.replace(tmp, args.out)

    res = {
        "ops": lambda: stage_ops(args.cpu_smoke, save),
        "train": lambda: stage_train(args.cpu_smoke, args.out.parent, args.limit, save),
        "decode": lambda: stage_decode(args.cpu_smoke, save),
    }[args.stage]()
    save(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

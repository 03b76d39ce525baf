"""One command for the GPU paths: tests, kernel checks, op timings, training and decode speed.

    python benchmarks/gpu_check.py            # on a CUDA machine (or: make gpu-check)
    python benchmarks/gpu_check.py --dry-run  # anywhere: the stages, commands and time limits
    python benchmarks/gpu_check.py --cpu-smoke  # the plumbing on the CPU at toy sizes

Each stage runs in its own subprocess with its own time limit (a hang or a crash ends that stage
only) and writes its log under ``--logs``. The results go to ``benchmarks/results/gpu_check.json``
and ``.md``: device name, torch/Triton versions, ``tests: {passed, failed, skipped}``, the
mLSTM Triton gradient check, every op timing with its same-run reference, ``train: [{preset,
pattern, seq_len, tok_s, mfu}]`` and decode tokens/s.

Optional packages (mlstm_kernels, flash-linear-attention, flash-attn) are used when
importable; on a machine without network, install their wheels first (``pip install --no-index
--no-deps --target DIR wheels/*.whl`` and ``PYTHONPATH=DIR:.``). Their absence only skips what
needs them. The stage limits add up to 8 minutes (``--budget`` scales them).
"""

# ruff: noqa: B023 - the timed closures run within their loop iteration

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# (name, seconds): the limits add up to 480 s
STAGES = [("tests", 120), ("mlstm_grad", 60), ("ops", 60), ("train", 180), ("decode", 60)]

TRAIN_RUNS = [  # preset, pattern, seq_len, batch, extra keys
    ("350m", "SX", 16384, 2, ["compile=true"]),
    ("350m", "A", 16384, 2, ["compile=true"]),
    ("1.4b", "SX", 16384, 1, ["compile=true", "activation_checkpointing=true"]),
    ("tiny", "SX", 256, 128, ["window.fixed=16"]),
    ("tiny", "SX", 256, 128, ["window.fixed=256"]),
]
SMOKE_TRAIN_RUNS = [("tiny", "SX", 64, 2, []), ("tiny", "A", 64, 2, [])]


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "triton", "mlstm_kernels", "fla", "flash_attn"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "installed")
        except Exception:  # noqa: BLE001 - absent or broken: reported as such
            out[mod] = None
    return out


def _stage_cmd(name: str, limit: float, args) -> list[str]:
    py = sys.executable
    if name == "tests":
        if args.cpu_smoke:  # the CPU side of the flex path instead
            sel = ["not gpu", "tests/ops/test_attention_op.py", "-k", "flex_path"]
        else:
            sel = ["gpu", "tests/gpu/test_gpu.py", "tests/ops/test_doc_mask.py"]
        return [py, "-m", "pytest", "-v", "-m", *sel, "-p", "no:randomly"]
    if name == "mlstm_grad":
        return [py, "benchmarks/mlstm_triton_grad.py", "--out", str(args.tmp / "mlstm_grad.json")]
    smoke = ["--cpu-smoke"] if args.cpu_smoke else []
    out = str(args.tmp / f"{name}.json")
    return [
        py,
        __file__,
        "--stage",
        name,
        "--stage-out",
        out,
        "--stage-limit",
        f"{limit:.0f}",
        *smoke,
    ]


def _killpg(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def _run_group(cmd, log: Path, limit: float, env=None, until=None) -> int | str:
    """Run ``cmd`` in a session of its own, output to ``log``; at ``limit`` seconds, or once
    ``until()`` is true, kill the whole process group (a stage's own children included).
    Returns the exit status, "timeout" or "stopped"."""
    with open(log, "w") as f:
        p = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + limit
        while True:
            try:
                return p.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            if until is not None and until():
                _killpg(p)
                return "stopped"
            if time.monotonic() > deadline:
                _killpg(p)
                return "timeout"


def _run_stage(name: str, limit: float, args) -> dict:
    cmd = _stage_cmd(name, limit, args)
    log = args.logs / f"{name}.log"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    if args.cpu_smoke and name == "mlstm_grad":
        env["TRITON_INTERPRET"] = "1"
    t0 = time.perf_counter()
    print(f"[gpu-check] {name}: {' '.join(cmd[1:])} (limit {limit:.0f} s)", flush=True)
    rc = _run_group(cmd, log, limit, env=env)
    res = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "log": str(log)}
    if name == "mlstm_grad" and rc == 2:  # mlstm_kernels' Triton kernels are not installed
        res["skipped"] = True
    print(f"[gpu-check] {name}: rc {rc} in {res['seconds']} s", flush=True)
    text = log.read_text(errors="replace")
    if name == "tests":
        res.update(_pytest_counts(text))
    else:
        out = args.tmp / f"{name}.json"
        if out.exists():  # written row by row: a stage cut short keeps what it finished
            res["result"] = json.loads(out.read_text())
    if rc != 0:
        res["tail"] = text[-1500:]
    return res


def _pytest_counts(text: str) -> dict:
    """Counts from pytest's summary line, or (a run cut short prints none) from its -v lines."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    found = re.findall(
        r"(\d+) (passed|failed|skipped|errors?)\b", text.splitlines()[-1] if text else ""
    )
    for n, what in found:
        counts["errors" if what.startswith("error") else what] = int(n)
    if not found:
        for what, key in (
            ("PASSED", "passed"),
            ("FAILED", "failed"),
            ("SKIPPED", "skipped"),
            ("ERROR", "errors"),
        ):
            counts[key] = len(re.findall(rf"::\S+ {what}\b", text))
        counts["cut_short"] = True
    return counts


# ------------------------------------------------------------------------------------- stages


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
            rc = _run_group(cmd, log, per_run, until=lambda m=metrics: len(_tok_s_records(m)) >= 3)
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


# ------------------------------------------------------------------------------------- report


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _markdown(rep: dict) -> str:
    L = [f"# GPU check: {rep['device']}", "", f"`{rep['command']}` — {rep['date']}", ""]
    L += ["versions: " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items()), ""]
    t = rep["tests"]
    L += [
        f"**tests**: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
        f"{t.get('skipped', 0)} skipped, {t.get('errors', 0)} errors "
        f"(rc {t['rc']}, {t['seconds']} s)",
        "",
    ]
    g = rep["stages"].get("mlstm_grad", {}).get("result")
    if g:
        L += [
            "**mLSTM Triton gradients** (normwise error vs native):",
            "",
            "| T | state | impl | h | dq | dk | dv | di | df |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in g["rows"]:
            e = r["rel_err"]
            L.append(
                f"| {r['T']} | {r['initial_state']} | {r['impl']} | "
                + " | ".join(f"{e[k]:.1e}" for k in ("h", "dq", "dk", "dv", "di", "df"))
                + " |"
            )
        L.append("")
    ops = rep["stages"].get("ops", {}).get("result")
    if ops:
        L += [
            f"**ops** (fwd+bwd, {ops['dtype']}):",
            "",
            "| op | T | W | ms | TFLOP/s | reference | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in ops["rows"]:
            ratio = r.get("per_flop_vs_ref", r.get("speedup_vs_ref"))
            L.append(
                _row(
                    r["op"],
                    r["T"],
                    r.get("window", ""),
                    f"{r['ms']:.2f}",
                    f"{r['tflops']:.0f}",
                    r.get("ref", ""),
                    "" if ratio is None else f"{ratio:.2f}",
                )
            )
        L.append("")
    tr = rep.get("train") or []
    if tr:
        L += [
            "**train** (`swax train`, last logged interval):",
            "",
            "| preset | pattern | seq | batch | options | tok/s | MFU |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in tr:
            tok = f"{r['tok_s']:,.0f}" if "tok_s" in r else "failed"
            mfu = f"{r['mfu']:.1%}" if "mfu" in r else ""
            L.append(
                _row(
                    r["preset"],
                    r["pattern"],
                    r["seq_len"],
                    r["batch"],
                    " ".join(r["options"]),
                    tok,
                    mfu,
                )
            )
        L += ["", f"SX/A tokens/s at 16384 (350m): {rep.get('sx_over_a_tok_s_at_16384')}", ""]
    dec = rep["stages"].get("decode", {}).get("result")
    if dec:
        L += [
            f"**decode** ({dec['preset']}):",
            "",
            "| pattern | context | batch | tok/s | state MB |",
            "|---|---|---|---|---|",
        ]
        for r in dec["rows"]:
            tok = f"{r['tok_s']:,.0f}" if "tok_s" in r else r.get("error", "")
            mb = f"{r['state_bytes'] / 2**20:,.0f}" if "state_bytes" in r else ""
            L.append(f"| {r['pattern']} | {r['context']} | {r['batch']} | {tok} | {mb} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list the stages and exit")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU (plumbing)")
    ap.add_argument("--only", default=None, help="comma-separated stages to run")
    ap.add_argument("--budget", type=float, default=1.0, help="scale every stage's limit")
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    ap.add_argument("--logs", type=Path, default=None, help="stage logs (default: beside --out)")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--stage-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--stage-limit", type=float, default=600.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.stage:  # inside a stage's subprocess

        def save(obj):  # after every row, so that a stage cut short keeps what it finished
            tmp = args.stage_out.with_suffix(".tmp")
            tmp.write_text(json.dumps(obj, indent=1) + "\n")
            os.replace(tmp, args.stage_out)

        logs = args.stage_out.parent
        res = {
            "ops": lambda: stage_ops(args.cpu_smoke, save),
            "train": lambda: stage_train(args.cpu_smoke, logs, args.stage_limit, save),
            "decode": lambda: stage_decode(args.cpu_smoke, save),
        }[args.stage]()
        save(res)
        return 0

    stages = [(n, s * args.budget) for n, s in STAGES]
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {n for n, _ in STAGES}
        if unknown:
            print(
                f"gpu_check: unknown stage(s) {sorted(unknown)}; expected {[n for n, _ in STAGES]}",
                file=sys.stderr,
            )
            return 2
        stages = [(n, s) for n, s in stages if n in want]
    args.logs = args.logs or args.out.parent / "gpu_check_logs"
    args.tmp = args.logs
    if args.dry_run:
        print(
            f"gpu_check would run {len(stages)} stages, "
            f"{sum(s for _, s in stages):.0f} s of limits:"
        )
        for name, limit in stages:
            print(
                f"  {name:<11} limit {limit:4.0f} s  {' '.join(_stage_cmd(name, limit, args)[1:])}"
            )
        for preset, pattern, seq, batch, extra in TRAIN_RUNS:
            print(f"    train {preset} {pattern} seq {seq} batch {batch} {' '.join(extra)}")
        print(f"  results: {args.out} and {args.out.with_suffix('.md')}; logs: {args.logs}")
        return 0
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "gpu_check: no CUDA device (torch.cuda.is_available() is False); --dry-run lists "
            "the stages, --cpu-smoke runs them at toy sizes on the CPU",
            file=sys.stderr,
        )
        return 2
    args.logs.mkdir(parents=True, exist_ok=True)
    rep = {
        "device": torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU ({platform.machine()}, smoke)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/gpu_check.py" + (" --cpu-smoke" if args.cpu_smoke else ""),
        "versions": _versions(),
        "stages": {},
    }
    for name, limit in stages:
        rep["stages"][name] = _run_stage(name, limit, args)
    rep["tests"] = rep["stages"].get("tests", {"rc": None, "seconds": 0})
    train = rep["stages"].get("train", {}).get("result") or {}
    rep["train"] = train.get("runs", [])
    rep["sx_over_a_tok_s_at_16384"] = train.get("sx_over_a_tok_s_at_16384")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rep, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(_markdown(rep))
    print(f"[gpu-check] wrote {args.out} and {args.out.with_suffix('.md')}")
    failed = [n for n, r in rep["stages"].items() if r["rc"] != 0 and not r.get("skipped")]
    if failed:
        print(f"[gpu-check] stages that did not finish cleanly: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

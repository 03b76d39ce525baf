"""One command for the GPU paths: tests, kernel checks, op timings, training and decode speed.

    python tools/gpu_check.py            # on a CUDA machine (or: make gpu-check)
    python tools/gpu_check.py --dry-run  # anywhere: the stages, commands and time limits
    python tools/gpu_check.py --cpu-smoke  # the plumbing on the CPU at toy sizes

An orchestrator, not a benchmark: each stage runs in its own subprocess with its own time limit
(a hang or a crash ends that stage only) and writes its log under ``--logs``; the tests are
pytest's gpu tier, the gradient check is benchmarks/mlstm_triton_grad.py, the measurements are
tools/gpu_stages.py. The results go to ``benchmarks/results/gpu_check.json``
and ``.md``: device name, torch/Triton versions, ``tests: {passed, failed, skipped}``, the
mLSTM Triton gradient check, every op timing with its same-run reference, ``train: [{preset,
pattern, seq_len, tok_s, mfu}]`` and decode tokens/s.

Optional packages (mlstm_kernels, flash-linear-attention, flash-attn) are used when
importable; on a machine without network, install their wheels first (``pip install --no-index
--no-deps --target DIR wheels/*.whl`` and ``PYTHONPATH=DIR:.``). Their absence only skips what
needs them. The stage limits add up to 8 minutes (``--budget`` scales them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
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
    stages = str(Path(__file__).with_name("gpu_stages.py").relative_to(ROOT))
    return [py, stages, "--stage", name, "--out", out, "--limit", f"{limit:.0f}", *smoke]


def _killpg(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def run_group(cmd, log: Path, limit: float, env=None, until=None) -> int | str:
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
    rc = run_group(cmd, log, limit, env=env)
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


def _stages(args) -> list[tuple[str, float]] | None:
    """The stages to run with their limits (--only, --budget); None after an unknown stage."""
    stages = [(n, s * args.budget) for n, s in STAGES]
    if not args.only:
        return stages
    want = set(args.only.split(","))
    unknown = want - {n for n, _ in STAGES}
    if unknown:
        expected = [n for n, _ in STAGES]
        print(
            f"gpu_check: unknown stage(s) {sorted(unknown)}; expected {expected}", file=sys.stderr
        )
        return None
    return [(n, s) for n, s in stages if n in want]


def _dry_run(stages, args) -> int:
    limits = sum(s for _, s in stages)
    print(f"gpu_check would run {len(stages)} stages, {limits:.0f} s of limits:")
    for name, limit in stages:
        print(f"  {name:<11} limit {limit:4.0f} s  {' '.join(_stage_cmd(name, limit, args)[1:])}")
    for preset, pattern, seq, batch, extra in TRAIN_RUNS:
        print(f"    train {preset} {pattern} seq {seq} batch {batch} {' '.join(extra)}")
    print(f"  results: {args.out} and {args.out.with_suffix('.md')}; logs: {args.logs}")
    return 0


def _report(stages, args, device: str) -> dict:
    """Run the stages; the report (written to --out and its .md)."""
    rep = {
        "device": device,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python tools/gpu_check.py" + (" --cpu-smoke" if args.cpu_smoke else ""),
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
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list the stages and exit")
    ap.add_argument("--cpu-smoke", action="store_true", help="toy sizes on the CPU (plumbing)")
    ap.add_argument("--only", default=None, help="comma-separated stages to run")
    ap.add_argument("--budget", type=float, default=1.0, help="scale every stage's limit")
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    ap.add_argument("--logs", type=Path, default=None, help="stage logs (default: beside --out)")
    args = ap.parse_args(argv)
    stages = _stages(args)
    if stages is None:
        return 2
    args.logs = args.logs or args.out.parent / "gpu_check_logs"
    args.tmp = args.logs
    if args.dry_run:
        return _dry_run(stages, args)
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(
            "gpu_check: no CUDA device (torch.cuda.is_available() is False); --dry-run lists "
            "the stages, --cpu-smoke runs them at toy sizes on the CPU",
            file=sys.stderr,
        )
        return 2
    args.logs.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()}, smoke)"
    rep = _report(stages, args, device)
    failed = [n for n, r in rep["stages"].items() if r["rc"] != 0 and not r.get("skipped")]
    if failed:
        print(f"[gpu-check] stages that did not finish cleanly: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

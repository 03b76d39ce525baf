"""Training curves in float32 and bfloat16: does bfloat16 change where a run ends (issue 60)?

Three seeds × {float32, bfloat16} of the 4-layer d_model 128 SXSX model (preset tiny) at
T = 1024 on the Python standard library's bytes (``data.source=pystdlib``), batch 4, lr 3e-3,
warmup-stable-decay schedule, 500 steps (2.05M tokens), one thread, **one run at a time**. Prints
each run's final validation loss, the bf16 - fp32 difference per seed and its mean, against the
spread of the seeds (the standard deviation of the three float32 losses, and their range).

The runs go to ``--runs-dir`` (a temporary folder by default; each run folder is removed once
its numbers are in the results unless ``--keep``); the results are written after every run to
``--out`` (JSON), so an interrupted call continues where it stopped.

    python benchmarks/precision_curves.py                     # about 4 h on this CPU (bf16 slow)
    python benchmarks/precision_curves.py --steps 20 --seeds 0  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line  # noqa: E402

from swax.train import distributed as D  # noqa: E402
from swax.train import load_train_config, train  # noqa: E402
from swax.train.build import setup_run  # noqa: E402
from swax.train.step import evaluate  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "precision_curves.json"


def run_overrides(seed: int, dtype: str, steps: int, run_dir: Path) -> list[str]:
    """The curve run's `swax train` overrides (the same for both dtypes but ``dtype``)."""
    return [
        "model.preset=tiny",
        "model.layer_pattern=SX",
        "seq_len=1024",
        "batch_size=4",
        "optim.lr=3e-3",
        "optim.schedule=wsd",
        "data.source=pystdlib",
        f"steps={steps}",
        f"seed={seed}",
        f"dtype={dtype}",
        "threads=1",
        "checkpoint.every=0",
        "log.val_every=0",
        "log.every=50",
        "log.tensorboard=false",
        "log.progress=false",
        f"run_dir={run_dir}",
    ]


def fp32_val_loss(overrides: list[str], run_dir: Path) -> float:
    """The final weights of the run in ``run_dir`` evaluated in float32 on the run's validation
    batches (the trainer's own evaluation, in a scratch run that starts from those weights)."""
    scratch = run_dir.with_name(run_dir.name + "-fp32-eval")
    keep = [o for o in overrides if not o.startswith(("model.", "run_dir="))]
    more = ["dtype=float32", f"run_dir={scratch}", f"init_from={run_dir / 'model'}"]
    cfg = load_train_config(None, [*keep, *more])
    info = D.setup(cfg.device, cfg.dist.backend, cfg.dist.timeout_s)
    try:
        run = setup_run(cfg, info)
        try:
            return evaluate(run)
        finally:
            run.logger.close()
    finally:
        D.teardown()
        shutil.rmtree(scratch, ignore_errors=True)


def summarise(results: dict) -> list[str]:
    """The table: per seed float32 and bfloat16 final validation losses and their difference;
    the mean difference against the seeds' spread."""
    lines = ["seed  float32   bfloat16  bf16-fp32  fp32 s/step  bf16 s/step"]
    diffs, fp32 = [], []
    for seed in sorted({int(k.split(":")[0]) for k in results}):
        a, b = results.get(f"{seed}:float32"), results.get(f"{seed}:bfloat16")
        if a:
            fp32.append(a["val_loss"])
        if a and b:
            diffs.append(b["val_loss"] - a["val_loss"])
        fa = f"{a['val_loss']:.4f}" if a else "-"
        fb = f"{b['val_loss']:.4f}" if b else "-"
        d = f"{diffs[-1]:+.4f}" if a and b else "-"
        ta = f"{a['s_per_step']:.2f}" if a else "-"
        tb = f"{b['s_per_step']:.2f}" if b else "-"
        lines.append(f"{seed:4d}  {fa:>7s}  {fb:>9s}  {d:>9s}  {ta:>11s}  {tb:>11s}")
    if diffs:
        lines.append(f"mean bf16 - fp32: {statistics.mean(diffs):+.4f} over {len(diffs)} seed(s)")
    if len(fp32) > 1:
        lines.append(
            f"float32 seeds: sd {statistics.stdev(fp32):.4f}, range {max(fp32) - min(fp32):.4f}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--runs-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    args = ap.parse_args()
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="swax-precision-"))
    print(f"# {machine_line()}; runs in {runs_dir}; results in {args.out}", flush=True)
    for seed in args.seeds:
        for dtype in ("float32", "bfloat16"):  # paired per seed, so partial results compare
            key = f"{seed}:{dtype}"
            if key in results and results[key]["steps"] == args.steps:
                continue
            run_dir = runs_dir / f"seed{seed}-{dtype}"
            over = run_overrides(seed, dtype, args.steps, run_dir)
            t0 = time.perf_counter()
            val = train(load_train_config(None, over))["final_val_loss"]
            seconds = time.perf_counter() - t0
            val32 = val if dtype == "float32" else fp32_val_loss(over, run_dir)
            results[key] = {
                "val_loss": val,
                "val_loss_fp32_eval": val32,
                "steps": args.steps,
                "s_per_step": seconds / args.steps,
            }
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            note = f"final val loss {val:.4f} (evaluated in float32: {val32:.4f})"
            print(f"seed {seed} {dtype}: {note}, {seconds / 60:.1f} min", flush=True)
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
    print("\n".join(summarise(results)))


if __name__ == "__main__":
    main()

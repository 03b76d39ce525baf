"""FSDP2 on the CPU in a 2-rank gloo world: peak memory per rank of building a preset (the
sharded build on meta against building the whole model on every rank first), of training with
a checkpoint every step (sharded against full checkpoints), and how long a checkpoint save stops
the step loop (in the foreground against in the background).

    python benchmarks/fsdp.py                       # build 350m and 1.4b, train 350m
    python benchmarks/fsdp.py --build 350m --train 350m --steps 2

Each measurement is its own ``torchrun --nproc-per-node=2`` launch; every rank prints its peak
RSS (ru_maxrss), reported against one float32 copy of the model's weights (4 bytes × params).
The save pause is the time ``RunState.save`` takes in the step loop (measured on each rank, the
slower rank shown); a background save returns once its shard is staged and is written while the
next steps run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker_build(preset: str, path: str) -> None:
    import torch

    from swax.config import SwaxConfig
    from swax.model import SwaxLM
    from swax.train import distributed as D

    info = D.setup("cpu")
    torch.set_num_threads(1)
    cfg = SwaxConfig.preset(preset)
    t0 = time.perf_counter()
    if path == "meta":
        model = D.build_sharded(cfg, info, seed=0)
    else:  # what the trainer did before: the whole model on every rank, then fully_shard
        torch.manual_seed(0)
        model = D.wrap_model(SwaxLM(cfg), info, "fsdp")
    wall = time.perf_counter() - t0
    n = sum(p.numel() for p in model.parameters())
    print("RESULT", json.dumps({"rank": info.rank, "peak": _peak(), "full": 4 * n, "s": wall}))
    D.teardown()


def worker_train(preset: str, fmt: str, background: bool, steps: int, run_dir: str) -> None:
    from swax.train import build, load_train_config, train

    pauses: list[float] = []
    real = build.RunState.save

    def timed(self, step):
        t0 = time.perf_counter()
        real(self, step)
        pauses.append(time.perf_counter() - t0)

    build.RunState.save = timed
    cfg = load_train_config(
        None,
        [
            f"model.preset={preset}",
            "seq_len=128",
            "batch_size=2",
            f"steps={steps}",
            "checkpoint.every=1",
            "dist.strategy=fsdp",
            f"checkpoint.format={fmt}",
            f"checkpoint.async_save={str(background).lower()}",
            "threads=1",
            "log.val_every=0",
            "log.val_batches=1",
            "data.val_fraction=0",
            "log.progress=false",
            "optim.warmup_steps=1",
            f"run_dir={run_dir}",
            "overwrite=true",
            "log.tensorboard=false",
        ],
    )
    summary = train(cfg)
    import torch.distributed as dist  # noqa: F401  (torn down by train)

    rank = int(os.environ.get("RANK", "0"))
    n = summary["params"]
    print("RESULT", json.dumps({"rank": rank, "peak": _peak(), "full": 4 * n, "pauses": pauses}))


def launch(args: list[str]) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(Path(__file__).resolve()),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"fsdp.py: {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    out = [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    return sorted(out, key=lambda d: d["rank"])


def gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", nargs="*", default=["350m", "1.4b"], help="presets to build")
    p.add_argument("--train", nargs="*", default=["350m"], help="presets to train")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument(
        "--checkpoints",
        nargs="*",
        default=["full", "sharded", "background"],
        choices=["full", "sharded", "background"],
        help="the checkpoint modes to train with",
    )
    p.add_argument(
        "--resume",
        nargs="*",
        default=[],
        help="presets whose sharded checkpoint (2 ranks, step 1 of 2) is resumed on 2 ranks "
        "(compared bit for bit with the uninterrupted run) and on 1 (the largest difference)",
    )
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        kind, *rest = a.worker
        if kind == "build":
            worker_build(*rest)
        else:
            preset, fmt, bg, steps, run_dir = rest
            worker_train(preset, fmt, bg == "1", int(steps), run_dir)
        return 0
    import torch

    print(f"# 2 ranks, gloo, CPU, 1 thread each; torch {torch.__version__}")
    print("# build: peak RSS per rank (GiB) and its ratio to one float32 copy of the model")
    print(f"{'preset':>7} {'path':>22} {'full':>6} {'rank0':>6} {'rank1':>6} {'ratio':>6} {'s':>6}")
    for preset in a.build:
        for path, label in (("full", "whole model, then shard"), ("meta", "meta, sharded init")):
            rows = launch(["--worker", "build", preset, path])
            full = rows[0]["full"]
            worst = max(r["peak"] for r in rows)
            print(
                f"{preset:>7} {label:>22} {gib(full):>6} {gib(rows[0]['peak']):>6} "
                f"{gib(rows[1]['peak']):>6} {worst / full:>6.2f} {rows[0]['s']:>6.1f}"
            )
    print(
        f"# train: {a.steps} steps of seq 128 x batch 2, a checkpoint every step; peak RSS per "
        "rank (GiB), ratio to one float32 copy; the save pause per step (s, the slower rank)"
    )
    print(
        f"{'preset':>7} {'checkpoints':>22} {'full':>6} {'rank0':>6} {'rank1':>6} {'ratio':>6} "
        f"{'pauses':>14}"
    )
    with tempfile.TemporaryDirectory(prefix="swax-fsdp-bench-") as tmp:
        for preset in a.train:
            modes = {
                "full": ("full", 0, "full (gathered)"),
                "sharded": ("sharded", 0, "sharded"),
                "background": ("sharded", 1, "sharded, background"),
            }
            for fmt, bg, label in (modes[m] for m in a.checkpoints):
                run = str(Path(tmp) / f"{preset}-{fmt}-{bg}")
                rows = launch(["--worker", "train", preset, fmt, str(bg), str(a.steps), run])
                full = rows[0]["full"]
                worst = max(r["peak"] for r in rows)
                pauses = [max(p) for p in zip(*(r["pauses"] for r in rows))]
                print(
                    f"{preset:>7} {label:>22} {gib(full):>6} {gib(rows[0]['peak']):>6} "
                    f"{gib(rows[1]['peak']):>6} {worst / full:>6.2f} "
                    f"{' '.join(f'{x:.2f}' for x in pauses):>14}"
                )
    for preset in a.resume:
        resume_check(preset)
    return 0


def resume_check(preset: str) -> None:
    """Train 2 steps on 2 ranks with a sharded checkpoint after each; resume from step 1 on 2
    ranks and on 1; compare the final weights with the uninterrupted run's."""
    import shutil

    import torch
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="swax-fsdp-resume-") as tmp:
        full = Path(tmp) / "full"
        launch(["--worker", "train", preset, "sharded", "0", "2", str(full)])
        shards = sorted(p.name for p in (full / "checkpoints/step_000002/shards").glob("*"))
        print(f"# {preset}: sharded checkpoint files of step 2: {' '.join(shards)}")
        ref = load_file(str(full / "model/model.safetensors"))
        for nproc in (2, 1):
            run = Path(tmp) / f"on{nproc}"
            shutil.copytree(full, run)
            shutil.rmtree(run / "checkpoints/step_000002")
            shutil.rmtree(run / "model")
            cmd = [sys.executable, "-m", "swax", "train", f"run_dir={run}", "resume=true"]
            if nproc > 1:
                cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            if r.returncode != 0:
                sys.exit(f"fsdp.py: resuming on {nproc} failed:\n{r.stderr[-3000:]}")
            got = load_file(str(run / "model/model.safetensors"))
            exact = all(torch.equal(ref[k], got[k]) for k in ref)
            diff = max((ref[k] - got[k]).abs().max().item() for k in ref)
            print(
                f"# {preset}: resumed from step 1 on {nproc} rank(s): bit-exact {exact}, "
                f"largest weight difference {diff:.2e}"
            )


if __name__ == "__main__":
    sys.exit(main())

"""What the studies' tests share: a study's command run as a user runs it, and archived runs made
up in the sweep's format (their recall inside and beyond the long window given)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_study(package: str, *args: str, cwd: Path, timeout: int = 600):
    """``python -m <package> args`` from ``cwd`` (the repository on PYTHONPATH, so that it runs
    from any folder); the finished process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", package, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def fake_run(kind_inside, beyond, seed, T=256, W=32):
    """An archived run in the sweep's format, with recall inside W and beyond it given."""
    from swax.probes.buckets import verdict

    def row(lo, hi, inside, acc):
        k = round(acc * 64 / 100)
        tally = {"correct": k, "n": 64, "acc": 100 * k / 64}
        return {
            "lo": lo,
            "hi": hi,
            "inside_long": inside,
            **tally,
            "probes": {"window_cut": dict(tally), "reset": dict(tally)},
        }

    rows = [row(0, 8, True, kind_inside), row(8, W, True, kind_inside), row(W, T, False, beyond)]
    return {
        "seq_len": T,
        "buckets": rows,
        "laziness": verdict(rows, 6.25, T),
        "seed": seed,
        "text_val_loss": 1.6,
        "summary": {"elapsed": 240.0, "tokens": 10240000},
    }


def rec(beyond, inside=100.0, beyond_t=None, text=1.6, seed=0):
    """A run's reading (experiments.lab.recall.record) with recall given."""
    from swax.probes.buckets import LAZY_INSIDE, LAZY_MARGIN

    lazy = inside >= LAZY_INSIDE and beyond <= 6.25 + LAZY_MARGIN
    kind = "lazy" if lazy else "memory" if beyond >= 50 else "partial"
    return {
        "seed": seed,
        "inside": inside,
        "beyond": beyond,
        "kind": kind,
        "text": text,
        "beyond_T": beyond if beyond_t is None else beyond_t,
        "cut_inner": inside,
        "reset_beyond": 6.0,
        "minutes": 15.0,
    }


def put(archive, name: str, seed: int, record: dict) -> None:
    """Archive ``record`` as run ``name`` seed ``seed`` (archive/NAME/seedS.json)."""
    import json

    path = Path(archive) / name / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))

"""The reference of the MFU estimate: what "100 %" means on this device.

- On a GPU whose datasheet is known (:data:`GPU_PEAKS`): its dense bfloat16 tensor-core rate.
- Elsewhere (CPUs, unknown GPUs): the best matmul rate this machine has shown, float32 2048² on
  a CPU with the thread count in use, bfloat16 8192² on a GPU. One measurement at start-up is
  compared with the best seen before, which is kept in a small cache
  (``$SWAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/swax``, else ``~/.cache/swax``:
  ``peak_flops.json``), so that a start on a busy machine does not lower the reference and make
  the MFU look high. A run whose model FLOP/s beat the reference raises it (:meth:`Peak.cover`),
  so the MFU never exceeds 100 % by construction.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

GPU_PEAKS: dict[str, float] = {
    # name fragment (most specific first) -> dense bfloat16 FLOP/s of the vendor's datasheet
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,
    "H200": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "V100": 125e12,
}
CACHE_ENV = "SWAX_CACHE_DIR"


def cache_dir() -> Path:
    """Where swax keeps per-machine facts: $SWAX_CACHE_DIR, $XDG_CACHE_HOME/swax, ~/.cache/swax."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "swax"


def _cpu_name() -> str:
    try:
        for ln in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_name()


def measure_matmul(device: torch.device, n: int | None = None, reps: int = 5) -> float:
    """Matmul FLOP/s of ``device`` now: float32 n² (default 2048) on a CPU, bfloat16 (8192) on
    a GPU, after two warm-up products."""
    cuda = device.type == "cuda"
    n = n or (8192 if cuda else 2048)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


@dataclass
class Peak:
    """The MFU reference: ``flops`` per second, what it is (``what``), and the cache key."""

    flops: float
    what: str
    key: str | None = None

    def describe(self) -> str:
        unit, scale = ("TFLOP/s", 1e12) if self.flops >= 1e12 else ("GFLOP/s", 1e9)
        return f"{self.flops / scale:,.1f} {unit}, {self.what}"

    def cover(self, achieved: float) -> None:
        """A rate the model reached: if it beats the reference, it becomes the reference (kept
        in the cache), so that MFU <= 100 % holds."""
        if achieved > self.flops:
            self.flops = achieved
            self.what = "the best rate this machine has shown (a training run's own)"
            if self.key:
                _remember(self.key, achieved)


def _cache_file() -> Path:
    return cache_dir() / "peak_flops.json"


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(key: str, flops: float) -> None:
    """Keep ``flops`` as the best for ``key`` (best effort: an unwritable cache is skipped)."""
    data = _read_cache()
    if flops <= float(data.get(key, 0.0) or 0.0):
        return
    data[key] = flops
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def peak_flops(device: torch.device) -> Peak:
    """The MFU reference of ``device`` (see the module's docstring)."""
    name = device_name(device)
    if device.type == "cuda":
        for frag, flops in GPU_PEAKS.items():
            if frag in name:
                return Peak(flops, f"the {name} datasheet's dense bfloat16 rate")
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    key = f"{name} | {device.type} | threads {threads} | torch {torch.__version__}"
    cached = float(_read_cache().get(key, 0.0) or 0.0)
    now = measure_matmul(device, reps=5 if not cached else 2)
    _remember(key, now)
    matmul = "float32 2048² matmul" if device.type == "cpu" else "bfloat16 8192² matmul"
    on = f" on {threads} thread(s)" if device.type == "cpu" else ""
    what = f"the best {matmul} rate measured on this machine{on} (cached in {_cache_file()})"
    return Peak(max(now, cached), what, key)

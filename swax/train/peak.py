"""The reference of the MFU estimate: what "100 %" means on this device.

- On a GPU whose datasheet is known (:data:`GPU_PEAKS`): its dense bfloat16 tensor-core rate.
- Elsewhere (CPUs, unknown GPUs): the best matmul rate this machine has shown, on a CPU in the
  dtype the run computes in with the thread count in use (float32 2048²; for a bfloat16 run
  bfloat16 2048², or 512² on a CPU without bfloat16 matrix units, where it is slow), bfloat16
  8192² on a GPU. One measurement at start-up is compared with the best seen before, which is
  kept in a small cache
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


def bf16_matrix_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices on units of their own (AMX or AVX-512 BF16)
    that ATen may use: False when its CPU capability is held below AVX-512
    (``ATEN_CPU_CAPABILITY=avx2`` or ``default``: how the tests stand for such a CPU). Without
    them a bfloat16 matmul is emulated and slower than float32 (on an AVX2-only CPU about 80x)."""
    hardware = any(
        getattr(torch.cpu, probe, lambda: False)()
        for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )
    return hardware and torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")


def slow_bf16_warning(device: torch.device, dtype: torch.dtype | None) -> str | None:
    """The start-up warning of a bfloat16 run on a CPU without bfloat16 matrix units (None
    elsewhere)."""
    if device.type != "cpu" or dtype != torch.bfloat16 or bf16_matrix_units():
        return None
    cap = torch.backends.cpu.get_cpu_capability()
    return (
        "warning: dtype=bfloat16 on a CPU without bfloat16 matrix units (AMX or AVX-512 BF16; "
        f"ATen's CPU capability here: {cap}): its matrix products are emulated and the run "
        "will be slower than in float32 (benchmarks/precision.py measures by how much); "
        "dtype=float32 (or auto) is faster here"
    )


def _cpu_size(dtype: torch.dtype) -> int:
    """The CPU measurement's n: 2048, or 512 for bfloat16 without matrix units (2048² would take
    seconds per product there)."""
    return 512 if dtype == torch.bfloat16 and not bf16_matrix_units() else 2048


def measure_matmul(
    device: torch.device, n: int | None = None, reps: int = 5, dtype: torch.dtype | None = None
) -> float:
    """Matmul FLOP/s of ``device`` now, after two warm-up products: on a CPU in ``dtype``
    (default float32) at n² (default :func:`_cpu_size`), on a GPU bfloat16 8192²."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else (dtype or torch.float32)
    n = n or (8192 if cuda else _cpu_size(dtype))
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


def peak_flops(device: torch.device, dtype: torch.dtype | None = None) -> Peak:
    """The MFU reference of ``device`` for a run computing in ``dtype`` (None: float32; on a
    GPU the bfloat16 rate whatever it is; see the module's docstring)."""
    name = device_name(device)
    if device.type == "cuda":
        for frag, flops in GPU_PEAKS.items():
            if frag in name:
                return Peak(flops, f"the {name} datasheet's dense bfloat16 rate")
    cpu = device.type == "cpu"
    dtype = dtype if cpu and dtype is not None else torch.float32
    threads = torch.get_num_threads() if cpu else 0
    key = f"{name} | {device.type} | threads {threads} | torch {torch.__version__}"
    if dtype != torch.float32:  # float32's key as before, so its cached rates still count
        key += f" | {str(dtype).removeprefix('torch.')}"
    cached = float(_read_cache().get(key, 0.0) or 0.0)
    now = measure_matmul(device, reps=5 if not cached else 2, dtype=dtype if cpu else None)
    _remember(key, now)
    n = _cpu_size(dtype)
    matmul = f"{str(dtype).removeprefix('torch.')} {n}² matmul" if cpu else "bfloat16 8192² matmul"
    on = f" on {threads} thread(s)" if device.type == "cpu" else ""
    what = f"the best {matmul} rate measured on this machine{on} (cached in {_cache_file()})"
    return Peak(max(now, cached), what, key)

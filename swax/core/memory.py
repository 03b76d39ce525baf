"""Host memory handed back to the system (glibc on Linux; a no-op elsewhere).

glibc keeps freed blocks below its mmap threshold in the heap, where they stay resident; in
training, the activations and gradients freed each step pile up that way (about 0.9 GiB per rank
for the 350m preset under FSDP on the CPU, benchmarks/README.md). Two remedies:
:func:`map_large_allocations` makes blocks of 128 KiB and more come from mmap, so that freeing
one returns it at once, and :func:`trim` returns what the heap holds free now.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def map_large_allocations(threshold: int = 128 * 1024) -> bool:
    """Serve allocations of ``threshold`` bytes and more with mmap from now on (glibc's
    M_MMAP_THRESHOLD, which also stops glibc from raising it on its own). True when it took."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))


def trim() -> None:
    """Return the heap's free memory to the system (glibc's malloc_trim)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)

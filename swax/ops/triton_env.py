"""Where swax's Triton backends (mLSTM through mlstm_kernels, Gated DeltaNet through fla) can
run: on CUDA, and on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, slow: it is
how the tests check the kernels on a machine without a GPU). The packages are optional and
imported on first use only; :func:`triton_problem` says what the installed Triton lacks."""

from __future__ import annotations

import logging
import os
from functools import lru_cache

log = logging.getLogger("swax")

INTERPRET_ENV = "TRITON_INTERPRET"


def interpreting() -> bool:
    """Whether Triton's interpreter is on (kernels run in Python/numpy on the CPU)."""
    return os.environ.get(INTERPRET_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def unusable_install(backend: str, reason: str, missing: bool = False) -> str:
    """``reason``, logged once as a warning unless the package is simply not installed (an
    installed kernel that cannot run is worth a line: the user meant it to run)."""
    if not missing:
        log.warning("swax: %s backend unavailable (%s); using the next one", backend, reason)
    return reason


def device_problem(device: str | None) -> str | None:
    """None when a Triton kernel can run on tensors of this device type, else why not."""
    if device == "cuda" or (device == "cpu" and interpreting()):
        return None
    if device == "cpu":
        return f"needs CUDA (or {INTERPRET_ENV}=1 on the CPU: Triton's interpreter, for tests)"
    return f"needs CUDA, got {device}"


@lru_cache(maxsize=1)
def triton_problem() -> str | None:
    """None when Triton imports and has what mlstm_kernels' kernels call, else why not (with
    the installed version)."""
    try:
        import triton
        import triton.language as tl
    except Exception as e:  # noqa: BLE001 - not installed, or a broken install
        return f"Triton is not importable ({type(e).__name__}: {e})"
    block_ptr = getattr(tl, "make_block_ptr", None)
    # Triton 3.9 keeps the name, as a stub that raises ("Block pointers have been removed")
    if block_ptr is None or "have been removed" in (block_ptr.__doc__ or ""):
        return (
            f"Triton {triton.__version__} removed tl.make_block_ptr, which mlstm_kernels' "
            "kernel calls (Triton 3.7 and 3.8 have it)"
        )
    return None

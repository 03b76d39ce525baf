"""The ops' precision rule for bfloat16 inputs, in one place.

The kernels (sliding-window attention, the mLSTM chunkwise kernel, Gated DeltaNet's chunk form)
take bfloat16 inputs and run their matrix products on bfloat16 operands (float32 accumulation:
the product of two bfloat16 numbers is exact in float32, and every ATen CPU/CUDA kernel sums in
float32), the products' results rounded to bfloat16 where they are operands again; what sets
the numbers' scale stays float32: gate exponentials and their bookkeeping, the recurrent state,
normalisers (softmax, the mLSTM denominator) and the loss. This is what mlstm_kernels and fla do
on a GPU. float32 inputs run as before, bit for bit; float16 and others compute in float32.

The kernels run with autocast off (:func:`autocast_off`): their dtypes are theirs to choose, so
a call under ``torch.autocast`` computes exactly what a call on the same bfloat16 tensors does.
"""

from __future__ import annotations

import contextlib

import torch


def products_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of a kernel's matrix products for input ``x``: bfloat16 for bfloat16, else
    float32 (the float32 kernels upcast float16 and float64 as before)."""
    return torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32


def autocast_off(x: torch.Tensor):
    """A context with autocast off on ``x``'s device (CPU or CUDA; a no-op when it is off
    already, and on other devices)."""
    kind = x.device.type
    if kind not in ("cpu", "cuda") or not torch.is_autocast_enabled(kind):
        return contextlib.nullcontext()
    return torch.autocast(kind, enabled=False)

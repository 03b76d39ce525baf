"""Pure tensor functions: the math of swax. Imports nothing from the rest of the package.

Tensors are (batch, heads, time, dim); gates (batch, heads, time); states float32.

One package per op, its dispatch in the ``__init__`` and one file per algorithm:
:mod:`swax.ops.swa` (sliding-window attention), :mod:`swax.ops.mlstm` and
:mod:`swax.ops.gated_delta`. Shared by them: ``registry`` (named backends), ``checks`` (input
checks), ``packing`` (packed documents), ``triton_env`` (Triton's environment); ``rope`` and
``conv`` are the layers' small ops.
"""

from swax.ops.gated_delta import gated_delta_rule, gated_delta_step
from swax.ops.mlstm import mlstm, mlstm_step
from swax.ops.registry import available_backends, list_backends, register_backend, select_backend
from swax.ops.rope import apply_rope, rope_cos_sin
from swax.ops.swa import cpu_flex, sliding_window_attention

__all__ = [
    "sliding_window_attention",
    "cpu_flex",
    "mlstm",
    "mlstm_step",
    "gated_delta_rule",
    "gated_delta_step",
    "apply_rope",
    "rope_cos_sin",
    "available_backends",
    "list_backends",
    "register_backend",
    "select_backend",
]

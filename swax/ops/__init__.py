"""Pure tensor functions: the math of swax. Imports nothing from the rest of the package.

Tensors are (batch, heads, time, dim); gates (batch, heads, time); states float32.
"""

from swax.ops.gated_delta import gated_delta_rule, gated_delta_step
from swax.ops.mlstm import mlstm, mlstm_step
from swax.ops.registry import available_backends, list_backends, register_backend, select_backend
from swax.ops.rope import apply_rope, rope_cos_sin
from swax.ops.swa import cpu_flex, cpu_flex_default, sliding_window_attention

__all__ = [
    "sliding_window_attention",
    "cpu_flex",
    "cpu_flex_default",
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

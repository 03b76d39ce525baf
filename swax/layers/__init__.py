"""nn.Modules that own parameters and call ops: one token mixer per file."""

from .attention import AttentionState, FullAttention, SlidingWindowAttention
from .gated_deltanet import GatedDeltaNetLayer
from .mlp import SwiGLU, swiglu_hidden_dim
from .mlstm import MLSTMLayer
from .norm import MultiHeadNorm, RMSNorm

__all__ = [
    "AttentionState",
    "FullAttention",
    "GatedDeltaNetLayer",
    "MLSTMLayer",
    "MultiHeadNorm",
    "RMSNorm",
    "SlidingWindowAttention",
    "SwiGLU",
    "swiglu_hidden_dim",
]

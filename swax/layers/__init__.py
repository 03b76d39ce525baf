"""nn.Modules that own parameters and call ops: one token mixer per file."""

from swax.layers.attention import AttentionState, FullAttention, SlidingWindowAttention
from swax.layers.gated_deltanet import GatedDeltaNetLayer
from swax.layers.mlp import SwiGLU, swiglu_hidden_dim
from swax.layers.mlstm import MLSTMLayer
from swax.layers.norm import MultiHeadNorm, RMSNorm

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

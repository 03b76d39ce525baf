"""Qwen3-Next's Gated DeltaNet layer (transformers' ``Qwen3NextGatedDeltaNet``) in swax.

The two layers compute the same function once swax's :class:`~swax.layers.GatedDeltaNetLayer`
takes Qwen3-Next's conventions: grouped value heads (``value_heads``), one output-norm weight
shared by the heads (``norm_weight="shared"``) and the L2 norm x · rsqrt(Σx² + 1e-6)
(``l2norm="rsqrt"``). Both compute, per value head h of q/k head h // r (r = Hv / Hk):
q, k, v = SiLU(causal depthwise conv(x W_qkv)), q and k L2-normalised, β = σ(x W_b),
g = -exp(A_log) · softplus(x W_a + dt_bias), the gated delta rule, and
out_proj(RMSNorm(o) · w · SiLU(x W_z)).

The tensors (transformers name -> swax name):

================================  ==================================================
``in_proj_qkvz.weight``           ``q_proj``, ``k_proj``, ``v_proj``, ``g_proj`` weights: its
                                  rows are grouped by q/k head, [q (Dk), k (Dk), v (r·Dv),
                                  z (r·Dv)] per head; each part's heads are concatenated
``in_proj_ba.weight``             ``b_proj``, ``a_proj``: rows [b (r), a (r)] per q/k head
``conv1d.weight`` (C, 1, K)       ``conv_weight`` (C, K), channels [q, k, v] in both
``A_log``, ``dt_bias``            the same (one per value head)
``norm.weight`` (Dv)              ``norm.weight`` (shared)
``out_proj.weight``               ``o_proj.weight``
================================  ==================================================

Qwen3-Next's initialisation (A from U(0.01, 16), dt_bias 1) is not swax's; it matters only
for training from scratch, not for loaded weights.
"""

from __future__ import annotations

import torch

from swax.core.errors import ConfigError

KEYS = (
    "hidden_size",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "rms_norm_eps",
)


def _config(config) -> dict:
    """The Gated DeltaNet keys of a Qwen3NextConfig (or of its config.json's dict)."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    missing = [k for k in KEYS if get(k) is None]
    if missing:
        raise ConfigError(f"the Qwen3-Next config has no {missing[0]}")
    if get("hidden_act", "silu") != "silu":
        raise ConfigError(f"Qwen3-Next hidden_act={get('hidden_act')!r}: swax's layer uses silu")
    out = {k: get(k) for k in KEYS}
    if out["linear_num_value_heads"] % out["linear_num_key_heads"]:
        raise ConfigError("linear_num_value_heads must be a multiple of linear_num_key_heads")
    return out


def gated_deltanet_args(config, chunk_size: int = 64) -> dict:
    """The :class:`~swax.layers.GatedDeltaNetLayer` arguments of Qwen3-Next's linear-attention
    layer (``config``: a Qwen3NextConfig or its dict)."""
    c = _config(config)
    d = c["hidden_size"]
    return dict(
        d_model=d,
        n_heads=c["linear_num_key_heads"],
        value_heads=c["linear_num_value_heads"],
        qk_dim_factor=c["linear_num_key_heads"] * c["linear_key_head_dim"] / d,
        v_dim_factor=c["linear_num_value_heads"] * c["linear_value_head_dim"] / d,
        conv_size=c["linear_conv_kernel_dim"],
        chunk_size=chunk_size,
        norm_eps=c["rms_norm_eps"],
        norm_weight="shared",
        l2norm="rsqrt",
    )


def swax_config_fields(config) -> dict:
    """The SwaxConfig fields that give pattern ``D`` layers Qwen3-Next's Gated DeltaNet."""
    a = gated_deltanet_args(config)
    return dict(
        d_model=a["d_model"],
        recurrent_heads=a["n_heads"],
        gdn_value_heads=a["value_heads"],
        qk_dim_factor=a["qk_dim_factor"],
        v_dim_factor=a["v_dim_factor"],
        conv_size=a["conv_size"],
        gdn_norm_weight="shared",
        gdn_l2norm="rsqrt",
    )


def gated_deltanet_state_dict(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """The state dict of swax's layer (:func:`gated_deltanet_args`) holding the weights of a
    Qwen3NextGatedDeltaNet's ``state`` (its own state dict: names without a prefix)."""
    c = _config(config)
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, r = c["linear_key_head_dim"], c["linear_value_head_dim"], hv // hk
    d = c["hidden_size"]
    qkvz = state["in_proj_qkvz.weight"].reshape(hk, 2 * dk + 2 * r * dv, d)
    q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
    b, a = state["in_proj_ba.weight"].reshape(hk, 2 * r, d).split([r, r], dim=1)
    return {
        "q_proj.weight": q.reshape(hk * dk, d),
        "k_proj.weight": k.reshape(hk * dk, d),
        "v_proj.weight": v.reshape(hv * dv, d),
        "conv_weight": state["conv1d.weight"].reshape(state["conv1d.weight"].shape[0], -1),
        "a_proj.weight": a.reshape(hv, d),
        "b_proj.weight": b.reshape(hv, d),
        "A_log": state["A_log"],
        "dt_bias": state["dt_bias"],
        "g_proj.weight": z.reshape(hv * dv, d),
        "norm.weight": state["norm.weight"],
        "o_proj.weight": state["out_proj.weight"],
    }

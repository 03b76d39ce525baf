"""Qwen3-Next's Gated DeltaNet layer (transformers' Qwen3NextGatedDeltaNet) loaded into swax's
GatedDeltaNetLayer through swax.export.qwen3_next: equal outputs for a prefill (chunked, T not
a multiple of the chunk) and for a single-token decode after a cached prefill, with grouped
value heads.

Qwen3-Next's layer computes in float32 whatever the input dtype, so there is no float64 run of
the reference; the bound comes from the reference itself: its output's change when its inputs
are perturbed by one float32 rounding (NOISE_FACTOR times that, plus FLOOR), and the issue's
absolute 1e-4.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.export.qwen3_next import (  # noqa: E402
    gated_deltanet_args,
    gated_deltanet_state_dict,
    swax_config_fields,
)
from swax.layers import GatedDeltaNetLayer  # noqa: E402
from tests.helpers import FLOOR, NOISE_FACTOR, U32, rel_err  # noqa: E402

D = 64


@pytest.fixture(scope="module")
def qwen():
    return pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def qwen_config(key_heads: int, value_heads: int):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        hidden_size=D,
        linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        vocab_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=32,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
    )


def layers(qwen, key_heads, value_heads):
    """(Qwen3-Next's layer with redrawn weights, swax's layer holding them, the config)."""
    cfg = qwen_config(key_heads, value_heads)
    torch.manual_seed(0)
    ref = qwen.Qwen3NextGatedDeltaNet(cfg, 0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name == "norm.weight":
                p.copy_(1 + 0.2 * r)
            elif name == "A_log":  # decay rates exp(A_log) in (e^-1, e)
                p.copy_(2 * torch.rand(p.shape, generator=g) - 1)
            elif name == "dt_bias":
                p.copy_(r)
            else:
                p.copy_(0.1 * r)
    ours = GatedDeltaNetLayer(**gated_deltanet_args(cfg)).eval()
    ours.load_state_dict(gated_deltanet_state_dict(ref.state_dict(), cfg))
    return ref, ours, cfg


def qwen_cache(qwen, layer, cfg):
    """(an empty cache for Qwen3-Next, the keyword the layer takes it by): transformers 5.25
    has DynamicCache(config=...) and ``cache=``; earlier 5.x a Qwen3NextDynamicCache and
    ``cache_params=``."""
    import inspect

    from transformers.cache_utils import DynamicCache

    own = getattr(qwen, "Qwen3NextDynamicCache", None)
    cache = own(cfg) if own is not None else DynamicCache(config=cfg)
    params = inspect.signature(layer.forward).parameters
    return cache, "cache" if "cache" in params else "cache_params"


def noise(fn, x: torch.Tensor, draws: int = 3) -> float:
    """The reference's normwise change under one float32 rounding of its input."""
    base = fn(x)
    g = torch.Generator().manual_seed(9)
    worst = 0.0
    for _ in range(draws):
        pert = x * (1 + U32 * (2 * torch.rand(x.shape, generator=g) - 1))
        worst = max(worst, rel_err(fn(pert), base))
    return worst


def check(ours: torch.Tensor, theirs: torch.Tensor, floor: float, what: str) -> None:
    err = rel_err(ours, theirs)
    assert err <= NOISE_FACTOR * floor + FLOOR, (what, err, floor)
    diff = (ours - theirs).abs().max().item()
    assert diff <= 1e-4, (what, diff)
    print(f"{what}: max |d| {diff:.2e}, normwise {err:.2e}, reference noise {floor:.2e}")


@pytest.mark.parametrize("key_heads,value_heads", [(2, 4), (2, 2)])
def test_prefill_equals_qwen3_next(qwen, key_heads, value_heads):
    ref, ours, _ = layers(qwen, key_heads, value_heads)
    x = torch.randn(2, 100, D, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        floor = noise(ref, x)
        check(ours(x), ref(x), floor, f"prefill Hk={key_heads} Hv={value_heads}")


def test_single_token_decode_equals_qwen3_next(qwen):
    """A cached prefill of 60 tokens, then one token each: transformers' recurrent step on its
    cache, swax's decode step on its state."""
    ref, ours, cfg = layers(qwen, 2, 4)
    cache, kw = qwen_cache(qwen, ref, cfg)
    x = torch.randn(2, 63, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = [ref(x[:, :60], **{kw: cache})]
        mine, state = ours(x[:, :60], return_state=True)
        check(mine, theirs[0], noise(ref, x[:, :60]), "cached prefill")
        for t in range(60, 63):
            theirs = ref(x[:, t : t + 1], **{kw: cache})
            mine, state = ours(x[:, t : t + 1], state=state, return_state=True)
            full = noise(ref, x[:, : t + 1])  # the step's noise: the whole prefix rounded
            check(mine, theirs, full, f"decode token {t}")
    assert state[0].shape == (2, 4, 16, 24)  # one state per value head


def test_qwen3_next_fields_build_a_swax_model(qwen):
    """The SwaxConfig fields of Qwen3-Next's layer make pattern-D models whose decode steps
    continue their prefill (grouped value heads, shared norm weight, rsqrt L2 norm)."""
    fields = swax_config_fields(qwen_config(2, 4))
    cfg = SwaxConfig(n_layers=2, n_heads=2, layer_pattern="SD", vocab_size=64, **fields)
    torch.manual_seed(0)
    model = SwaxLM(cfg.replace(init_std=0.1)).eval()
    mixer = model.blocks[1].mixer
    assert (mixer.n_heads, mixer.v_heads, tuple(mixer.norm.weight.shape)) == (2, 4, (24,))
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(ids, window=8)
        _, state = model(ids[:, :37], window=8, return_state=True)
        steps = []
        for t in range(37, 40):
            logits, state = model(ids[:, t : t + 1], window=8, state=state, return_state=True)
            steps.append(logits)
    assert rel_err(torch.cat(steps, 1), full[:, 37:]) <= 64 * U32


def test_grouped_value_heads_are_checked():
    with pytest.raises(Exception, match="gdn_value_heads"):
        SwaxConfig(d_model=64, n_heads=2, recurrent_heads=2, gdn_value_heads=3)
    with pytest.raises(Exception, match="gdn_l2norm"):
        SwaxConfig(gdn_l2norm="square")


def test_full_size_layer_maps_on_the_meta_device(qwen):
    """transformers' default Qwen3NextConfig (Qwen3-Next-80B-A3B's layer: 16 key heads, 32
    value heads of 128, d_model 2048): the mapped state dict has every tensor of swax's layer at
    its shape, built on the meta device (no memory)."""
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig()
    with torch.device("meta"):
        ref = qwen.Qwen3NextGatedDeltaNet(cfg, 0)
        ours = GatedDeltaNetLayer(**gated_deltanet_args(cfg))
    mapped = gated_deltanet_state_dict(ref.state_dict(), cfg)
    want = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in mapped.items()} == want
    assert (ours.n_heads, ours.v_heads, ours.qk_dim, ours.v_dim) == (16, 32, 2048, 4096)

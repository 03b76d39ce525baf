"""SwaxLM: configs, prefill + decode equivalence, constant-size state, checkpoints, errors."""

import json
import math
import subprocess
import sys

import pytest
import torch

from swax import CheckpointError, ConfigError, SwaxConfig, SwaxLM
from swax.layers import (
    FullAttention,
    GatedDeltaNetLayer,
    MLSTMLayer,
    SlidingWindowAttention,
)
from tests.helpers import NOISE_FACTOR, assert_within_noise, model_noise_floor


def small_cfg(pattern="SX", **kw):
    base = dict(
        vocab_size=97,
        d_model=32,
        n_layers=2 * len(pattern),
        n_heads=4,
        window=16,
        chunk_size=16,
        layer_pattern=pattern,
    )
    base.update(kw)
    return SwaxConfig(**base)


def incremental_logits(model, ids, window, splits):
    """Feed ``ids`` in chunks ending at ``splits``, then one token at a time."""
    outs, state, start = [], None, 0
    for end in [*splits, *range(splits[-1] + 1, ids.shape[1] + 1)]:
        logits, state = model(ids[:, start:end], window=window, state=state, return_state=True)
        outs.append(logits)
        start = end
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA", "X", "D", "S", "A"])
def test_prefill_then_decode_equals_full_forward(pattern):
    torch.manual_seed(0)
    model = SwaxLM(small_cfg(pattern, n_kv_heads=2)).eval()
    ids = torch.randint(0, 97, (2, 90))
    with torch.no_grad():
        full = model(ids, window=16)
        inc, state = incremental_logits(model, ids, 16, [5, 6, 43, 70])
    floor, ref = model_noise_floor(model, lambda m: m(ids, window=16))
    assert_within_noise([full, inc], [floor] * 2, [ref] * 2, ["full", "prefill+decode"])
    names = ["prefill+decode vs full"]
    assert_within_noise([inc], [floor], [full], names, 2 * NOISE_FACTOR)
    assert state.pos == 90


@pytest.mark.parametrize(
    "layer_cls", [SlidingWindowAttention, FullAttention, MLSTMLayer, GatedDeltaNetLayer]
)
def test_each_layer_prefill_then_decode(layer_cls):
    torch.manual_seed(1)
    if layer_cls in (SlidingWindowAttention, FullAttention):
        layer = layer_cls(32, 4, 2, qk_norm=True)
    elif layer_cls is MLSTMLayer:
        layer = MLSTMLayer(32, 4, chunk_size=8)
    else:
        layer = GatedDeltaNetLayer(32, 4, chunk_size=8)
    x = torch.randn(2, 45, 32)
    with torch.no_grad():
        full = layer(x, 12)
        outs, state, start = [], None, 0
        for end in [3, 4, 20, 33, *range(34, 46)]:
            y, state = layer(x[:, start:end], 12, state, True)
            outs.append(y)
            start = end
    inc = torch.cat(outs, 1)
    floor, ref = model_noise_floor(layer, lambda m: m(x.double(), 12))
    assert_within_noise([inc], [floor], [ref], [layer_cls.__name__])
    assert_within_noise([inc], [floor], [full], ["prefill+decode vs full"], 2 * NOISE_FACTOR)


def test_window_at_least_T_equals_full_attention():
    torch.manual_seed(2)
    model = SwaxLM(small_cfg("SX")).eval()
    ids = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        a = model(ids, window=40)
        b = model(ids, window=None)
        c = model(ids, window=8)
    floor, _ = model_noise_floor(model, lambda m: m(ids, window=None))
    assert_within_noise([a], [floor], [b], ["window=T vs full"], 2 * NOISE_FACTOR)
    assert (a - c).abs().max() > 1e-4  # the window changes the result


def test_gradients_flow_to_every_parameter():
    torch.manual_seed(3)
    model = SwaxLM(small_cfg("SXDA"))
    ids = torch.randint(0, 97, (2, 33))
    loss = torch.nn.functional.cross_entropy(
        model(ids, window=8)[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1)
    )
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing


def test_decode_state_is_constant_for_sx_and_grows_for_a():
    torch.manual_seed(4)
    sizes = {}
    for pattern in ("SX", "A"):
        model = SwaxLM(small_cfg(pattern, window=64, chunk_size=64)).eval()
        for n in (1024, 32768):
            ids = torch.randint(0, 97, (1, n))
            state = None
            with torch.no_grad():
                for s in range(0, n, 4096):
                    _, state = model(
                        ids[:, s : s + 4096], state=state, return_state=True, logits_to_keep=1
                    )
            sizes[pattern, n] = state.nbytes()
    print("state bytes:", sizes)
    assert sizes["SX", 1024] == sizes["SX", 32768]
    assert sizes["A", 32768] > 16 * sizes["A", 1024]


def test_bfloat16_model_runs_and_tracks_float32():
    torch.manual_seed(5)
    model = SwaxLM(small_cfg("SXSD")).eval()
    ids = torch.randint(0, 97, (1, 50))
    with torch.no_grad():
        ref = model(ids, window=16).float()
        out = model.to(torch.bfloat16)(ids, window=16).float()
    assert out.dtype == torch.float32
    rel = ((out - ref).norm() / ref.norm()).item()
    print(f"bf16 vs fp32 relative error {rel:.3e}")
    assert rel < 0.05


# ---------------------------------------------------------------------------- configs


def test_presets_sizes():
    with torch.device("meta"):
        n = {
            name: SwaxLM(SwaxConfig.preset(name)).num_parameters()
            for name in ("tiny", "small", "1.4b", "7b")
        }
    assert 0.3e6 < n["tiny"] < 5e6 and 1e6 < n["small"] < 10e6
    assert 1.2e9 < n["1.4b"] < 1.6e9
    assert 6.3e9 < n["7b"] < 7.5e9
    c = SwaxConfig.preset("1.4b")
    assert (c.n_layers, c.d_model) == (24, 2048)
    c = SwaxConfig.preset("7b")
    assert (c.n_layers, c.d_model) == (32, 4096)


def test_layer_pattern_tiling():
    assert SwaxConfig(layer_pattern="SX", n_layers=6).layer_types == "SXSXSX"
    assert SwaxConfig(layer_pattern="SSX", n_layers=6).layer_types == "SSXSSX"
    for p in ("X", "S", "A", "SD", "SA", "D"):
        SwaxConfig(layer_pattern=p, n_layers=4)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(layer_pattern="SQ"), "'Q'"),
        (dict(layer_pattern="SXS", n_layers=4), "does not tile"),
        (dict(window=0), "window must be a positive integer, got 0"),
        (dict(d_model=30, n_heads=4), "not divisible"),
        (dict(n_kv_heads=3), "n_kv_heads=3"),
        (dict(layer_pattern=""), "non-empty"),
        (dict(attn_backend="cuda-magic"), "cuda-magic"),
        # values that used to pass validation and fail later (or silently mean "default")
        (dict(n_kv_heads=0), "n_kv_heads must be a positive integer or None, got 0"),
        (dict(n_kv_heads=-2), "n_kv_heads must be a positive integer or None, got -2"),
        (dict(recurrent_heads=-4), "recurrent_heads must be a positive integer or None"),
        (dict(head_dim=0), "head_dim must be a positive integer or None, got 0"),
        (dict(head_dim=9), "head width 9.*even for RoPE"),
        (dict(d_model=72, n_heads=8, recurrent_heads=4), "head width 9.*even for RoPE"),
        (dict(rope_base=0.0), "rope_base must be a positive number, got 0.0"),
        (dict(mlp_ratio=-1.0), "mlp_ratio must be a positive"),
        (dict(norm_eps=-1e-6), "norm_eps must be a positive"),
        (dict(qk_dim_factor=float("nan")), "qk_dim_factor must be a finite number, got nan"),
        (dict(init_std=-0.02), "init_std must be >= 0, got -0.02"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        SwaxConfig(**kw)


def test_odd_head_width_is_fine_without_rope():
    # no rotary layer: an odd attention head width is allowed
    SwaxConfig(
        d_model=36,
        n_heads=4,
        recurrent_heads=2,
        layer_pattern="A",
        full_attn_rope=False,
        n_layers=2,
    )
    SwaxConfig(d_model=64, n_heads=4, head_dim=9, layer_pattern="X", n_layers=2)


def test_config_from_dict_rejects_unknown_keys_and_types():
    with pytest.raises(ConfigError, match="unknown config key d_modle"):
        SwaxConfig.from_dict({"d_modle": 64})
    with pytest.raises(ConfigError, match="n_layers: expected an integer"):
        SwaxConfig.from_dict({"n_layers": "four"})
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        SwaxConfig.preset("huge")


def test_a_preset_key_expands_to_the_preset_with_the_other_keys_overriding_it():
    got = SwaxConfig.from_dict({"preset": "small", "layer_pattern": "SD", "d_model": 64})
    assert got == SwaxConfig.preset("small", layer_pattern="SD", d_model=64)
    assert (got.n_layers, got.d_model, got.mlstm_igate_bias_init) == (6, 64, -6.0)
    assert SwaxConfig.from_dict({}) == SwaxConfig.preset("tiny")  # no preset: the tiny one
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        SwaxConfig.from_dict({"preset": "huge"})


def test_layer_windows_follow_the_layer_kinds():
    """One window or a per-layer draw -> one window per layer, by which kinds take a window
    (LAYER_KINDS), written out by hand for "SXSA"."""
    from swax.config import LAYER_KINDS

    assert [k for k, kind in LAYER_KINDS.items() if kind.windowed] == ["S"]
    cfg = SwaxConfig(layer_pattern="SXSA", n_layers=4)
    assert cfg.window_layers == (0, 2)
    assert cfg.layer_windows(16) == (16, None, 16, None)
    assert cfg.layer_windows(None) == (None, None, None, None)  # full attention
    assert cfg.layer_windows((8, 32)) == (8, None, 32, None)
    assert cfg.layer_windows([32, 8]) == (32, None, 8, None)
    with pytest.raises(ConfigError, match="one window per windowed layer .*2.*got 3"):
        cfg.layer_windows((8, 32, 8))
    tiled = SwaxConfig(layer_pattern="SXSA", n_layers=8)
    assert tiled.layer_windows((1, 2, 3, 4)) == (1, None, 2, None, 3, None, 4, None)
    assert SwaxConfig(layer_pattern="XD", n_layers=2).layer_windows(64) == (None, None)
    # what the model does with it: the same as one window for every S layer
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=4, n_heads=2, layer_pattern="SXSA"))
    ids = torch.randint(0, 257, (1, 24))
    assert torch.equal(model(ids, window=cfg.layer_windows(8)), model(ids, window=8))


def test_flops_per_token_hand_computed():
    # pattern "A", no tied head difference: count by hand
    cfg = SwaxConfig(
        vocab_size=100,
        d_model=32,
        n_layers=2,
        n_heads=4,
        layer_pattern="A",
        mlp_ratio=2.0,
        mlp_multiple_of=8,
        tie_embeddings=True,
    )
    model = SwaxLM(cfg)
    d, hidden, T = 32, 64, 10
    per_layer_weights = 4 * d * d + 3 * d * hidden
    norms = 2 * d
    matmul = 2 * (2 * per_layer_weights + 2 * norms + d)  # + final norm (counted as params)
    head = 2 * 100 * d
    avg_keys = (T + 1) / 2  # full causal over 10 tokens
    attn = 2 * 4 * 4 * 8 * avg_keys  # 2 layers · 4 flops per (head_dim · key) · heads · head_dim
    assert model.flops_per_token(T, training=False) == pytest.approx(matmul + head + attn)
    assert model.flops_per_token(T) == pytest.approx(3 * (matmul + head + attn))


# ---------------------------------------------------------------------------- bad input


def test_forward_errors():
    model = SwaxLM(small_cfg("SX")).eval()
    ids = torch.randint(0, 97, (1, 10))
    with pytest.raises(ValueError, match="window must be >= 1.*got 0"):
        model(ids, window=0)
    with pytest.raises(ValueError, match="-5"):
        model(ids, window=-5)
    with pytest.raises(ValueError, match="token id 97 is out of range for vocab_size 97"):
        model(torch.tensor([[1, 2, 97]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.rand(1, 4))
    _, state = model(ids, window=16, return_state=True)
    with pytest.raises(ValueError, match="window 16.*window 8"):
        model(ids, window=8, state=state)


@pytest.mark.skipif(torch.cuda.is_available(), reason="flash runs on CUDA")
def test_a_named_attention_backend_that_cannot_run_is_a_config_error():
    """attn_backend=flash on the CPU: the forward names the key, the backend and why, instead
    of running another backend; the same weights with auto run (and equal blockwise)."""
    flash = SwaxLM(small_cfg("SX", attn_backend="flash")).eval()
    ids = torch.randint(0, 97, (1, 12))
    with pytest.raises(ConfigError) as e:
        flash(ids)
    assert str(e.value) == (
        "model.attn_backend 'flash' is not available: needs CUDA; set model.attn_backend=auto "
        "to fall back"
    )
    auto = SwaxLM(small_cfg("SX")).eval()
    auto.load_state_dict(flash.state_dict())
    blockwise = SwaxLM(small_cfg("SX", attn_backend="blockwise")).eval()
    blockwise.load_state_dict(flash.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(auto(ids), blockwise(ids))


# ---------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_load_roundtrip(tmp_path, tie):
    torch.manual_seed(6)
    model = SwaxLM(small_cfg("SD", tie_embeddings=tie)).eval()
    model.save_pretrained(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checksums.sha256",
        "config.json",
        "model.safetensors",
    ]
    loaded = SwaxLM.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    bf = SwaxLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert bf.embed.weight.dtype == torch.bfloat16


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        SwaxLM.from_pretrained(tmp_path / "missing")
    model = SwaxLM(small_cfg("SX"))
    d = tmp_path / "ck"
    model.save_pretrained(d)
    # corrupt weights
    w = d / "model.safetensors"
    good = w.read_bytes()
    w.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="corrupt"):
        SwaxLM.from_pretrained(d)
    w.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(CheckpointError, match="model.safetensors"):
        SwaxLM.from_pretrained(d)
    w.write_bytes(good)
    # mismatched config: a wider model than the weights
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "d_model": 64}))
    with pytest.raises(CheckpointError, match="does not match"):
        SwaxLM.from_pretrained(d)
    (d / "config.json").write_text(json.dumps({**cfg, "n_layers": 6}))
    with pytest.raises(CheckpointError, match="missing"):
        SwaxLM.from_pretrained(d)
    (d / "config.json").write_text(json.dumps({**cfg, "bogus": 1}))
    with pytest.raises(CheckpointError, match="bogus"):
        SwaxLM.from_pretrained(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        SwaxLM.from_pretrained(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        SwaxLM.from_pretrained(d)


def test_a_model_on_the_meta_device_is_not_initialised():
    """from_pretrained and swax info build on the meta device: shapes only. A random
    initialisation there would draw nothing yet import torch's compiler (seconds)."""
    code = (
        "import sys, torch\n"
        "from swax import SwaxConfig, SwaxLM\n"
        "with torch.device('meta'):\n"
        "    m = SwaxLM(SwaxConfig.preset('7b'))\n"
        "assert all(p.is_meta for p in m.parameters())\n"
        "print(m.num_parameters(), 'torch._dynamo' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    n, imported = r.stdout.split()
    assert int(n) > 6e9 and imported == "False"


def _normed_mlstm_output_std(cfg: SwaxConfig) -> float:
    """Std of the mLSTM head norm's output at initialisation (≈ 1 when the memory is on) on
    unit-RMS inputs of 128 positions, for a one-layer model with cfg's widths and gates."""
    cfg = cfg.replace(n_layers=1, layer_pattern="X", vocab_size=256)
    torch.manual_seed(0)
    layer = SwaxLM(cfg).blocks[0].mixer
    x = torch.randn(2, 128, cfg.d_model)
    seen = {}
    hook = layer.norm.register_forward_hook(lambda m, i, o: seen.update(y=o))
    with torch.no_grad():
        layer(x)
    hook.remove()
    return seen["y"].std().item()


def test_small_presets_do_not_start_with_the_memory_switched_off():
    """The presets' input-gate biases give the normalised mLSTM output at initialisation about
    the size xLSTM-7B's -10 gives the 1.4B model; -10 at the tiny width would not."""
    ref = _normed_mlstm_output_std(SwaxConfig.preset("1.4b"))
    assert 0.3 < ref < 0.8
    for name in ("tiny", "small", "125m", "350m"):
        std = _normed_mlstm_output_std(SwaxConfig.preset(name))
        assert 0.5 * ref < std < 2 * ref, (name, std, ref)
    off = _normed_mlstm_output_std(SwaxConfig.preset("tiny", mlstm_igate_bias_init=-10.0))
    assert off < 0.1 * ref
    assert SwaxConfig.preset("7b").mlstm_igate_bias_init == -10.0  # the paper's scales keep it


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA"])
def test_state_select_rows_equals_the_state_of_the_selected_rows(pattern):
    """select_rows (what beam search uses) against running the model on the rows themselves:
    the continuation's logits from the selected state equal those of the reordered batch."""
    torch.manual_seed(4)
    model = SwaxLM(small_cfg(pattern, mlstm_conv_size=4)).eval()
    ids = torch.randint(0, 97, (3, 30))
    index = torch.tensor([2, 0, 2, 1])
    with torch.no_grad():
        _, state = model(ids[:, :20], window=16, return_state=True)
        picked = state.select_rows(index)
        got = model(ids[index, 20:], window=16, state=picked)
        _, direct = model(ids[index, :20], window=16, return_state=True)
        want = model(ids[index, 20:], window=16, state=direct)

    def direct_path(m):
        _, st = m(ids[index, :20], window=16, return_state=True)
        return m(ids[index, 20:], window=16, state=st)

    floor, ref = model_noise_floor(model, direct_path)  # float32 rounding: batch sizes differ
    assert_within_noise([got, want], [floor] * 2, [ref] * 2, ["selected state", "direct"])
    assert picked.pos == 20 and state.layers[0] is not picked.layers[0]


# ------------------------------------------------------------------------------ initialisation
# What every parameter should start as, written out here by name (the spec, not the code): the
# projections that write to the residual stream at init_std / sqrt(2 n_layers), other matrices
# at init_std, the mLSTM gates as xLSTM-7B's, Gated DeltaNet's decay and convolution as fla's.
_RESIDUAL_OUT = ("o_proj", "out_proj", "down")
_INPUT = ("q_proj", "k_proj", "v_proj", "q", "k", "v", "ogate", "gate", "up", "a_proj", "b_proj")
_INPUT += ("g_proj",)


def _expect_init(name: str, p: torch.Tensor, cfg: SwaxConfig) -> None:
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    parts = name.split(".")
    owner, leaf = (parts[-2] if len(parts) > 1 else ""), parts[-1]
    if leaf.endswith("norm_weight") or owner.endswith("norm") or owner == "norm":
        assert torch.equal(p, torch.ones_like(p)), name
    elif leaf == "conv_weight":
        bound = 1 / math.sqrt(p.shape[1])
        assert p.abs().max() <= bound and p.std() > 0.4 * bound, name
    elif leaf == "A_log":
        assert (p >= 0).all() and (p <= math.log(16) + 1e-6).all(), name
    elif leaf == "dt_bias":
        dt = torch.nn.functional.softplus(p)
        assert (dt >= 1e-4 - 1e-7).all() and (dt <= 0.1 + 1e-6).all(), name
    elif owner in ("igate", "fgate") and leaf == "weight":
        assert abs(p.std().item() / 0.001 - 1) < 0.15, name
    elif owner == "igate":
        assert torch.equal(p, torch.full_like(p, cfg.mlstm_igate_bias_init)), name
    elif owner == "fgate":
        lo, hi = cfg.mlstm_fgate_bias_init
        torch.testing.assert_close(p, torch.linspace(lo, hi, p.numel()), rtol=0, atol=1e-6)
    else:
        want = out_std if owner in _RESIDUAL_OUT else std
        assert owner in _RESIDUAL_OUT + _INPUT or name in ("embed.weight", "head.weight"), name
        assert abs(p.mean().item()) < 5 * want / math.sqrt(p.numel()), name
        assert abs(p.std().item() / want - 1) < 0.1, (name, p.std().item(), want)


@pytest.mark.parametrize(
    "kw",
    [
        dict(layer_pattern="SX", mlstm_conv_size=4),
        dict(layer_pattern="SD"),
        dict(layer_pattern="SA", qk_norm=True, tie_embeddings=False),
    ],
)
def test_every_parameter_starts_as_specified(kw):
    cfg = SwaxConfig(d_model=128, n_layers=4, n_heads=4, init_std=0.05, **kw)
    torch.manual_seed(0)
    model = SwaxLM(cfg)
    for name, p in model.named_parameters():
        _expect_init(name, p.detach(), cfg)
    with torch.no_grad():  # reset_parameters starts every parameter over
        for p in model.parameters():
            p.fill_(7.0)
    model.reset_parameters()
    for name, p in model.named_parameters():
        assert not (p == 7.0).any(), name
        _expect_init(name, p.detach(), cfg)


def test_config_backend_names_match_the_op_registry():
    # swax.config names the attention backends as a Literal so that it need not import the ops;
    # the registry is the truth, and the two must not drift apart
    import typing

    from swax.config import AttnBackend
    from swax.ops import list_backends

    names = typing.get_args(AttnBackend)
    assert names[0] == "auto"
    assert sorted(names[1:]) == sorted(list_backends("swa"))

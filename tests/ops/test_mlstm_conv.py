"""The mLSTM layer's optional short convolution (``mlstm_conv_size``): the layer against a
reference written from its definition (a loop over taps, the naive mLSTM cell), prefill +
decode against the full forward, and the default (off) leaving models as they were."""

import pytest
import torch
import torch.nn.functional as F

from swax import ConfigError, SwaxLM
from swax.layers import MLSTMLayer
from swax.layers.mlstm import soft_cap
from tests.helpers import NOISE_FACTOR, assert_within_noise, model_noise_floor, naive_mlstm
from tests.model.test_model import incremental_logits, small_cfg


def reference_conv_mlstm(layer: MLSTMLayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's output in float64, from its definition: xc_t = SiLU(sum_j w_j * x_{t-K+1+j})
    (zeros before the start) per channel, q and k from xc, v and the gates from x, the mLSTM
    cell as a loop over time, then the output gate, head norm and projection."""
    x = x.double()
    B, T, D = x.shape
    H, K = layer.n_heads, layer.conv_size
    w = layer.conv_weight.double()
    xc = torch.zeros_like(x)
    for t in range(T):
        for j in range(K):
            s = t - (K - 1) + j
            if s >= 0:
                xc[:, t] += w[:, j] * x[:, s]
    xc = F.silu(xc)

    def lin(m, inp):
        return F.linear(inp, m.weight.double(), None if m.bias is None else m.bias.double())

    q = lin(layer.q, xc).view(B, T, H, -1).transpose(1, 2)
    k = lin(layer.k, xc).view(B, T, H, -1).transpose(1, 2)
    v = lin(layer.v, x).view(B, T, H, -1).transpose(1, 2)
    i = soft_cap(lin(layer.igate, x), layer.gate_soft_cap).transpose(1, 2)
    f = soft_cap(lin(layer.fgate, x), layer.gate_soft_cap).transpose(1, 2)
    h, _ = naive_mlstm(q, k, v, i, f, eps=layer.eps)
    h = h.transpose(1, 2)
    mean = h.mean(-1, keepdim=True)
    var = h.var(-1, unbiased=False, keepdim=True)
    hn = (h - mean) / torch.sqrt(var + layer.norm.eps) * layer.norm.weight.double().view(H, -1)
    o = torch.sigmoid(lin(layer.ogate, x))
    return lin(layer.out_proj, o * hn.reshape(B, T, -1))


@pytest.mark.parametrize("T", [1, 3, 20, 45])
def test_conv_mlstm_layer_matches_its_definition(T):
    torch.manual_seed(0)
    layer = MLSTMLayer(32, 4, chunk_size=8, conv_size=4, igate_bias_init=0.0)
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        out = layer(x)
        ref = reference_conv_mlstm(layer, x)
    floor, ref64 = model_noise_floor(layer, lambda m: m(x.double()))
    assert_within_noise([out], [floor], [ref], [f"conv mLSTM T={T} vs reference"])
    assert_within_noise([ref64.float()], [floor], [ref], ["layer in float64 vs reference"])


def test_conv_mlstm_layer_prefill_then_decode():
    torch.manual_seed(1)
    layer = MLSTMLayer(32, 4, chunk_size=8, conv_size=4, igate_bias_init=0.0)
    x = torch.randn(2, 30, 32)
    with torch.no_grad():
        full = layer(x)
        outs, state, start = [], None, 0
        for end in [1, 2, 17, *range(18, 31)]:  # splits shorter than the kernel, then steps
            y, state = layer(x[:, start:end], None, state, True)
            outs.append(y)
            start = end
    assert len(state) == 4 and state[3].shape == (2, 32, 3)
    floor, ref = model_noise_floor(layer, lambda m: m(x.double()))
    inc = torch.cat(outs, 1)
    assert_within_noise([inc], [floor], [ref], ["conv mLSTM prefill+decode"])
    assert_within_noise([inc], [floor], [full], ["prefill+decode vs full"], 2 * NOISE_FACTOR)


def test_conv_model_prefill_then_decode_equals_full_forward():
    torch.manual_seed(2)
    model = SwaxLM(small_cfg("SX", mlstm_conv_size=4)).eval()
    ids = torch.randint(0, 97, (2, 50))
    with torch.no_grad():
        full = model(ids, window=16)
        inc, _ = incremental_logits(model, ids, 16, [2, 3, 30])
    floor, ref = model_noise_floor(model, lambda m: m(ids, window=16))
    assert_within_noise([inc], [floor], [full], ["SX conv prefill+decode"], 2 * NOISE_FACTOR)


def test_the_convolution_is_off_by_default_and_changes_the_model_when_on():
    torch.manual_seed(3)
    plain = SwaxLM(small_cfg("SX"))
    assert not any("conv" in n for n, _ in plain.named_parameters())
    _, state = plain(torch.randint(0, 97, (1, 5)), window=16, return_state=True)
    assert len(state.layers[1]) == 3  # (C, n, m), as before the option
    conv = SwaxLM(small_cfg("SX", mlstm_conv_size=4))
    extra = {n for n, _ in conv.named_parameters()} - {n for n, _ in plain.named_parameters()}
    assert extra == {f"blocks.{i}.mixer.conv_weight" for i in (1, 3)}
    with pytest.raises(ConfigError, match="mlstm_conv_size"):
        small_cfg("SX", mlstm_conv_size=-1)

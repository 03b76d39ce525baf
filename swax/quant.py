"""Weight-only int8 or bfloat16 weights for decoding: fewer bytes read per generated token.

A decode step at batch 1 reads every weight once for one multiply-add each: it is bound by
memory, not arithmetic (``benchmarks/README.md``, "Decode at the memory limit"). Storing the
weights in fewer bytes shortens it; the activations, norms, recurrent memories and attention
stay in the model's dtype (float32), and every product accumulates in float32.

    from swax.quant import decode_weights
    fast = decode_weights(model, "int8")     # a new model; ``model`` is left as it was
    out = generate(fast, ids, max_new_tokens=256, compile=True)

- ``"int8"``: each weight matrix as int8 with one float32 scale per output channel (symmetric:
  ``scale = max |row| / 127``, ``q = round(w / scale)``), a quarter of the float32 bytes;
- ``"bf16"``: each weight matrix rounded to bfloat16, half the bytes;
- ``"float32"``: nothing to do, the model itself is returned.

Every ``nn.Linear`` of the blocks is replaced, and the output head too (``head=True``): the
tied embedding's matrix is stored again, converted, for the head, while the embedding lookup
keeps the float32 table (it reads one row per token). Biases, norms and gate parameters stay as
they were. With one row of input in a compiled graph (the compiled decode step of one
sequence, ``generate(..., compile=True)``) a layer computes ``sum_k x_k * w[n, k]`` as a
product and a sum over k, which inductor compiles into one loop that reads the int8 / bfloat16
weights directly (on the CPU this beat MKL's float32 GEMV, oneDNN's bfloat16 one and
``torch._weight_int8pack_mm``: benchmarks/README.md). Otherwise (eager, batched decode, the
prefill) the matrix is converted to float32 for one ``F.linear``: a copy of the matrix per call,
so the *eager* decode step is slower than float32's; the gain is the compiled step's.

The converted model is for inference: its parameters are not trainable and
``save_pretrained`` refuses it (save the float32 model). Greedy tokens differ from float32's
once two candidates are closer than the weights' rounding moves them; ``benchmarks/decode.py
--compare`` and benchmarks/README.md report how often on a trained model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from swax.generate import generate
from swax.model import SwaxLM

WEIGHT_FORMATS = ("float32", "bf16", "int8")
"""What :func:`decode_weights` accepts (and ``swax generate --weights``)."""


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of a (out, in) matrix: (q int8 (out, in), scale
    float32 (out,)) with ``weight ≈ q * scale[:, None]``, ``scale = max |row| / 127`` (an all-zero
    row gets scale 1 and zeros), ``q = round(weight / scale)`` in -127 … 127, so every element
    is within scale / 2 of the original."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _compiled_row(x: torch.Tensor) -> bool:
    """One row of input in a graph being compiled: the product-and-sum form (eagerly that form
    makes a float copy of the matrix as large as F.linear's, and is about 2x slower)."""
    return math.prod(x.shape[:-1]) == 1 and _compiling()


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _row_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., K) with one row times w (N, K)ᵀ as an elementwise product and a sum in float32:
    compiled, one loop over the weights in their own dtype (no converted copy, no GEMV call)."""
    return (x.float().unsqueeze(-2) * w.float()).sum(-1)


class Int8Linear(nn.Module):
    """``nn.Linear`` with weight-only int8 weights: ``weight_int8`` (out, in) int8 and
    ``scale`` (out,) float32 (:func:`quantize_int8`), an optional bias as it was; computes
    ``(x @ weight_int8ᵀ) * scale + bias`` in float32 and returns the input's dtype."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias=None):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.weight_int8 = nn.Parameter(weight_int8, requires_grad=False)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        return cls(*quantize_int8(linear.weight), linear.bias)

    def dequantized(self) -> torch.Tensor:
        """The float32 matrix the layer stands for: ``weight_int8 * scale[:, None]``."""
        return self.weight_int8.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _compiled_row(x):
            y = _row_product(x, self.weight_int8) * self.scale
        else:
            y = F.linear(x.float(), self.weight_int8.float()) * self.scale
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class BF16Linear(nn.Module):
    """``nn.Linear`` with bfloat16 weights (``weight``) and float32 arithmetic: the products of
    float32 activations with the rounded weights, summed in float32; returns the input's
    dtype."""

    def __init__(self, weight: torch.Tensor, bias=None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> BF16Linear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _compiled_row(x):
            y = _row_product(x, self.weight)
        else:
            y = F.linear(x.float(), self.weight.float())
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16"


_LINEAR = {"int8": Int8Linear, "bf16": BF16Linear}


class DecodeWeightsLM(SwaxLM):
    """A :class:`SwaxLM` made by :func:`decode_weights`: the same forward, generate and decode
    step, with int8 / bfloat16 linear layers and, when ``embed_head`` is set, the tied head read
    from a converted copy of the embedding."""

    def __init__(self, config):
        super().__init__(config)
        self.weight_format = "float32"
        self.embed_head: nn.Module | None = None

    def project_head(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.embed_head if self.head is None else self.head
        if not isinstance(head, (Int8Linear, BF16Linear)):
            return super().project_head(hidden)
        return head(hidden)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """As the float32 model's (the head's copy of the tied embedding not counted again)."""
        n = super().num_parameters(exclude_embeddings)
        if self.embed_head is not None:
            n -= sum(p.numel() for p in self.embed_head.parameters())
        return n

    def save_pretrained(self, path):
        raise TypeError(
            f"a model with {self.weight_format} decode weights (swax.quant.decode_weights) is for "
            "inference only and is not saved: save the float32 model it was made from"
        )


def decode_weights(model: SwaxLM, weights: str = "int8", head: bool = True) -> SwaxLM:
    """A copy of ``model`` for inference whose weight matrices are stored as ``weights``
    ("int8": per-output-channel symmetric int8, "bf16": bfloat16; see the module docstring),
    activations staying in the model's dtype. ``model`` is not changed (its tensors are not
    shared with the copy, except that none are written). ``head``: convert the output head too
    (for a tied embedding, a converted copy of the matrix; the lookup keeps the float table).
    ``"float32"`` returns ``model`` itself. The copy is in eval mode, on ``model``'s device,
    and works with ``generate(..., compile=True)``."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
    if not isinstance(model, SwaxLM):
        raise TypeError(f"decode_weights expects a SwaxLM, got {type(model).__name__}")
    if weights == "float32":
        return model
    if isinstance(model, DecodeWeightsLM):
        raise ValueError(f"the model already has {model.weight_format} decode weights")
    make = _LINEAR[weights]
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if not head:
        linears.discard("head")
    skip = {f"{n}.weight" for n in linears} | {f"{n}.bias" for n in linears}
    # the copy is built on the meta device and given clones of the tensors it keeps: it never
    # holds float copies of the matrices it converts
    tensors = {k: v if k in skip else v.detach().clone() for k, v in model.state_dict().items()}
    with torch.device("meta"):
        new = DecodeWeightsLM(model.config)
    new.load_state_dict(tensors, assign=True, strict=True)
    for name in sorted(linears):
        parent, _, attr = name.rpartition(".")
        setattr(
            new.get_submodule(parent) if parent else new,
            attr,
            make.from_linear(model.get_submodule(name)),
        )
    if head and model.head is None:
        tied = nn.Linear(model.config.d_model, model.config.vocab_size, bias=False, device="meta")
        tied.weight = model.embed.weight
        new.embed_head = make.from_linear(tied)
    new.weight_format = weights
    new.gradient_checkpointing = False
    for p in new.parameters():
        p.requires_grad_(False)
    return new.eval()


def decode_weight_bytes(model: SwaxLM) -> int:
    """Bytes of weights one decode step reads at least: every parameter and buffer at its
    stored dtype, the embedding table once (as the tied head, or not at all when the head has a
    converted copy of it: the lookup reads one row)."""
    total = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    if isinstance(model, DecodeWeightsLM) and model.embed_head is not None:
        total -= model.embed.weight.numel() * model.embed.weight.element_size()
    return total


@torch.no_grad()
def greedy_agreement(
    reference: SwaxLM,
    model: SwaxLM,
    prompts,
    max_new_tokens: int = 256,
    compile: bool | None = False,
) -> dict:
    """How far ``model`` (e.g. :func:`decode_weights` of ``reference``) decodes as
    ``reference`` does, greedily, over ``prompts`` (1-D token id tensors), each continued by
    ``max_new_tokens`` tokens (no end-of-text stop). Returns the means over prompts of:

    - ``prefix``: the fraction of new tokens before the first that differs (1: none differs);
    - ``overall``: the fraction of positions where the two generations hold the same token
      (after a divergence they continue different texts, so this is a loose figure);
    - ``forced``: the fraction of positions where the two models' argmax agree when both read
      the reference's generation (teacher forcing: no divergence carries over);

    and over all prompts ``max_logit_diff``, the largest |difference| of the two models'
    logits on those forced positions (a prefill of prompt + generation), with ``logit_std``,
    the reference logits' standard deviation, for scale."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = reference.embed.weight.device
    prefix, overall, forced, diff, std = [], [], [], 0.0, []
    for ids in prompts:
        ids = torch.as_tensor(ids, device=device).reshape(1, -1)
        T = ids.shape[1]
        a = generate(reference, ids, max_new_tokens, compile=compile)[0, T:]
        b = generate(model, ids, max_new_tokens, compile=compile)[0, T:]
        same = a == b
        n = len(a)
        first = int((~same).nonzero()[0, 0]) if not bool(same.all()) else n
        prefix.append(first / n)
        overall.append(float(same.float().mean()))
        seq = torch.cat([ids[0], a[:-1]])[None]
        la = reference(seq, logits_to_keep=n)[0].float()
        lb = model(seq, logits_to_keep=n)[0].float()
        forced.append(float((la.argmax(-1) == lb.argmax(-1)).float().mean()))
        diff = max(diff, float((la - lb).abs().max()))
        std.append(float(la.std()))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return dict(
        prefix=mean(prefix),
        overall=mean(overall),
        forced=mean(forced),
        max_logit_diff=diff,
        logit_std=mean(std),
        prompts=len(prefix),
        new_tokens=max_new_tokens,
    )

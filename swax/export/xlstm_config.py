"""transformers' xLSTM config (``model_type: xlstm``, NX-AI's xLSTM 7B) <-> SwaxConfig.

An xLSTM model is a swax model of layer pattern ``X`` with an untied head, a logit cap
(``output_logit_soft_cap``) and transformers' MLP rounding (``mlp_rounding="xlstm"``): the
``xlstm-7b`` preset with the source's sizes. Every key of an xLSTM ``config.json`` is handled
one of five ways (:data:`MAPPED`, :data:`REQUIRED`, :data:`CHOICES`, :data:`NO_MATH`, or the
checked ``head_dim``); any other key is refused by name, as swax cannot tell whether it changes
the computation (``ignore`` passes keys the user vouches for). A value transformers' own
xLSTMConfig refuses (a null cap, an unknown weight_mode) is refused too.
"""

from __future__ import annotations

import math

from swax.config import SwaxConfig
from swax.core.errors import ConfigError
from swax.layers.mlp import swiglu_hidden_dim

MODEL_TYPE = "xlstm"

MAPPED = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_heads": "recurrent_heads",
    "norm_eps": "norm_eps",
    "eps": "mlstm_eps",
    "qk_dim_factor": "qk_dim_factor",
    "v_dim_factor": "v_dim_factor",
    "chunk_size": "chunk_size",
    "ffn_proj_factor": "mlp_ratio",
    "ffn_round_up_to_multiple_of": "mlp_multiple_of",
    "gate_soft_cap": "gate_soft_cap",
    "output_logit_soft_cap": "logit_soft_cap",
}
"""xLSTM key -> the SwaxConfig field it becomes (``embedding_dim`` and ``num_blocks`` must
equal ``hidden_size`` and ``num_hidden_layers``; ``weight_mode`` says how the tensors are
laid out)."""
ALIASES = {"embedding_dim": "hidden_size", "num_blocks": "num_hidden_layers"}
REQUIRED = {
    "use_bias": False,
    "add_out_norm": True,
    "add_post_blocks_norm": True,
    "add_qk_norm": False,
    "add_post_norm": False,
}
"""Keys that change the computation, with the only value swax (and transformers) implements."""
CHOICES = {"weight_mode": ("single", "fused")}
"""Keys that say how the tensors are laid out, with the values transformers takes."""
NO_MATH = frozenset(
    {
        # how transformers runs the same function: kernels, modes, state dtypes, chunking
        "chunkwise_kernel",
        "sequence_kernel",
        "step_kernel",
        "mode",
        "return_last_states",
        "autocast_kernel_dtype",
        "inference_state_dtype",
        "max_inference_chunksize",
        "norm_reduction_force_float32",
        "use_cache",
        # the head is read from lm_head.weight whatever this says (transformers does not tie)
        "tie_word_embeddings",
        # token ids, bookkeeping and the generic keys of every transformers config
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "_name_or_path",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "is_encoder_decoder",
        "output_attentions",
        "output_hidden_states",
        "problem_type",
        "return_dict",
    }
)
"""Keys that do not change the float32 function: read past."""


def _number(hf: dict, key: str, kind: type = float):
    value = hf[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or (kind is int and int(value) != value):
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"xLSTM config field {key}={value!r} is not {what}")
    return kind(value)


def check_keys(hf: dict, ignore: tuple[str, ...] = ()) -> None:
    """ConfigError naming the first key of ``hf`` swax does not implement (see the module
    docstring); keys in ``ignore`` pass."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ConfigError(
            f"config.json has model_type {hf.get('model_type')!r}, not {MODEL_TYPE!r} "
            "(transformers' xLSTM)"
        )
    for key, value in hf.items():
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(
                f"xLSTM config field {key}={value!r} is not one of {', '.join(CHOICES[key])}"
            )
        if key in ignore or key in MAPPED or key in NO_MATH or key in CHOICES:
            continue
        if key in ALIASES:
            other = hf.get(ALIASES[key])
            if value is not None and other is not None and value != other:
                raise ConfigError(
                    f"xLSTM config field {key}={value!r} differs from "
                    f"{ALIASES[key]}={hf.get(ALIASES[key])!r}"
                )
        elif key in REQUIRED:
            if value != REQUIRED[key]:
                raise ConfigError(
                    f"xLSTM config field {key}={value!r} is not supported by swax (only "
                    f"{key}={REQUIRED[key]!r})"
                )
        elif key != "head_dim":
            raise ConfigError(
                f"unknown xLSTM config field {key!r} (={value!r}): swax cannot tell whether it "
                f"changes the computation; pass --ignore-field {key} if it does not"
            )


def swax_config_from_xlstm(hf: dict, ignore: tuple[str, ...] = (), **overrides) -> SwaxConfig:
    """The SwaxConfig of the transformers xLSTM config ``hf`` (a config.json's dict); keys as
    :func:`check_keys` says. ``overrides`` set other fields (the window, or the add-SWA
    pattern). Missing keys take transformers' defaults (xLSTM 7B's)."""
    check_keys(hf, ignore)
    hf = dict(hf)
    for alias, key in ALIASES.items():
        if hf.get(key) is None and hf.get(alias) is not None:
            hf[key] = hf[alias]  # as transformers' xLSTMConfig fills one from the other
    # null is no value for the mapped keys (transformers refuses it): _number names it
    hf = {k: v for k, v in hf.items() if v is not None or k in MAPPED}
    ints = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads")
    ints += ("chunk_size", "ffn_round_up_to_multiple_of")
    fields = {}
    for key, name in MAPPED.items():
        if key in hf:
            fields[name] = _number(hf, key, int if key in ints else float)
    for key in ("gate_soft_cap", "output_logit_soft_cap", "eps", "norm_eps"):
        if key in hf and fields[MAPPED[key]] <= 0:
            raise ConfigError(f"xLSTM config field {key}={hf[key]!r} must be > 0")
    d = fields.get("d_model", 4096)
    heads = fields.get("recurrent_heads", 8)
    v_dim = int(d * fields.get("v_dim_factor", 1.0))
    if "head_dim" in hf and hf["head_dim"] not in (v_dim // heads, None):
        raise ConfigError(
            f"xLSTM config field head_dim={hf['head_dim']!r} differs from the value head width "
            f"v_dim_factor · hidden_size / num_heads = {v_dim // heads}"
        )
    fields["n_heads"] = heads if d % heads == 0 else 1  # attention heads: none in pattern X
    try:
        return SwaxConfig.preset("xlstm-7b", **{**fields, **overrides})
    except ConfigError as e:
        raise ConfigError(f"the xLSTM config cannot be built in swax: {e}") from None


def xlstm_config_from_swax(cfg: SwaxConfig, hidden: int) -> dict:
    """The transformers xLSTM config.json of the pure-mLSTM SwaxConfig ``cfg`` whose SwiGLU
    width is ``hidden``; ConfigError saying why when transformers' xLSTM cannot express it."""
    why = None
    if set(cfg.layer_types) != {"X"}:
        why = f"its layer pattern {cfg.layer_pattern!r} has other layers than mLSTM (X)"
    elif cfg.mlstm_conv_size:
        why = f"its mLSTM layers have a convolution (mlstm_conv_size={cfg.mlstm_conv_size})"
    elif not cfg.logit_soft_cap:
        why = "it has no logit cap (logit_soft_cap), which xLSTM always applies"
    elif not cfg.gate_soft_cap:
        why = "it has no gate cap (gate_soft_cap=0), which xLSTM always applies"
    if why:
        raise ConfigError(f"transformers' xLSTM cannot express this model: {why}")
    ratio, multiple = cfg.mlp_ratio, cfg.mlp_multiple_of
    if swiglu_hidden_dim(cfg.d_model, ratio, multiple, "xlstm") != hidden:
        ratio = hidden / cfg.d_model  # the width itself, which the formula keeps
        if swiglu_hidden_dim(cfg.d_model, ratio, multiple, "xlstm") != hidden:
            raise ConfigError(
                f"transformers' xLSTM cannot express this model: no ffn_proj_factor gives its "
                f"MLP width {hidden}"
            )
    heads = cfg.recurrent_heads or cfg.n_heads
    # transformers' xLSTMCache sizes its states by the widths rounded up to multiples of 64 and
    # fails on others: such a model generates without the cache (a full forward per token)
    widths = (int(cfg.d_model * cfg.qk_dim_factor), int(cfg.d_model * cfg.v_dim_factor))
    cache = all(w % 64 == 0 for w in widths)
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["xLSTMForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "embedding_dim": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_blocks": cfg.n_layers,
        "num_heads": heads,
        "use_bias": False,
        "add_out_norm": True,
        "tie_word_embeddings": False,
        "norm_eps": cfg.norm_eps,
        "eps": cfg.mlstm_eps,
        "qk_dim_factor": cfg.qk_dim_factor,
        "v_dim_factor": cfg.v_dim_factor,
        "chunk_size": cfg.chunk_size,
        "ffn_proj_factor": ratio,
        "ffn_round_up_to_multiple_of": multiple,
        "gate_soft_cap": cfg.gate_soft_cap,
        "output_logit_soft_cap": cfg.logit_soft_cap,
        "weight_mode": "single",
        "mode": "inference",
        "chunkwise_kernel": "chunkwise--native_autograd",
        "sequence_kernel": "native_sequence__native",
        "step_kernel": "native",
        "autocast_kernel_dtype": "float32",
        "inference_state_dtype": "float32",
        "use_cache": cache,
    }

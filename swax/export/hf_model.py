"""Hugging Face ``transformers`` classes for swax models (needs ``pip install transformers``).

A folder written by ``swax export hf`` holds ``configuration_swax.py`` and ``modeling_swax.py``,
two one-line files importing :class:`SwaxHFConfig` and :class:`SwaxForCausalLM` from here, named
in its ``config.json`` ``auto_map``. So ``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`` (and ``lm_eval --model hf``) loads it with the installed swax's code
and nothing imported first.

The wrapper's weights are the SwaxLM's own modules (``embed``, ``blocks``, ``norm``, ``head``),
so its state dict has the same names as swax's ``model.safetensors``: one file serves both.
Generation carries swax's constant-size :class:`~swax.model.SwaxState` under the model keyword
``swax_state`` (not ``past_key_values``/``cache``, whose API changes between transformers
versions): :meth:`SwaxForCausalLM.prepare_inputs_for_generation` feeds only the tokens the state
has not consumed, and :meth:`SwaxForCausalLM._update_model_kwargs_for_generation` carries the
state from step to step, with the token ids it has consumed (``swax_seen``): when a search
reorders, drops or copies sequences between steps (beam search), each sequence's state is found
by its prefix and moved with it (:meth:`SwaxState.select_rows`), so beam search gives what it
gives without a cache. Padded batches are refused (the recurrent state would consume the
padding): generate one sequence at a time or sequences of equal length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from swax.config import SwaxConfig
from swax.model import SwaxLM
from swax.state import SwaxState

MODEL_TYPE = "swax"
SWAX_FIELDS = tuple(SwaxConfig.__dataclass_fields__)


class SwaxHFConfig(PretrainedConfig):
    """The fields of a :class:`~swax.config.SwaxConfig`, as a transformers config."""

    model_type = MODEL_TYPE
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
    }

    def __init__(self, **kwargs):
        defaults = SwaxConfig().to_dict()
        for name in SWAX_FIELDS:
            value = kwargs.pop(name, defaults[name])
            setattr(self, name, list(value) if isinstance(value, tuple) else value)
        kwargs.setdefault("tie_word_embeddings", False)  # swax ties inside the model itself
        super().__init__(**kwargs)

    def to_swax(self) -> SwaxConfig:
        """The SwaxConfig these fields describe (validated)."""
        return SwaxConfig.from_dict({name: getattr(self, name) for name in SWAX_FIELDS})


@dataclass
class SwaxCausalLMOutput(ModelOutput):
    """Logits (B, T, vocab), the loss when labels were given, and the decode state when asked."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    swax_state: SwaxState | None = None
    swax_seen: torch.Tensor | None = None
    """The token ids ``swax_state`` has consumed, one row per sequence (generation only)."""


def _check_mask(attention_mask, generating: bool) -> None:
    """Padding swax can compute: none, or (without a decode state) on the right only."""
    if attention_mask is None or bool(attention_mask.all()):
        return
    if generating:
        raise ValueError(
            "swax models generate without padding (the recurrent state would consume it): "
            "generate one sequence at a time, or a batch of sequences of equal length"
        )
    if not bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all()):
        raise ValueError(
            "swax models take no padding inside a sequence or on the left (the recurrent state "
            "would consume it): pad on the right"
        )


class SwaxForCausalLM(PreTrainedModel, GenerationMixin):
    """A :class:`~swax.model.SwaxLM` behind the transformers causal-LM interface."""

    config_class = SwaxHFConfig
    base_model_prefix = "swax"  # no such attribute: the weights carry no prefix
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _is_stateful = True  # transformers 4.x: no DynamicCache, no assisted decoding
    _supports_cache_class = False

    def __init__(self, config: SwaxHFConfig):
        super().__init__(config)
        lm = SwaxLM(config.to_swax())
        # the SwaxLM's modules become this model's own, so the weight names match swax's
        self.embed, self.blocks, self.norm, self.head = lm.embed, lm.blocks, lm.norm, lm.head
        object.__setattr__(self, "_lm", lm)  # not registered twice as a submodule
        self.post_init()

    @property
    def swax_model(self) -> SwaxLM:
        """The SwaxLM sharing this model's weights."""
        return self._lm

    def _init_weights(self, module):
        pass  # SwaxLM initialises itself; loaded checkpoints overwrite every weight

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the state travels as swax_state, not in a transformers Cache

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = self._lm.embed = value

    def get_output_embeddings(self):
        return self.head

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        swax_state: SwaxState | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        return_dict: bool | None = None,
        swax_seen: torch.Tensor | None = None,
        **kwargs,
    ):
        if input_ids is None:
            raise ValueError("swax models take input_ids (inputs_embeds are not supported)")
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("swax models take input_ids, not inputs_embeds")
        want_state = bool(use_cache) or swax_state is not None
        _check_mask(attention_mask, want_state)
        keep = logits_to_keep if isinstance(logits_to_keep, int) and logits_to_keep > 0 else None
        if want_state:
            logits, state = self._lm(
                input_ids, state=swax_state, return_state=True, logits_to_keep=keep
            )
        else:
            logits, state = self._lm(input_ids, logits_to_keep=keep), None
        loss = None
        if labels is not None:
            shift = logits[:, :-1].float()
            loss = F.cross_entropy(
                shift.reshape(-1, shift.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        out = SwaxCausalLMOutput(loss=loss, logits=logits, swax_state=state, swax_seen=swax_seen)
        return out if return_dict is not False else out.to_tuple()

    def prepare_inputs_for_generation(
        self, input_ids, swax_state=None, attention_mask=None, swax_seen=None, **kwargs
    ):
        if swax_state is not None:
            swax_state = _follow_sequences(swax_state, swax_seen, input_ids)
            full, input_ids = input_ids, input_ids[:, swax_state.pos :]  # only what is new
        else:
            full = input_ids
        use_cache = kwargs.get("use_cache", True) is not False
        inputs = {
            "input_ids": input_ids,
            "swax_state": swax_state,
            "attention_mask": attention_mask,
            "use_cache": use_cache,
            "swax_seen": full if use_cache else None,
        }
        if kwargs.get("logits_to_keep") is not None:
            inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        model_kwargs = super()._update_model_kwargs_for_generation(
            outputs, model_kwargs, *args, **kwargs
        )
        model_kwargs["swax_state"] = getattr(outputs, "swax_state", None)
        model_kwargs["swax_seen"] = getattr(outputs, "swax_seen", None)
        return model_kwargs


def _follow_sequences(state: SwaxState, seen: torch.Tensor | None, input_ids) -> SwaxState:
    """``state`` with its rows in the order of ``input_ids``' sequences: row i takes the state
    of the sequence whose consumed ids (``seen``) are the first ``state.pos`` ids of row i. A
    search that kept the order gets the state back untouched; one whose sequence matches no
    state is an error (the state cannot be rebuilt here)."""
    prefix = input_ids[:, : state.pos]
    if seen is None or (seen.shape == prefix.shape and bool((seen == prefix).all())):
        return state
    same = (prefix[:, None, :] == seen[None, :, : state.pos].to(prefix.device)).all(-1)
    if not bool(same.any(1).all()):
        raise ValueError(
            "swax decode state: a sequence in this generation step continues none of the "
            "sequences the state holds"
        )
    return state.select_rows(same.int().argmax(1))


def register() -> None:
    """Register the classes with transformers' Auto classes under model_type "swax" (for
    folders without ``auto_map``; exported folders do not need it)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(MODEL_TYPE, SwaxHFConfig, exist_ok=True)
    AutoModelForCausalLM.register(SwaxHFConfig, SwaxForCausalLM, exist_ok=True)

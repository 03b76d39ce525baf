"""The initialisation schemes of SwaxLM (``SwaxConfig.init``), part by part.

A scheme is a list of (submodule name, what initialises that submodule), in the order it draws
random numbers: :meth:`swax.model.SwaxLM.init_parts` returns it, ``reset_parameters`` runs it,
and a sharded build (:func:`swax.train.distributed.build_sharded`) runs the same parts one at a
time, so its weights equal an unsharded build's of the same seed.

- ``swax``: Normal(0, init_std) embedding (and untied head); each block's norms, mixer and MLP by
  their own ``reset_parameters``, the projections that write to the residual stream at out_std
  = init_std / sqrt(2 · n_layers) (GPT-2's scaling); norms at 1; the mixers' own gate and decay
  initialisations.
- ``xlstm``: what transformers' ``xLSTMPreTrainedModel._init_weights`` gives xLSTM 7B. The
  embedding, the head and the input projections Normal(0, sqrt(2 / (5 · d_model))) ("small
  init"); the mixers' output projections Normal(0, 2 / n_layers / sqrt(d_model)) and the MLP's
  down projection Normal(0, 2 / n_layers / sqrt(its width)) ("wang init"); the weights of the
  mLSTM's input, forget and output gates and of the MLP's gate projection zero (transformers
  zeroes every linear layer whose name holds "gate"); the mLSTM gate biases from
  ``mlstm_igate_bias_init`` and ``mlstm_fgate_bias_init`` (−10 and 3 … 6 in the ``xlstm-7b``
  preset, as transformers sets them); norms at 1. Layers xLSTM does not have (attention, Gated
  DeltaNet) follow the same rules by role: input projections small, output projection wang,
  their own special parameters (decay, convolution) as in ``swax``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

Part = tuple[str, Callable[[nn.Module], None]]


def _normal(std: float) -> Callable[[nn.Module], None]:
    return lambda m: nn.init.normal_(m.weight, std=std)


def _zero(m: nn.Module) -> None:
    nn.init.zeros_(m.weight)


def _reset(m: nn.Module) -> None:
    m.reset_parameters()


def init_parts(model) -> list[Part]:
    """The parts of ``model`` (a SwaxLM) under its config's ``init`` scheme."""
    if model.config.init == "xlstm":
        return xlstm_parts(model)
    return swax_parts(model)


def swax_parts(model) -> list[Part]:
    """swax's own scheme (see the module docstring)."""
    std = model.config.init_std
    out_std = std / math.sqrt(2 * model.config.n_layers)
    parts: list[Part] = [("embed", _normal(std))]
    for i, block in enumerate(model.blocks):
        parts += [(f"blocks.{i}.{n}", init) for n, init in block.init_parts(std, out_std)]
    parts.append(("norm", _reset))
    if model.head is not None:
        parts.append(("head", _normal(std)))
    return parts


GATES = ("igate", "fgate", "ogate")
"""The mLSTM's gate projections, whose weights the xlstm scheme zeroes."""


def _xlstm_mixer(small: float, out_std: float) -> Callable[[nn.Module], None]:
    def init(mixer: nn.Module) -> None:
        mixer.reset_parameters(small, out_std)  # input projections small, output wang, specials
        for name in GATES:
            gate = getattr(mixer, name, None)
            if isinstance(gate, nn.Linear):
                nn.init.zeros_(gate.weight)

    return init


def xlstm_parts(model) -> list[Part]:
    """transformers' xLSTM scheme (see the module docstring)."""
    cfg = model.config
    small = math.sqrt(2 / (5 * cfg.d_model))

    def wang(fan: int) -> float:
        return 2 / cfg.n_layers / math.sqrt(fan)

    parts: list[Part] = [("embed", _normal(small))]
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}"
        parts += [
            (f"{p}.mixer_norm", _reset),
            (f"{p}.mixer", _xlstm_mixer(small, wang(cfg.d_model))),
            (f"{p}.mlp_norm", _reset),
            (f"{p}.mlp.gate", _zero),
            (f"{p}.mlp.up", _normal(small)),
            (f"{p}.mlp.down", _normal(wang(block.mlp.down.in_features))),
        ]
    parts.append(("norm", _reset))
    if model.head is not None:
        parts.append(("head", _normal(small)))
    return parts

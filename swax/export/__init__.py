"""Export a swax checkpoint for other tools: ``swax export hf`` and ``swax export onnx``.

- :func:`export_hf` writes a Hugging Face folder: swax's ``config.json`` fields plus
  ``model_type``/``auto_map``, the same ``model.safetensors``, two remote-code files that
  import :mod:`swax.export.hf_model`, and the tokenizer as ``tokenizer.json`` +
  ``tokenizer_config.json``. Neither
  transformers nor a network is needed to write it; loading it needs transformers and swax.
- :func:`export_onnx` traces a forward of fixed length and window with ``torch.onnx.export``
  (dynamo), the recurrent ops running their pure-torch reference backends.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from swax.core.errors import SwaxError
from swax.core.integrity import CHECKSUMS_NAME, write_checksum_file
from swax.core.paths import check_writable_dir
from swax.data.tokenizer import CONFIG_FILE, ByteTokenizer, HFTokenizer, load_model_tokenizer
from swax.model import CONFIG_NAME, WEIGHTS_NAME, SwaxLM
from swax.ops.gated_delta import plain_solve
from swax.ops.registry import forced_backends
from swax.version import __version__

_REMOTE_DOC = '"""Written by `swax export hf`: the classes come from the installed swax."""\n\n'
REMOTE_FILES = {
    "configuration_swax.py": _REMOTE_DOC
    + 'from swax.export.hf_model import SwaxHFConfig\n\n__all__ = ["SwaxHFConfig"]\n',
    "modeling_swax.py": _REMOTE_DOC
    + "from swax.export.hf_model import SwaxForCausalLM, SwaxHFConfig\n\n"
    + '__all__ = ["SwaxForCausalLM", "SwaxHFConfig"]\n',
}
"""The remote-code files of an exported folder (named in its config.json ``auto_map``)."""
AUTO_MAP = {
    "AutoConfig": "configuration_swax.SwaxHFConfig",
    "AutoModelForCausalLM": "modeling_swax.SwaxForCausalLM",
}
BYTE_EOT_TOKEN = "<|endoftext|>"
"""The special token of id 256 in the exported byte-level tokenizer."""


HF_OUTPUTS = (
    CONFIG_NAME,
    WEIGHTS_NAME,
    CHECKSUMS_NAME,
    *REMOTE_FILES,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
"""The files ``swax export hf`` writes (what ``--overwrite`` may replace)."""


def _check_out_dir(
    out: Path,
    what: str,
    overwrite: bool = False,
    outputs: tuple[str, ...] = HF_OUTPUTS,
    command: str = "swax export hf",
    source: tuple[str, Path] | None = None,
) -> None:
    """A new or empty folder that files can be written in, or with ``overwrite`` one holding
    only an earlier output of ``command`` (file names in ``outputs``), and never the folder it
    is made from (``source``: its name in the command and its path). Checked before any work;
    nothing is removed here."""
    if out.exists() and not out.is_dir():
        raise SwaxError(f"{what} {out} exists and is not a folder")
    if source is not None and out.resolve() == Path(source[1]).resolve():
        raise SwaxError(
            f"{what} {out} is {source[0]}, the folder it is made from; choose another "
            "(nothing was overwritten)"
        )
    held = sorted(q.name for q in out.iterdir()) if out.is_dir() else []
    if held and not overwrite:
        raise SwaxError(
            f"{what} {out} exists and is not empty (nothing was overwritten; --overwrite "
            f"replaces an earlier {command.split()[1]} there)"
        )
    foreign = [name for name in held if name not in outputs]
    if foreign:
        raise SwaxError(
            f"{what} {out} holds files {command} does not write (e.g. {foreign[0]}); "
            "choose an empty or new folder (nothing was overwritten)"
        )
    check_writable_dir(out, what)


def _swap_in(tmp: Path, out: Path) -> None:
    """Move the complete folder ``tmp`` to ``out``: a new name, or in place of an empty folder
    or an earlier output (checked by :func:`_check_out_dir`), which goes once ``tmp`` is there."""
    os.chmod(tmp, 0o777 & ~_umask())
    if not out.is_dir():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    os.replace(out, old / "x")
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old / "x", out)  # the earlier output back in its place
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)


def byte_level_hf_tokenizer():
    """A ``tokenizers.Tokenizer`` equal to swax's ByteTokenizer: each UTF-8 byte is the token of
    the same id (0-255), and ``<|endoftext|>`` is the special token 256."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins of the bytes
    byte_char = _bytes_to_unicode()
    assert sorted(alphabet) == sorted(byte_char.values())
    vocab = {byte_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BYTE_EOT_TOKEN])
    assert tok.token_to_id(BYTE_EOT_TOKEN) == 256
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (what ByteLevel uses)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _write_tokenizer(tok, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json readable by AutoTokenizer and by swax's
    load_model_tokenizer (its keys "type", "name", "eot_token" live in the same file)."""

    if isinstance(tok, ByteTokenizer):
        byte_level_hf_tokenizer().save(str(out / "tokenizer.json"))
        eot, swax_keys = BYTE_EOT_TOKEN, {"type": "byte", "name": "byte"}
    elif isinstance(tok, HFTokenizer):
        tok.tokenizer.save(str(out / "tokenizer.json"))
        eot = tok.eot_token
        swax_keys = {"type": "bpe", "name": tok.name, "eot_token": eot}
        if "/" in tok.name or os.sep in tok.name:  # the path it was read from: not written
            del swax_keys["name"]
    else:
        raise SwaxError(f"cannot export a tokenizer of type {type(tok).__name__}")
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eot,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
        **swax_keys,
    }
    (out / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": eot}, indent=2) + "\n")


def _weights_dtype(path: Path) -> str:
    """The dtype of the stored weights, as transformers names it in config.json."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        first = next(iter(f.keys()))
        code = f.get_slice(first).get_dtype()
    return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(code, "float32")


def export_hf(
    model_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Write the Hugging Face folder of the swax checkpoint ``model_dir`` to ``out_dir`` (which
    must not exist or be empty; with ``overwrite`` it may hold an earlier export, replaced once
    the new one is complete). The folder is built under a temporary name and renamed, so a
    failure leaves nothing behind. Returns ``out_dir``."""

    model_dir, out = Path(model_dir), Path(out_dir)
    _check_out_dir(out, "OUT_DIR", overwrite, source=("MODEL_DIR", model_dir))
    model = SwaxLM.from_pretrained(model_dir)  # checks the folder, checksum and weights
    tok = load_model_tokenizer(model_dir)
    if tok.vocab_size > model.config.vocab_size:
        raise SwaxError(
            f"the tokenizer of {model_dir} has {tok.vocab_size} ids but the model only "
            f"{model.config.vocab_size}"
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        config = {
            **model.config.to_dict(),
            "swax_version": __version__,
            "model_type": "swax",
            "architectures": ["SwaxForCausalLM"],
            "auto_map": AUTO_MAP,
            "tie_word_embeddings": False,  # swax ties inside the model
            "eos_token_id": tok.eot_id,
            "dtype": _weights_dtype(model_dir / WEIGHTS_NAME),
        }
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        shutil.copyfile(model_dir / WEIGHTS_NAME, tmp / WEIGHTS_NAME)
        write_checksum_file(tmp, [WEIGHTS_NAME])
        for name, text in REMOTE_FILES.items():
            (tmp / name).write_text(text)
        _write_tokenizer(tok, tmp)
        _swap_in(tmp, out)  # empty, or an earlier export (checked above): swapped out, then gone
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def portable_ops() -> Iterator[None]:
    """Within the block swax's ops run as plain tensor ops that exporters can translate: the
    mLSTM's autograd chunk form (not the ``swax::mlstm_chunk_fwd`` custom op), blockwise
    sliding-window attention, and Gated DeltaNet's triangular solve by forward substitution."""

    with forced_backends(mlstm="autograd", swa="blockwise"), plain_solve():
        yield


class _FixedWindowLM(torch.nn.Module):
    """input_ids (B, T) -> logits (B, T, vocab) at one fixed window."""

    def __init__(self, model, window):
        super().__init__()
        self.model, self.window = model, window

    def forward(self, input_ids):
        return self.model(input_ids, window=self.window)


ONNX_NOISE = ("torch.onnx._internal.exporter._registration",)
"""Loggers of torch.onnx that warn about things a swax user cannot act on (four lines of
"torchvision is not installed. Skipping torchvision::nms" and the like)."""


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """Only errors from the loggers ``names`` while the block runs."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export_onnx(
    model_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    seq_len: int = 128,
    window: int | None = None,
    batch_size: int = 1,
    overwrite: bool = False,
) -> Path:
    """Write the forward of the checkpoint ``model_dir`` as an ONNX graph: input ``input_ids``
    int64 (batch_size, seq_len), output ``logits`` float32 (batch_size, seq_len, vocab), at the
    attention window ``window`` (default: the model's). Shapes are fixed. The file is written
    under a temporary name and renamed; an existing ``out_path`` is an error unless
    ``overwrite`` (then it is replaced once the new graph is complete). Returns it."""

    out = Path(out_path)
    if out.is_dir():
        raise SwaxError(f"OUT {out} is a folder; give the path of the .onnx file to write")
    if out.exists() and not overwrite:
        raise SwaxError(
            f"OUT {out} already exists (nothing was overwritten; --overwrite replaces it)"
        )
    check_writable_dir(out.parent, f"OUT {out}: its folder")
    for name, v in (("--seq-len", seq_len), ("--batch-size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SwaxError(f"{name} must be a positive integer, got {v!r}")
    try:
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it)
    except ImportError:
        raise SwaxError(
            "swax export onnx needs the onnx and onnxscript packages (pip install onnx onnxscript)"
        ) from None
    model = SwaxLM.from_pretrained(model_dir).float()
    win = model.config.window if window is None else window
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with torch.no_grad(), portable_ops(), warnings.catch_warnings(), _quiet(ONNX_NOISE):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _FixedWindowLM(model, win).eval(),
                (ids,),
                str(tmp),
                dynamo=True,
                input_names=["input_ids"],
                output_names=["logits"],
                external_data=False,
                verbose=False,
            )
        os.replace(tmp, out)
    except SwaxError:
        raise
    except Exception as e:  # the exporter's errors are many kinds and many lines long
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SwaxError(f"torch.onnx.export failed for {model_dir}: {first}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return out

"""The tokenizer and the token ids through ``swax import xlstm`` and ``swax export xlstm``.

A transformers xLSTM folder names its token ids (bos, eos, pad) in config.json, which a
SwaxConfig does not hold: the import keeps them in ``token_ids.json`` beside the model and the
export writes them back. The tokenizer files travel as they are, so a transformers
``tokenizer_config.json`` keeps its bos and pad tokens. A source without tokenizer files stays
without: swax reads such a model's ids as bytes (the import says so), and the export writes no
tokenizer for it rather than a byte tokenizer the source never had.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swax.core.errors import CheckpointError, ConfigError, SwaxError
from swax.data.tokenizer import CONFIG_FILE, ByteTokenizer, HFTokenizer, load_model_tokenizer
from swax.export import _write_tokenizer

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
"""The tokenizer files carried from one folder to the other when present."""
TOKEN_IDS_NAME = "token_ids.json"
"""The source's token ids in an imported folder (the keys of :data:`TOKEN_ID_KEYS` it had)."""
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _is_token_id(value) -> bool:
    """An id as transformers' xLSTMConfig takes one: None, an int >= 0 or (eos) a list of them."""
    ints = value if isinstance(value, list) else [value]
    return value is None or all(type(v) is int and v >= 0 for v in ints)


def source_token_ids(hf: dict) -> dict:
    """The token ids of the xLSTM config ``hf`` (those it names); ConfigError naming a value
    that is not an id."""
    ids = {k: hf[k] for k in TOKEN_ID_KEYS if k in hf}
    for key, value in ids.items():
        if not _is_token_id(value) or (key != "eos_token_id" and isinstance(value, list)):
            raise ConfigError(f"xLSTM config field {key}={value!r} is not a token id")
    return ids


def token_ids(model_dir: Path, tok: ByteTokenizer | HFTokenizer | None) -> dict:
    """The token ids of the exported config: an imported folder's own (``token_ids.json``),
    else eos and pad the tokenizer's end-of-text id and no bos."""
    path = model_dir / TOKEN_IDS_NAME
    if not path.is_file():
        eot = None if tok is None else tok.eot_id
        return {"bos_token_id": None, "eos_token_id": eot, "pad_token_id": eot}
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    if not isinstance(ids, dict) or set(ids) - set(TOKEN_ID_KEYS):
        raise CheckpointError(f"{path} must hold a JSON object of {', '.join(TOKEN_ID_KEYS)}")
    try:
        return source_token_ids(ids)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


@dataclass
class TokenizerExport:
    """What the export writes for the tokenizer: ``write(folder)``; ``what`` says it."""

    tokenizer: ByteTokenizer | HFTokenizer | None
    what: str
    write: Callable[[Path], None]

    def __call__(self, folder: Path) -> None:
        self.write(folder)


WRITTEN = "tokenizer: tokenizer.json, tokenizer_config.json, special_tokens_map.json"
"""What a swax tokenizer becomes in a transformers folder (:func:`swax.export._write_tokenizer`)."""


def _writer(tok: ByteTokenizer | HFTokenizer) -> Callable[[Path], None]:
    return lambda folder: _write_tokenizer(tok, folder)


def _swax_tokenizer_config(model_dir: Path) -> bool:
    """Whether the folder's tokenizer_config.json is swax's own (save_tokenizer's, a trained
    run's), not a transformers one."""
    try:
        return "type" in json.loads((model_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return False


def export_tokenizer(model_dir: Path, vocab_size: int) -> TokenizerExport:
    """The tokenizer of the swax model folder ``model_dir`` for a transformers folder, checked
    against the model's ``vocab_size`` before anything is written: transformers tokenizer
    files copied as they are; swax's own written as tokenizer.json + tokenizer_config.json;
    none for a folder without tokenizer files that came from a transformers folder (its
    ``token_ids.json``) or whose model has fewer ids than bytes; else swax's byte tokenizer
    (how swax reads a folder without one)."""
    files = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    if not files:
        if (model_dir / TOKEN_IDS_NAME).is_file():
            why = "the transformers folder it came from had none"
        elif vocab_size < ByteTokenizer.vocab_size:
            why = f"bytes need {ByteTokenizer.vocab_size} ids, the model has {vocab_size}"
        else:
            tok = ByteTokenizer()
            return TokenizerExport(tok, f"{WRITTEN} (swax's byte tokenizer)", _writer(tok))
        return TokenizerExport(None, f"no tokenizer ({why})", lambda d: None)
    tok = load_model_tokenizer(model_dir)
    if tok.vocab_size > vocab_size:
        raise SwaxError(
            f"the tokenizer of {model_dir} has {tok.vocab_size} ids but the model only {vocab_size}"
        )
    if _swax_tokenizer_config(model_dir):
        return TokenizerExport(tok, WRITTEN, _writer(tok))

    def copy(folder: Path) -> None:
        for name in files:
            shutil.copyfile(model_dir / name, folder / name)

    return TokenizerExport(tok, f"tokenizer: {', '.join(files)}", copy)

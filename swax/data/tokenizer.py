"""Tokenizers. The byte-level tokenizer needs no files: ids 0-255 are bytes, 256 is <eot>."""

from __future__ import annotations


class ByteTokenizer:
    """UTF-8 bytes as token ids, plus an end-of-text id (256). vocab_size = 257."""

    name = "byte"
    eot_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

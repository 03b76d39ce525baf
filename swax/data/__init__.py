"""Tokenizers, sources, packing and synthetic retrieval episodes."""

from .tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer"]

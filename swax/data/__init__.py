"""Tokenizers, sources, packing and synthetic retrieval episodes."""

from swax.data.config import DataConfig, SyntheticConfig
from swax.data.episode import Episode
from swax.data.loader import IGNORE_INDEX, PackedLoader, TokenDataset, build_datasets
from swax.data.sources import iter_documents, kjv_documents
from swax.data.synthetic import KeyVocabulary, key_vocabulary, make_episode
from swax.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    load_model_tokenizer,
    load_tokenizer,
    save_tokenizer,
    tokenize_documents,
)

__all__ = [
    "IGNORE_INDEX",
    "ByteTokenizer",
    "DataConfig",
    "Episode",
    "HFTokenizer",
    "KeyVocabulary",
    "PackedLoader",
    "SyntheticConfig",
    "TokenDataset",
    "build_datasets",
    "iter_documents",
    "key_vocabulary",
    "kjv_documents",
    "load_model_tokenizer",
    "load_tokenizer",
    "make_episode",
    "save_tokenizer",
    "tokenize_documents",
]

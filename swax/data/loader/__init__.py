"""Tokenized datasets and the packed, shuffled, sharded, resumable loader.

A dataset is one flat token array: the documents' tokens with ``eot_id`` after each document.
:class:`PackedLoader` cuts it into sequences of ``seq_len + 1`` tokens that overlap by one token
(sequence i is ``tokens[i*seq_len : i*seq_len + seq_len + 1]``), so every next-token pair of the
stream is a training target exactly once and nothing is dropped: the last, partial sequence is
padded and its padded targets are -100 (ignored by ``cross_entropy``).

Each epoch is a seeded permutation of its items: the corpus sequences plus, when
``synthetic.fraction > 0``, that share of retrieval episodes. The loader reads the epochs as one
endless stream of items; a global micro-batch is ``micro_batch * world_size`` consecutive
items and rank r takes rows [r * micro_batch, (r + 1) * micro_batch). Its position (items
consumed) is the whole state, so a resumed loader continues exactly.

The package: :mod:`~swax.data.loader.datasets` (:class:`TokenDataset`, :func:`build_datasets`,
:func:`data_tokenizer`), :mod:`~swax.data.loader.packed` (:class:`PackedLoader`,
:func:`document_ids`, :data:`IGNORE_INDEX`).
"""

from swax.data.loader.datasets import TokenDataset, build_datasets, data_tokenizer
from swax.data.loader.packed import IGNORE_INDEX, PackedLoader, document_ids

__all__ = [
    "IGNORE_INDEX",
    "PackedLoader",
    "TokenDataset",
    "build_datasets",
    "data_tokenizer",
    "document_ids",
]

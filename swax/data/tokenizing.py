"""Documents to token ids, shared by the in-memory loader (:mod:`swax.data.loader`) and the
shard writer (:mod:`swax.data.prepare`): both tokenize the same way and split validation
documents off by the same hash, so a shard set holds what the loader would build in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from swax.data.tokenizer import ByteTokenizer


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

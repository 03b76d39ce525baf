"""Tokenized datasets: :class:`TokenDataset` (a flat token stream) and :func:`build_datasets`,
which tokenizes a source and splits off validation, or opens a shard set's memory-mapped
streams; :func:`data_tokenizer` is the tokenizer of a config's data."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from swax.core.errors import SwaxError
from swax.data.config import DataConfig
from swax.data.shards import is_shard_set, no_validation_reason, open_shard_set, shard_tokenizer
from swax.data.sources import iter_documents
from swax.data.tokenizer import is_validation_document, load_tokenizer, tokenize_documents

log = logging.getLogger("swax")


@dataclass
class TokenDataset:
    """A flat token stream: each document's tokens followed by ``eot_id``."""

    tokens: np.ndarray
    """int32 token ids, or a memory-mapped :class:`~swax.data.shards.ShardedTokens` stream."""
    eot_id: int
    """End-of-text id between documents."""
    num_documents: int
    """Documents in the stream (a token-level split may cut one)."""
    name: str = ""
    """Where the documents came from (for logs)."""
    tokenizer: Any = None
    """The tokenizer that made the tokens (used for synthetic episodes)."""

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (
            f"TokenDataset(name={self.name!r}, documents={self.num_documents}, "
            f"tokens={len(self.tokens)})"
        )


def build_datasets(
    cfg: DataConfig, tokenizer, seq_len: int, seed: int = 0
) -> tuple[TokenDataset, TokenDataset | None]:
    """(train, val) token datasets for ``cfg``.

    Validation is ``cfg.val_source`` when set, else the documents whose hash (with
    ``cfg.split_seed``) falls below ``cfg.val_fraction`` (None when val_fraction is 0). When that
    leaves validation with no document or fewer than ``seq_len + 1`` tokens (a corpus of one or a
    few files), the last ``max(val_fraction * tokens, seq_len + 1)`` tokens are held out instead.
    ``tokenizer`` may be None (then ``cfg.tokenizer`` is loaded). ``seed`` is the run seed; the
    split does not depend on it, so runs with different seeds share one validation set.
    """
    t0 = time.perf_counter()
    if seq_len < 1:
        raise SwaxError(f"seq_len must be >= 1, got {seq_len}")
    if is_shard_set(cfg.source):
        return _shard_datasets(cfg, tokenizer, seq_len)
    if tokenizer is None or isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer or cfg.tokenizer)
    need = seq_len + 1
    docs = list(iter_documents(cfg.source, cfg.format, cfg.field))
    n_docs = len(docs)
    train_tokens, train_docs, val, how = _split(cfg, docs, tokenizer, need)
    train = TokenDataset(train_tokens, tokenizer.eot_id, train_docs, cfg.source, tokenizer)
    for name, ds in (("training", train), ("validation", val)):
        if ds is not None and len(ds) < need:
            raise SwaxError(
                f"{name} data has {len(ds)} tokens, fewer than seq_len + 1 = {need} "
                f"(source {ds.name}); use a shorter seq_len or more data"
            )
    n_seq = math.ceil((len(train) - 1) / seq_len)
    log.info(
        "data: %s, %d documents, %s training tokens (%d sequences of %d), %s validation "
        "tokens; %s; tokenizer %s; %.1fs",
        cfg.source,
        n_docs,
        f"{len(train):,}",
        n_seq,
        seq_len,
        f"{len(val):,}" if val is not None else "no",
        how,
        tokenizer.name,
        time.perf_counter() - t0,
    )
    return train, val


def data_tokenizer(cfg: DataConfig):
    """The tokenizer of ``cfg``'s data: the one saved with a shard set, else ``cfg.tokenizer``."""
    if is_shard_set(cfg.source):
        return shard_tokenizer(cfg.source, cfg.tokenizer)
    return load_tokenizer(cfg.tokenizer)


def _shard_datasets(
    cfg: DataConfig, tokenizer, seq_len: int
) -> tuple[TokenDataset, TokenDataset | None]:
    """(train, val) of a shard set written by ``swax data prepare``: memory-mapped streams,
    validation from its val shards (the split was made when the shards were prepared)."""
    t0 = time.perf_counter()
    if cfg.val_source is not None:
        raise SwaxError(
            f"data.val_source={cfg.val_source!r} cannot be combined with the shard set "
            f"{cfg.source}: validation comes from its val shards (swax data prepare "
            "--val-fraction)"
        )
    tok = shard_tokenizer(cfg.source, None)
    if tokenizer is not None and not isinstance(tokenizer, str):
        if (tokenizer.eot_id, tokenizer.vocab_size) != (tok.eot_id, tok.vocab_size):
            raise SwaxError(
                f"tokenizer {tokenizer.name} does not match the one the shards in "
                f"{cfg.source} were made with ({tok.name})"
            )
        tok = tokenizer
    index, tr, va = open_shard_set(cfg.source)
    train = TokenDataset(tr.tokens, tok.eot_id, tr.documents, str(cfg.source), tok)
    val = None
    if va is None or len(va.tokens) == 0:
        log.warning(
            "data: the shard set %s has no validation data (%s); this run reports no "
            "validation loss",
            cfg.source,
            no_validation_reason(index) or "no val shards",
        )
    elif len(va.tokens) >= seq_len + 1:
        val = TokenDataset(va.tokens, tok.eot_id, va.documents, f"{cfg.source} (val)", tok)
    else:
        log.warning(
            "data: the %d validation tokens of %s are fewer than seq_len + 1; no validation",
            len(va.tokens),
            cfg.source,
        )
    if len(train) < seq_len + 1:
        raise SwaxError(
            f"training data has {len(train)} tokens, fewer than seq_len + 1 = {seq_len + 1} "
            f"(shard set {cfg.source}); use a shorter seq_len or more data"
        )
    log.info(
        "data: shard set %s, %d documents, %s training tokens in %d shards, %s validation "
        "tokens; tokenizer %s; %.1fs",
        cfg.source,
        index["documents"],
        f"{len(train):,}",
        len(tr.tokens.files),
        f"{len(val):,}" if val is not None else "no",
        tok.name,
        time.perf_counter() - t0,
    )
    return train, val


def _split(cfg: DataConfig, docs: list[str], tokenizer, need: int):
    """(training tokens, training documents, validation dataset or None, how it was split)."""
    if cfg.val_source is not None:
        val_docs = list(iter_documents(cfg.val_source, cfg.format, cfg.field))
        val = TokenDataset(
            tokenize_documents(val_docs, tokenizer),
            tokenizer.eot_id,
            len(val_docs),
            cfg.val_source,
            tokenizer,
        )
        return (
            tokenize_documents(docs, tokenizer),
            len(docs),
            val,
            f"validation from {cfg.val_source}",
        )
    if cfg.val_fraction <= 0:
        return tokenize_documents(docs, tokenizer), len(docs), None, "no validation set"
    is_val = [is_validation_document(d, cfg.val_fraction, cfg.split_seed) for d in docs]
    val_docs = [d for d, v in zip(docs, is_val) if v]
    tr_docs = [d for d, v in zip(docs, is_val) if not v]
    val_tokens = tokenize_documents(val_docs, tokenizer)
    if val_docs and tr_docs and len(val_tokens) >= need:
        val = TokenDataset(
            val_tokens, tokenizer.eot_id, len(val_docs), f"{cfg.source} (val)", tokenizer
        )
        return (
            tokenize_documents(tr_docs, tokenizer),
            len(tr_docs),
            val,
            f"{len(val_docs)} documents held out by hash",
        )
    # too few documents for a document-level split: hold out the stream's tail
    everything = tokenize_documents(docs, tokenizer)
    if len(everything) < 2 * need:
        raise SwaxError(
            f"{cfg.source} has {len(everything)} tokens in all, too few for training and "
            f"validation sequences of seq_len={need - 1} (+1 target) tokens each; use a "
            f"shorter seq_len, more data, or data.val_source"
        )
    n_val = min(max(math.ceil(cfg.val_fraction * len(everything)), need), len(everything))
    val = TokenDataset(everything[-n_val:], tokenizer.eot_id, 1, f"{cfg.source} (val)", tokenizer)
    return (
        everything[:-n_val],
        len(docs),
        val,
        f"last {n_val} tokens held out (too few documents to split by document)",
    )

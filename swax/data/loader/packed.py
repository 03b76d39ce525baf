"""The packed loader: :class:`PackedLoader` cuts a token stream into sequences, mixes in
synthetic retrieval episodes, orders each epoch by a seeded permutation, hands each rank its
rows of every micro-batch, and saves and restores its position; :func:`document_ids` gives
the document index of each token of packed rows."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from swax.core.errors import SwaxError
from swax.data.config import SyntheticConfig
from swax.data.episode import Episode
from swax.data.mqar import check_text_ids, resolve_mqar_ids
from swax.data.shards import ShardedTokens
from swax.data.synthetic import episode_overhead, make_episode

IGNORE_INDEX = -100
"""Target id of padding: ignored by torch.nn.functional.cross_entropy."""
_EPISODE_STREAM = 1
"""Seed-sequence tag of the synthetic episodes (the permutation uses 0)."""
_HAYSTACK_STREAM = 2
"""Seed-sequence tag of an episode's haystack window in a shard set."""


def _document_ids_np(x: np.ndarray, eot_id: int) -> np.ndarray:
    ids = np.zeros(len(x), np.int64)
    ids[1:] = np.cumsum(np.asarray(x[:-1]) == eot_id)
    return ids


def document_ids(x: torch.Tensor, eot_id: int) -> torch.Tensor:
    """(B, T) document index of each token of packed rows ``x``: a document ends with its
    end-of-text token, so the token after one starts the next document (each row's first token
    starts document 0). The ``doc_ids`` of :meth:`swax.SwaxLM.forward`."""
    ids = torch.zeros_like(x, dtype=torch.long)
    ids[:, 1:] = torch.cumsum(x[:, :-1] == eot_id, dim=1)
    return ids


class PackedLoader:
    """Packed sequences of a token stream, shuffled per epoch, sharded across ranks.

    With ``doc_mask`` every batch is ``(x, y, w, doc_ids)`` (w all ones unless weighted) and
    ``eval_batches`` yields ``(x, y, doc_ids)``: doc_ids (micro_batch, seq_len) from the
    end-of-text separators (:func:`document_ids`), an episode being one document.
    ``next_batch()`` returns ``(x, y)`` LongTensors of shape (micro_batch, seq_len) with
    ``y[:, t] = x[:, t + 1]`` within the stream and -100 where padded; with
    ``synthetic.answer_weight`` != 1 it returns ``(x, y, w)``, w the float32 loss weight of
    each target (the answer weight at episode answers, 1 elsewhere). ``synthetic`` (a
    SyntheticConfig) mixes retrieval episodes built from the dataset's own tokens into each
    epoch; they need the tokenizer (``tokenizer`` or ``dataset.tokenizer``). ``eval_batches``
    reads the dataset in fixed order (no shuffle, no episodes): make one loader per split.
    ``vocab_size`` (the model's) checks every id the loader hands out once, on the host: the
    whole stream when it is built, a shard set's rows and the episodes as they are read; an id
    >= vocab_size is a SwaxError naming it, so the model need not check each batch (a host sync
    per forward, :attr:`swax.SwaxLM.check_ids`).
    """

    def __init__(
        self,
        dataset,
        seq_len: int,
        micro_batch: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        synthetic: SyntheticConfig | None = None,
        tokenizer=None,
        doc_mask: bool = False,
        vocab_size: int | None = None,
    ):
        if dataset is None:
            raise SwaxError(
                "PackedLoader needs a dataset, got None (build_datasets returns no "
                "validation set when val_fraction is 0 and val_source is unset)"
            )
        tokens = dataset.tokens if hasattr(dataset, "tokens") else dataset
        # a shard set stays memory-mapped: sequences are read as they are needed
        self.tokens = tokens if isinstance(tokens, ShardedTokens) else np.asarray(tokens)
        if self.tokens.ndim != 1:
            raise SwaxError(f"expected a 1-D token stream, got shape {self.tokens.shape}")
        if seq_len < 1 or micro_batch < 1:
            raise SwaxError(
                f"seq_len and micro_batch must be >= 1, got {seq_len} and {micro_batch}"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise SwaxError(f"rank {rank} is not in [0, world_size={world_size})")
        if len(self.tokens) < 2:
            raise SwaxError(
                f"the token stream has {len(self.tokens)} tokens; packing needs at least 2"
            )
        if seed < 0:
            raise SwaxError(f"loader seed must be >= 0, got {seed}")
        if vocab_size is not None and vocab_size < 1:
            raise SwaxError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        if not isinstance(self.tokens, ShardedTokens):  # a shard set: as its rows are read
            self._check_vocab(self.tokens, "the training stream")
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.tokenizer = tokenizer if tokenizer is not None else getattr(dataset, "tokenizer", None)
        eot = getattr(dataset, "eot_id", None)
        if eot is None:
            eot = self.tokenizer.eot_id if self.tokenizer is not None else 0
        self.pad_id = int(eot)
        self.eot_id = int(eot)
        self.doc_mask = bool(doc_mask)
        self.synthetic = synthetic if synthetic is not None and synthetic.fraction > 0 else None
        self.corpus_sequences = math.ceil((len(self.tokens) - 1) / seq_len)
        self.synthetic_sequences = 0
        self.corpus_in_epoch = self.corpus_sequences
        """Corpus sequences in an epoch (all of them, or none when synthetic.fraction is 1)."""
        if self.synthetic is not None:
            if self.tokenizer is None:
                raise SwaxError(
                    "synthetic episodes need a tokenizer: pass tokenizer= to "
                    "PackedLoader or use a dataset from build_datasets"
                )
            f = self.synthetic.fraction
            if f >= 1:  # episodes only: an epoch is as many episodes as the corpus has sequences
                self.corpus_in_epoch = 0
                self.synthetic_sequences = self.corpus_sequences
            else:
                self.synthetic_sequences = max(1, round(self.corpus_sequences * f / (1 - f)))
            if self.synthetic.task == "mqar":
                # ids after the tokenizer's unless set; set ones must not occur in the text
                self.synthetic = resolve_mqar_ids(self.synthetic, self.tokenizer.vocab_size)
                text = self.corpus_in_epoch or self.synthetic.mqar_noise == 0
                check_text_ids(self.synthetic, self.tokens if text else [], self.tokenizer)
            need = episode_overhead(self.tokenizer, self.synthetic)
            if need > seq_len + 1:
                raise SwaxError(
                    f"seq_len {seq_len} is too short for synthetic episodes: they "
                    f"need about {need} tokens (needles, question, min_distance)"
                )
        self.consumed = 0
        self._perms: dict[int, np.ndarray] = {}

    # ---------------------------------------------------------------------------- sizes

    @property
    def sequences_per_epoch(self) -> int:
        """Items of an epoch: corpus sequences plus synthetic episodes."""
        return self.corpus_in_epoch + self.synthetic_sequences

    @property
    def tokens_per_epoch(self) -> int:
        """Target tokens (not counting padding) of an epoch, over all ranks."""
        corpus = len(self.tokens) - 1 if self.corpus_in_epoch else 0
        return corpus + self.synthetic_sequences * self.seq_len

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.world_size

    @property
    def batches_per_epoch(self) -> float:
        """Global batches per epoch (fractional: batches run across epoch boundaries)."""
        return self.sequences_per_epoch / self.global_batch

    @property
    def epoch(self) -> int:
        return self.consumed // self.sequences_per_epoch

    @property
    def position(self) -> int:
        """Items of the current epoch already consumed (over all ranks)."""
        return self.consumed % self.sequences_per_epoch

    # ---------------------------------------------------------------------------- items

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            rng = np.random.default_rng([self.seed, epoch, 0])
            # in place on int32 ids (the same order as rng.permutation(n), half the memory:
            # the one array that grows with the corpus, e.g. 8 MB for 1B tokens at seq 512)
            n = self.sequences_per_epoch
            perm = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
            rng.shuffle(perm)
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = perm
        return perm

    def _check_vocab(self, ids: np.ndarray, where: str, offset: int = 0) -> None:
        """SwaxError naming the first id of ``ids`` outside 0 … vocab_size - 1, its position
        (``offset`` + index) in ``where`` and the vocab size; nothing without a vocab_size."""
        if self.vocab_size is None or len(ids) == 0:
            return
        ids = np.asarray(ids)
        if int(ids.max()) < self.vocab_size and int(ids.min()) >= 0:
            return
        i = int(np.argmax((ids >= self.vocab_size) | (ids < 0)))
        raise SwaxError(
            f"token id {int(ids[i])} at position {offset + i} of {where} is out of range for "
            f"the model's vocab_size {self.vocab_size} (valid ids are 0 … {self.vocab_size - 1})"
        )

    def _corpus_row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        chunk = self.tokens[i * self.seq_len : i * self.seq_len + self.seq_len + 1]
        if isinstance(self.tokens, ShardedTokens):
            self._check_vocab(chunk, "the shard set", i * self.seq_len)
        x = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        y = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        n = len(chunk) - 1
        x[:n] = chunk[:-1]
        y[:n] = chunk[1:]
        return x, y

    def episode(self, epoch: int, index: int) -> Episode:
        """Synthetic episode ``index`` of ``epoch`` (seq_len + 1 tokens): a pure function of
        (seed, epoch, index)."""
        rng = np.random.default_rng([self.seed, epoch, index, _EPISODE_STREAM])
        return make_episode(
            rng,
            self.tokenizer,
            self._haystack(epoch, index),
            self.seq_len + 1,
            self.synthetic,
            split="train",
        )

    def _haystack(self, epoch: int, index: int) -> np.ndarray:
        """The episode's haystack: the whole stream in memory; for a memory-mapped shard set a
        window of it (a few sequences long) at a place drawn from (seed, epoch, index)."""
        if not isinstance(self.tokens, ShardedTokens):
            return self.tokens
        n = min(len(self.tokens), 8 * (self.seq_len + 1))
        rng = np.random.default_rng([self.seed, epoch, index, _HAYSTACK_STREAM])
        start = int(rng.integers(len(self.tokens) - n + 1))
        return self.tokens[start : start + n]

    @property
    def weighted(self) -> bool:
        """Whether batches carry per-target loss weights (``synthetic.answer_weight`` != 1)."""
        return self.synthetic is not None and self.synthetic.answer_weight != 1

    def _item(self, g: int) -> tuple[np.ndarray, ...]:
        item = self._raw_item(g)
        if not self.doc_mask:
            return item
        x, y, *w = item
        w = w[0] if w else np.ones(len(y), np.float32)
        epoch, pos = divmod(g, self.sequences_per_epoch)
        episode = int(self._perm(epoch)[pos]) >= self.corpus_in_epoch
        # an episode is one document whatever its filler holds; a corpus row splits after
        # every end-of-text token
        doc = np.zeros(len(x), np.int64) if episode else _document_ids_np(x, self.eot_id)
        return x, y, w, doc

    def _raw_item(self, g: int) -> tuple[np.ndarray, ...]:
        epoch, pos = divmod(g, self.sequences_per_epoch)
        idx = int(self._perm(epoch)[pos])
        if idx < self.corpus_in_epoch:
            x, y = self._corpus_row(idx)
            return (x, y, np.ones(len(y), np.float32)) if self.weighted else (x, y)
        ep = self.episode(epoch, idx - self.corpus_in_epoch)
        t = np.asarray(ep.tokens, np.int64)
        self._check_vocab(t, f"synthetic episode {idx - self.corpus_in_epoch} of epoch {epoch}")
        x, y = t[:-1], t[1:].copy()
        answer = np.zeros(len(t), dtype=bool)
        for a0, a1 in ep.answer_spans:
            answer[a0:a1] = True
        if self.synthetic.answers_only:  # supervise only the answers (targets are t[1:])
            keep = answer.copy()
            if self.synthetic.supervise_filler:  # MQAR: all but the pairs and the query keys
                keep[:] = True
                for a0, a1 in [*ep.question_spans, ep.needle_span]:
                    keep[a0:a1] = False
            y[~keep[1:]] = IGNORE_INDEX
        if not self.weighted:
            return x, y
        return x, y, np.where(answer[1:], self.synthetic.answer_weight, 1.0).astype(np.float32)

    def item_kinds(self, epoch: int) -> np.ndarray:
        """Per position of ``epoch``'s order: True where the item is a synthetic episode."""
        return self._perm(epoch) >= self.corpus_in_epoch

    @staticmethod
    def _stack(rows) -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(np.stack([r[j] for r in rows])) for j in range(len(rows[0])))

    # ---------------------------------------------------------------------------- batches

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the next global micro-batch: (x, y), each (micro_batch, seq_len)."""
        start = self.consumed + self.rank * self.micro_batch
        rows = [self._item(start + i) for i in range(self.micro_batch)]
        self.consumed += self.global_batch
        return self._stack(rows)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def eval_batches(
        self, max_batches: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's rows of the dataset's sequences in order (no shuffle, no episodes).

        Every rank yields the same number of batches of shape (micro_batch, seq_len); rows
        past the end are padding with all targets -100, so sum the loss over targets != -100
        (and all-reduce sum and count) rather than averaging per batch.
        """
        n = self.corpus_sequences
        total = math.ceil(n / self.global_batch)
        if max_batches is not None:
            total = min(total, max_batches)
        empty = (
            np.full(self.seq_len, self.pad_id, np.int64),
            np.full(self.seq_len, IGNORE_INDEX, np.int64),
        )
        for b in range(total):
            start = b * self.global_batch + self.rank * self.micro_batch
            rows = [
                self._corpus_row(i) if i < n else empty
                for i in range(start, start + self.micro_batch)
            ]
            if self.doc_mask:
                rows = [(x, y, _document_ids_np(x, self.eot_id)) for x, y in rows]
            yield self._stack(rows)

    # ---------------------------------------------------------------------------- state

    def state_dict(self) -> dict:
        """Small JSON-able position of the loader."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "consumed": self.consumed,
            "seq_len": self.seq_len,
            "sequences_per_epoch": self.sequences_per_epoch,
            "synthetic_sequences": self.synthetic_sequences,
            "num_tokens": int(len(self.tokens)),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue where the loader that wrote ``state`` stopped (same data and seq_len)."""
        for k in ("seq_len", "sequences_per_epoch", "num_tokens"):
            now = {
                "seq_len": self.seq_len,
                "sequences_per_epoch": self.sequences_per_epoch,
                "num_tokens": len(self.tokens),
            }[k]
            if k in state and int(state[k]) != now:
                raise SwaxError(
                    f"data loader state does not match the data: saved {k}={state[k]}, now {now}"
                )
        self.seed = int(state["seed"])
        self._perms = {}
        self.consumed = int(state["epoch"]) * self.sequences_per_epoch + int(state["position"])

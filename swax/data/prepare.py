"""``swax data prepare``: tokenize a source's documents into a shard set (the format and the
reader are in :mod:`swax.data.shards`).

Documents are tokenized in batches of :data:`BATCH_DOCS` in worker processes; the results are
written in batch order, so the output does not depend on the number of workers. An interrupted
prepare resumes: completed shards are recorded in ``progress.json`` together with, per split,
the first batch not yet entirely in them (and that split's token and document counts before
it); the rerun reads the documents again but tokenizes a batch only for the splits that still
need it, and writes the remaining shards byte for byte as an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from swax.core.errors import SwaxError
from swax.core.integrity import sha256_file
from swax.core.progress import progress_bar
from swax.core.signals import StopSignals
from swax.data.shards import (
    FORMAT,
    INDEX,
    PROGRESS,
    SPLITS,
    TOKENIZER_DIR,
    VERSION,
    shard_name,
    token_dtype,
)
from swax.data.sources import iter_documents
from swax.data.tokenizer import (
    is_validation_document,
    load_tokenizer,
    save_tokenizer,
    tokenize_documents,
)
from swax.data.workers import OrderedWorkers

log = logging.getLogger("swax")

BATCH_DOCS = 256
"""Documents per tokenization batch (recorded in the settings: a resume needs the same)."""
DEFAULT_SHARD_TOKENS = 100_000_000


class _ShardWriter:
    """Appends tokens of one split to fixed-size shard files (``.tmp`` until complete)."""

    def __init__(self, folder: Path, split: str, shard_tokens: int, dtype: np.dtype, on_done):
        self.folder, self.split, self.shard_tokens, self.dtype = folder, split, shard_tokens, dtype
        self.on_done = on_done  # called with (split, shard record) after a shard is renamed
        self.index = 0
        self.fill = 0
        self.fh = None
        self.sha = None

    def _open(self) -> None:
        self.tmp = self.folder / (shard_name(self.split, self.index) + ".tmp")
        self.fh = open(self.tmp, "wb")
        self.sha = hashlib.sha256()

    def write(self, tokens: np.ndarray) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        pos = 0
        while pos < len(tokens):
            if self.fh is None:
                self._open()
            take = min(len(tokens) - pos, self.shard_tokens - self.fill)
            block = tokens[pos : pos + take].tobytes()
            self.fh.write(block)
            self.sha.update(block)
            self.fill += take
            pos += take
            if self.fill == self.shard_tokens:
                self._finish()

    def _finish(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        name = shard_name(self.split, self.index)
        os.replace(self.tmp, self.folder / name)
        record = {"file": name, "tokens": self.fill, "sha256": self.sha.hexdigest()}
        self.fh, self.sha, self.fill = None, None, 0
        self.index += 1
        self.on_done(self.split, record)

    def close(self) -> None:
        """Finish the last, partial shard (if any tokens are in it)."""
        if self.fh is not None and self.fill:
            self._finish()
        elif self.fh is not None:
            self.fh.close()
            self.tmp.unlink(missing_ok=True)
            self.fh = None


_WORKER: dict = {}


def _init_worker(spec: str, val_fraction: float, split_seed: int) -> None:
    _WORKER.update(tok=load_tokenizer(spec), val_fraction=val_fraction, split_seed=split_seed)


def _tokenize_batch(job: tuple[list[str], tuple[str, ...]] | None) -> dict | None:
    """{split: (tokens, documents)} of a batch of documents for the splits named in the job,
    each document's tokens followed by the end-of-text id; None for no job."""
    if job is None:
        return None
    docs, need = job
    tok, f, seed = _WORKER["tok"], _WORKER["val_fraction"], _WORKER["split_seed"]
    is_val = [f > 0 and is_validation_document(d, f, seed) for d in docs]
    out = {}
    for split in need:
        part = [d for d, v in zip(docs, is_val) if v == (split == "val")]
        out[split] = (tokenize_documents(part, tok), len(part))
    return out


def _batches(source, fmt, field) -> Iterator[list[str]]:
    batch: list[str] = []
    for doc in iter_documents(source, fmt, field):
        batch.append(doc)
        if len(batch) == BATCH_DOCS:
            yield batch
            batch = []
    if batch:
        yield batch


def _atomic_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _is_ours(p: Path) -> bool:
    n = p.name
    return n in (INDEX, PROGRESS, TOKENIZER_DIR, INDEX + ".tmp", PROGRESS + ".tmp") or (
        n.startswith(SPLITS) and (n.endswith(".bin") or n.endswith(".bin.tmp"))
    )


def prepare_shards(
    source: str,
    out: str | Path,
    tokenizer: str = "byte",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    workers: int = 1,
    val_fraction: float = 0.02,
    split_seed: int = 0,
    fmt: str = "auto",
    field: str = "text",
    overwrite: bool = False,
    progress: bool = True,
    stop: StopSignals | None = None,
    _stop_after_shards: int | None = None,
) -> dict:
    """Tokenize ``source``'s documents into a shard set in ``out``; returns the index.

    Validation documents are chosen by the same hash as the in-memory loader
    (:func:`swax.data.tokenizer.is_validation_document` with ``val_fraction`` and
    ``split_seed``). An existing complete set is an error unless ``overwrite``; an interrupted
    one (``progress.json``) with the same settings is resumed. With ``stop`` (a
    :class:`~swax.core.signals.StopSignals` the caller entered, as ``swax data prepare`` does), a
    SIGINT/SIGTERM stops the work after the current batch, with the finished shards and
    ``progress.json`` consistent, and raises KeyboardInterrupt. ``_stop_after_shards``
    simulates an interruption (tests).
    """
    _check_options(shard_tokens, workers, val_fraction)
    out = Path(out).expanduser()
    tok = load_tokenizer(tokenizer)
    spec = tokenizer
    if tokenizer.lower() not in ("byte", "gpt2", "gpt-2"):
        spec = str(Path(tokenizer).expanduser().resolve())
    dtype = token_dtype(tok.vocab_size)
    settings = _settings(source, fmt, field, spec, shard_tokens, val_fraction, split_seed)
    state = _start(out, settings, overwrite)
    save_tokenizer(tok, out / TOKENIZER_DIR)
    prog = _Progress(out, settings, state, _stop_after_shards)
    writers = {s: _ShardWriter(out, s, shard_tokens, dtype, prog.record) for s in SPLITS}
    for s in SPLITS:
        writers[s].index = len(prog.done[s])
    bar = None
    if progress:
        bar = progress_bar(None, "tokenizing", "doc")
    pool = _start_workers(workers, tokenizer, val_fraction, split_seed)
    try:
        _write_batches(_results(source, fmt, field, prog.start, pool), prog, writers, bar, stop)
    except _Interrupted:
        for s in SPLITS:
            if writers[s].fh is not None:
                writers[s].fh.close()
        if stop is not None and stop.signum:
            raise KeyboardInterrupt from None
        return {}
    finally:
        if pool is not None:
            pool.close()
        if bar is not None:
            bar.close()

    index = make_index(tok, spec, dtype, shard_tokens, settings, prog.done, prog.n_docs)
    if not prog.done["train"]:
        raise SwaxError(f"{source}: every document went to validation; lower --val-fraction")
    _atomic_json(out / INDEX, index)
    (out / PROGRESS).unlink(missing_ok=True)
    return index


def _check_options(shard_tokens: int, workers: int, val_fraction: float) -> None:
    if shard_tokens < 1:
        raise SwaxError(f"--shard-tokens must be >= 1, got {shard_tokens}")
    if workers < 1:
        raise SwaxError(f"--workers must be >= 1, got {workers}")
    if not 0 <= val_fraction < 1:
        raise SwaxError(f"--val-fraction must be in [0, 1), got {val_fraction}")


def _settings(source, fmt, field, spec, shard_tokens, val_fraction, split_seed) -> dict:
    """What determines the output (in the index, and compared on a resume)."""
    return {
        "source": str(source)
        if str(source) in ("kjv", "pystdlib")
        else str(Path(source).expanduser().resolve()),
        "format": fmt,
        "field": field,
        "tokenizer": spec,
        "shard_tokens": shard_tokens,
        "val_fraction": val_fraction,
        "split_seed": split_seed,
        "batch_docs": BATCH_DOCS,
    }


class _Progress:
    """The shards finished so far and, per split, where a rerun resumes; each finished shard
    is recorded in ``progress.json``."""

    def __init__(self, out: Path, settings: dict, state: dict, stop_after: int | None):
        self.out, self.settings, self.stop_after = out, settings, stop_after
        self.done = {s: list(state["shards"][s]) for s in SPLITS}
        # Per split, the resume point: batches before "batch" are entirely in finished shards
        # of that split, which hold "tokens" tokens of it and "docs" of its documents before
        # that batch.
        self.resume = {s: dict(state["resume"][s]) for s in SPLITS}
        self.start = {s: dict(self.resume[s]) for s in SPLITS}
        self.written = {s: sum(r["tokens"] for r in self.done[s]) for s in SPLITS}
        # tokens and documents of s before the current batch
        self.pos = {s: self.resume[s]["tokens"] for s in SPLITS}
        self.n_docs = {s: self.resume[s]["docs"] for s in SPLITS}
        # (batch, tokens of s up to its end, documents of s up to its end) of batches past
        # resume[s]
        self.pending = {s: deque() for s in SPLITS}

    def add(self, split: str, k: int, toks: np.ndarray, docs: int) -> np.ndarray:
        """Count batch ``k``'s ``toks`` and ``docs`` of ``split``; returns the tokens still to
        write (those not already in finished shards)."""
        self.pending[split].append((k, self.pos[split] + len(toks), self.n_docs[split] + docs))
        cut = max(0, min(len(toks), self.written[split] - self.pos[split]))
        self.pos[split] += len(toks)
        self.n_docs[split] += docs
        return toks[cut:]

    def record(self, split: str, rec: dict) -> None:
        """A shard of ``split`` is finished (the writers' ``on_done``)."""
        self.done[split].append(rec)
        flushed = sum(r["tokens"] for r in self.done[split])
        q = self.pending[split]
        while q and q[0][1] <= flushed:
            k, end, docs = q.popleft()
            self.resume[split] = {"batch": k + 1, "tokens": end, "docs": docs}
        _atomic_json(
            self.out / PROGRESS,
            {"settings": self.settings, "shards": self.done, "resume": self.resume},
        )
        if self.stop_after is not None and sum(map(len, self.done.values())) >= self.stop_after:
            raise _Interrupted


def _start_workers(workers: int, tokenizer: str, val_fraction: float, split_seed: int):
    """The tokenizing worker processes (None for one process, which is then set up here)."""
    if workers > 1 and not OrderedWorkers.available():
        log.warning("--workers: this platform cannot fork; tokenizing in one process")
        workers = 1
    if workers == 1:
        _init_worker(tokenizer, val_fraction, split_seed)
        return None
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the workers are the parallelism
    try:
        return OrderedWorkers(
            workers, _tokenize_batch, _init_worker, (tokenizer, val_fraction, split_seed)
        )
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _results(source, fmt, field, start, pool) -> Iterator[tuple[int, dict | None, int]]:
    """(batch number, {split: (tokens, documents)} of the splits it still needs or None,
    documents in the batch), in batch order; split s needs the batches from
    ``start[s]["batch"]`` on."""
    sizes: deque = deque()

    def jobs():
        for k, docs in enumerate(_batches(source, fmt, field)):
            need = tuple(s for s in SPLITS if k >= start[s]["batch"])
            sizes.append(len(docs))
            yield (docs, need) if need else None

    done_batches = map(_tokenize_batch, jobs()) if pool is None else pool.map(jobs())
    for k, res in enumerate(done_batches):
        yield k, res, sizes.popleft()


def _write_batches(results, prog: _Progress, writers: dict, bar, stop) -> None:
    """Write the tokenized batches to the shard writers in order, then finish the last shards;
    raises _Interrupted after the current batch once ``stop`` has caught a signal."""
    for k, res, n in results:
        if bar is not None:
            bar.update(n)
        for split, (toks, docs) in (res or {}).items():
            writers[split].write(prog.add(split, k, toks, docs))
        if stop is not None and stop.signum:
            raise _Interrupted
    for s in SPLITS:
        writers[s].close()


def make_index(tok, spec: str, dtype, shard_tokens: int, settings: dict, shards, documents):
    """The ``index.json`` object of a shard set: ``shards`` and ``documents`` map each split
    ("train", "val") to its shard records ({file, tokens, sha256}) and document count."""
    index = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": np.dtype(dtype).name,
        "eot_id": tok.eot_id,
        "tokenizer": {
            "name": tok.name,
            "spec": spec,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "folder": TOKENIZER_DIR,
        },
        "shard_tokens": shard_tokens,
        "source": settings.get("source"),
        "settings": settings,
        "documents": sum(documents[s] for s in SPLITS),
    }
    for s in SPLITS:
        index[s] = {
            "documents": documents[s],
            "tokens": sum(r["tokens"] for r in shards[s]),
            "shards": list(shards[s]),
        }
    return index


def write_index(folder: str | Path, index: dict) -> None:
    """Write ``index.json`` (atomically: its presence marks a complete shard set)."""
    _atomic_json(Path(folder) / INDEX, index)


class _Interrupted(Exception):
    pass


def _start(out: Path, settings: dict, overwrite: bool) -> dict:
    """The progress to resume from (empty for a fresh start), after checking ``out``."""
    fresh = {
        "shards": {s: [] for s in SPLITS},
        "resume": {s: {"batch": 0, "tokens": 0, "docs": 0} for s in SPLITS},
    }
    if out.exists() and not out.is_dir():
        raise SwaxError(f"--out {out} exists and is not a folder")
    if not out.exists():
        out.mkdir(parents=True)
        return fresh
    entries = list(out.iterdir())
    foreign = [p for p in entries if not _is_ours(p)]
    if foreign:
        raise SwaxError(
            f"--out {out} holds files that are not a swax shard set (e.g. {foreign[0].name}); "
            "choose an empty or new folder"
        )
    if (out / INDEX).exists() and not overwrite:
        raise SwaxError(
            f"--out {out} already holds a prepared shard set; pass --overwrite to replace it"
        )
    if overwrite:
        for p in entries:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return fresh
    if not (out / PROGRESS).is_file():
        return fresh
    try:
        prog = json.loads((out / PROGRESS).read_text())
    except (OSError, ValueError) as e:
        raise SwaxError(
            f"cannot read {out / PROGRESS}: {e}; pass --overwrite to start over"
        ) from None
    if not isinstance(prog, dict) or not {"settings", "shards", "resume"} <= prog.keys():
        raise SwaxError(f"{out / PROGRESS} is not a swax progress file; pass --overwrite")
    if prog.get("settings") != settings:
        diff = [k for k in settings if prog.get("settings", {}).get(k) != settings[k]]
        raise SwaxError(
            f"--out {out} holds an interrupted prepare with other settings ({', '.join(diff)}); "
            "pass --overwrite to start over, or the same settings to resume"
        )
    for s in SPLITS:
        for r in prog["shards"][s]:
            f = out / r["file"]
            if not f.is_file() or sha256_file(f) != r["sha256"]:
                raise SwaxError(
                    f"shard {f} recorded in {out / PROGRESS} is missing or changed; "
                    "pass --overwrite to start over"
                )
    log.info("resuming: %d shards already written", sum(len(v) for v in prog["shards"].values()))
    return prog

"""Pre-tokenized token shards: ``swax data prepare`` writes them, training reads them
(``data.source=DIR``) with constant memory.

A shard set is a folder::

    DIR/index.json          what is there (written last: its presence marks a complete set)
    DIR/train_000000.bin    raw token ids, ``shard_tokens`` per file (the last may be shorter)
    DIR/val_000000.bin      the validation documents' tokens, likewise
    DIR/tokenizer/          the tokenizer (tokenizer_config.json [+ tokenizer.json])
    DIR/progress.json       while preparing: the shards finished so far (removed at the end)

Each ``.bin`` file is a flat little-endian array of ``uint16`` (vocabulary <= 65,536) or
``uint32`` ids with no header, readable with ``numpy.memmap(path, dtype, mode="r")``, as in
nanoGPT / llm.c. The split's stream is every document's tokens followed by the end-of-text id,
in source order, cut into shards at fixed token counts (a document may straddle two shards);
the training loader reads the shards of a split as one stream.

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
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SwaxError
from ..integrity import sha256_file
from ..signals import StopSignals
from .sources import iter_documents
from .tokenizer import load_model_tokenizer, load_tokenizer, save_tokenizer
from .tokenizing import is_validation_document, tokenize_documents
from .workers import OrderedWorkers

log = logging.getLogger("swax")

INDEX = "index.json"
PROGRESS = "progress.json"
TOKENIZER_DIR = "tokenizer"
FORMAT = "swax-token-shards"
VERSION = 1
BATCH_DOCS = 256
"""Documents per tokenization batch (recorded in the settings: a resume needs the same)."""
DEFAULT_SHARD_TOKENS = 100_000_000
SPLITS = ("train", "val")


def is_shard_set(source) -> bool:
    """Whether ``source`` is a folder holding a shard set's ``index.json``."""
    if not isinstance(source, str | os.PathLike) or str(source) == "kjv":
        return False
    p = Path(source).expanduser()
    return p.is_dir() and (p / INDEX).is_file()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def shard_name(split: str, i: int) -> str:
    return f"{split}_{i:06d}.bin"


# --------------------------------------------------------------------------------- reading


def read_index(folder: str | Path) -> dict:
    """The parsed ``index.json`` of a shard set, checked for the fields the loader needs."""
    path = Path(folder).expanduser() / INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SwaxError(f"cannot read shard index {path}: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise SwaxError(f"{path} is not a swax shard index (expected format {FORMAT!r})")
    if index.get("version") != VERSION:
        raise SwaxError(
            f"{path}: shard format version {index.get('version')!r} is not supported "
            f"(expected {VERSION})"
        )
    for key in ("dtype", "eot_id", "tokenizer", "train", "val"):
        if key not in index:
            raise SwaxError(f"{path}: no field {key!r}")
    return index


class ShardedTokens:
    """The token stream of one split of a shard set, read from the shard files on demand.

    Behaves as a read-only 1-D array for what the loader needs: ``len()``, slices
    ``[a:b]`` (step 1; int64 copies of just those tokens, across shard boundaries) and single
    indices. Reads are positioned reads (``os.pread``) of just the requested bytes into a fresh
    array, not ``numpy.memmap``: a memory map's read-ahead maps ~1 MB of file pages into the
    process per random access, and those pages count in its RSS and stay mapped, so RSS would
    creep towards the corpus size over a long run; read pages here live in the kernel's page
    cache only. At most :attr:`MAX_OPEN` shard files are open at a time.
    """

    MAX_OPEN = 64

    def __init__(self, folder: str | Path, shards: list[dict], dtype: str):
        self.folder = Path(folder)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.files = [self.folder / s["file"] for s in shards]
        self.sizes = np.array([int(s["tokens"]) for s in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        for f, n in zip(self.files, self.sizes):
            if not f.is_file():
                raise SwaxError(f"shard {f} listed in {self.folder / INDEX} is missing")
            size = f.stat().st_size
            if size != n * self.dtype.itemsize:
                raise SwaxError(
                    f"shard {f} has {size} bytes, expected {n * self.dtype.itemsize} "
                    f"({n} {self.dtype.name} tokens, as {self.folder / INDEX} says)"
                )
        self._fds: dict[int, int] = {}  # shard -> open file descriptor (insertion = LRU order)
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    ndim = 1

    def _fd(self, i: int) -> int:
        if self._pid != os.getpid():  # forked (e.g. a DataLoader worker): do not share offsets
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.pop(i, None)
        if fd is None:
            if len(self._fds) >= self.MAX_OPEN:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = os.open(self.files[i], os.O_RDONLY)
        self._fds[i] = fd
        return fd

    def _pread(self, i: int, lo: int, n: int) -> np.ndarray:
        size = self.dtype.itemsize
        data = os.pread(self._fd(i), n * size, lo * size)
        if len(data) != n * size:
            raise SwaxError(f"shard {self.files[i]} is shorter than its index says")
        return np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __del__(self):
        try:
            if self._pid == os.getpid():
                self.close()
        except Exception:
            pass

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) as int64 (clipped to the stream, like a slice)."""
        n = len(self)
        start, stop = max(0, min(start, n)), max(0, min(stop, n))
        out = np.empty(max(0, stop - start), dtype=np.int64)
        pos = start
        while pos < stop:
            i = int(np.searchsorted(self.starts, pos, side="right")) - 1
            lo = pos - int(self.starts[i])
            take = min(stop - pos, int(self.sizes[i]) - lo)
            out[pos - start : pos - start + take] = self._pread(i, lo, take)
            pos += take
        return out

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise SwaxError("sharded token streams support slices with step 1 only")
            return self.read(start, stop)
        i = int(key)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"token index {key} out of range for {len(self)} tokens")
        return int(self.read(i, i + 1)[0])

    def __array__(self, dtype=None, copy=None):
        """The whole stream in memory (for small splits only, e.g. in evaluation)."""
        a = self.read(0, len(self))
        return a.astype(dtype) if dtype is not None else a

    def __repr__(self) -> str:
        return f"ShardedTokens({self.folder}, {len(self.files)} shards, {len(self)} tokens)"


def shard_tokenizer(folder: str | Path, requested: str | None = None):
    """The tokenizer saved with a shard set; ``requested`` (data.tokenizer) must name it,
    unless it is the default "byte" (which then means "whatever the shards were made with")."""
    folder = Path(folder).expanduser()
    index = read_index(folder)
    info = index["tokenizer"]
    tok = load_model_tokenizer(folder / TOKENIZER_DIR)
    if tok.eot_id != index["eot_id"] or tok.vocab_size != info.get("vocab_size"):
        raise SwaxError(
            f"the tokenizer in {folder / TOKENIZER_DIR} (eot {tok.eot_id}, vocabulary "
            f"{tok.vocab_size}) does not match {folder / INDEX}"
        )
    if requested not in (None, "byte", info.get("name"), info.get("spec")):
        raise SwaxError(
            f"data.tokenizer={requested!r} but the shards in {folder} were made with "
            f"{info.get('spec')!r}; leave data.tokenizer unset or set it to that"
        )
    return tok


@dataclass
class ShardSplit:
    tokens: ShardedTokens
    documents: int


def open_shard_set(folder: str | Path) -> tuple[dict, ShardSplit, ShardSplit | None]:
    """(index, training split, validation split or None) of a shard set."""
    folder = Path(folder).expanduser()
    index = read_index(folder)
    out = []
    for split in SPLITS:
        part = index[split]
        if not part.get("shards"):
            out.append(None)
            continue
        out.append(
            ShardSplit(ShardedTokens(folder, part["shards"], index["dtype"]), part["documents"])
        )
    if out[0] is None:
        raise SwaxError(f"shard set {folder} has no training shards")
    return index, out[0], out[1]


# --------------------------------------------------------------------------------- writing


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
    (:func:`swax.data.tokenizing.is_validation_document` with ``val_fraction`` and
    ``split_seed``). An existing complete set is an error unless ``overwrite``; an interrupted
    one (``progress.json``) with the same settings is resumed. With ``stop`` (a
    :class:`~swax.signals.StopSignals` the caller entered, as ``swax data prepare`` does), a
    SIGINT/SIGTERM stops the work after the current batch, with the finished shards and
    ``progress.json`` consistent, and raises KeyboardInterrupt. ``_stop_after_shards``
    simulates an interruption (tests).
    """
    if shard_tokens < 1:
        raise SwaxError(f"--shard-tokens must be >= 1, got {shard_tokens}")
    if workers < 1:
        raise SwaxError(f"--workers must be >= 1, got {workers}")
    if not 0 <= val_fraction < 1:
        raise SwaxError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    out = Path(out).expanduser()
    tok = load_tokenizer(tokenizer)
    spec = tokenizer
    if tokenizer.lower() not in ("byte", "gpt2", "gpt-2"):
        spec = str(Path(tokenizer).expanduser().resolve())
    dtype = token_dtype(tok.vocab_size)
    settings = {
        "source": str(source) if str(source) == "kjv" else str(Path(source).expanduser().resolve()),
        "format": fmt,
        "field": field,
        "tokenizer": spec,
        "shard_tokens": shard_tokens,
        "val_fraction": val_fraction,
        "split_seed": split_seed,
        "batch_docs": BATCH_DOCS,
    }
    state = _start(out, settings, overwrite)
    save_tokenizer(tok, out / TOKENIZER_DIR)

    done = {s: list(state["shards"][s]) for s in SPLITS}
    # Per split, the resume point: batches before "batch" are entirely in finished shards of
    # that split, which hold "tokens" tokens of it and "docs" of its documents before that batch.
    resume = {s: dict(state["resume"][s]) for s in SPLITS}
    start = {s: dict(resume[s]) for s in SPLITS}
    written = {s: sum(r["tokens"] for r in done[s]) for s in SPLITS}
    pos = {s: resume[s]["tokens"] for s in SPLITS}  # tokens of s before the current batch
    n_docs = {s: resume[s]["docs"] for s in SPLITS}
    # (batch, tokens of s up to its end, documents of s up to its end) of batches past resume[s]
    pending = {s: deque() for s in SPLITS}

    def record(split: str, rec: dict) -> None:
        done[split].append(rec)
        flushed = sum(r["tokens"] for r in done[split])
        q = pending[split]
        while q and q[0][1] <= flushed:
            k, end, docs = q.popleft()
            resume[split] = {"batch": k + 1, "tokens": end, "docs": docs}
        _atomic_json(out / PROGRESS, {"settings": settings, "shards": done, "resume": resume})
        if _stop_after_shards is not None and sum(map(len, done.values())) >= _stop_after_shards:
            raise _Interrupted

    writers = {s: _ShardWriter(out, s, shard_tokens, dtype, record) for s in SPLITS}
    for s in SPLITS:
        writers[s].index = len(done[s])

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="tokenizing", unit="doc", file=sys.stderr, dynamic_ncols=True)
    pool = None
    if workers > 1 and not OrderedWorkers.available():
        log.warning("--workers: this platform cannot fork; tokenizing in one process")
        workers = 1
    if workers > 1:
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the workers are the parallelism
        try:
            pool = OrderedWorkers(
                workers, _tokenize_batch, _init_worker, (tokenizer, val_fraction, split_seed)
            )
        finally:
            if saved is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
    else:
        _init_worker(tokenizer, val_fraction, split_seed)

    def results() -> Iterator[tuple[int, dict | None, int]]:
        """(batch number, {split: (tokens, documents)} of the splits it still needs or None,
        documents in the batch), in batch order."""
        sizes: deque = deque()

        def jobs():
            for k, docs in enumerate(_batches(source, fmt, field)):
                need = tuple(s for s in SPLITS if k >= start[s]["batch"])
                sizes.append(len(docs))
                yield (docs, need) if need else None

        done_batches = map(_tokenize_batch, jobs()) if pool is None else pool.map(jobs())
        for k, res in enumerate(done_batches):
            yield k, res, sizes.popleft()

    try:
        for k, res, n in results():
            if bar is not None:
                bar.update(n)
            for split, (toks, docs) in (res or {}).items():
                pending[split].append((k, pos[split] + len(toks), n_docs[split] + docs))
                cut = max(0, min(len(toks), written[split] - pos[split]))
                pos[split] += len(toks)
                n_docs[split] += docs
                writers[split].write(toks[cut:])
            if stop is not None and stop.signum:
                raise _Interrupted
        for s in SPLITS:
            writers[s].close()
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

    index = make_index(tok, spec, dtype, shard_tokens, settings, done, n_docs)
    if not done["train"]:
        raise SwaxError(f"{source}: every document went to validation; lower --val-fraction")
    _atomic_json(out / INDEX, index)
    (out / PROGRESS).unlink(missing_ok=True)
    return index


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


def no_validation_reason(index: dict) -> str | None:
    """Why a shard set holds no validation tokens (None when it holds some)."""
    if index["val"]["tokens"] > 0:
        return None
    fraction = index.get("settings", {}).get("val_fraction", 0)
    if not fraction:
        return "it was prepared with --val-fraction 0"
    return (
        f"--val-fraction {fraction:g} put none of its {index['documents']:,} documents in "
        "validation (documents are split by a hash of their text, so a few documents may "
        "give none): prepare it again with more documents or a larger --val-fraction"
    )


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


def verify_shards(folder: str | Path, progress: bool = False) -> dict:
    """Check every shard of a set against its size and SHA-256 in the index (reads every
    byte; ``progress``: a bar on stderr). Returns {"shards", "tokens", "bytes"} checked; a
    missing, resized or changed shard is a SwaxError naming the first and counting the rest."""
    folder = Path(folder).expanduser()
    index = read_index(folder)
    itemsize = np.dtype(index["dtype"]).itemsize
    records = [r for s in SPLITS for r in index[s]["shards"]]
    total = sum(r["tokens"] for r in records) * itemsize
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="verifying", file=sys.stderr)
    bad = []
    try:
        for r in records:
            path = folder / r["file"]
            if not path.is_file():
                bad.append(f"{path} is missing")
            elif path.stat().st_size != r["tokens"] * itemsize:
                bad.append(
                    f"{path} holds {path.stat().st_size} bytes, not {r['tokens'] * itemsize}"
                )
            elif sha256_file(path) != r["sha256"]:
                bad.append(f"{path} does not match its SHA-256 in {INDEX}")
            if bar is not None:
                bar.update(r["tokens"] * itemsize)
    finally:
        if bar is not None:
            bar.close()
    if bad:
        more = f" (and {len(bad) - 1} more of {len(records)} shards)" if len(bad) > 1 else ""
        raise SwaxError(f"shard {bad[0]}{more}")
    return {"shards": len(records), "tokens": total // itemsize, "bytes": total}

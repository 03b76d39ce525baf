"""Pre-tokenized token shards: ``swax data prepare`` writes them (:mod:`swax.data.prepare`),
training reads them (``data.source=DIR``) with constant memory.

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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swax.core.errors import SwaxError
from swax.core.integrity import sha256_file
from swax.core.progress import progress_bar
from swax.data.tokenizer import load_model_tokenizer

INDEX = "index.json"
PROGRESS = "progress.json"
TOKENIZER_DIR = "tokenizer"
FORMAT = "swax-token-shards"
VERSION = 1
SPLITS = ("train", "val")


def is_shard_set(source) -> bool:
    """Whether ``source`` is a folder holding a shard set's ``index.json``."""
    if not isinstance(source, str | os.PathLike) or str(source) in ("kjv", "pystdlib"):
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
        bar = progress_bar(total, "verifying", "B", unit_scale=True)
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

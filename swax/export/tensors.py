"""Safetensors read and written one tensor at a time, for converting large checkpoints.

:class:`TensorFolder` reads the tensors of a folder (``model.safetensors``, or the shards that
``model.safetensors.index.json`` names, or every ``*.safetensors`` file) by name, their shapes
and dtypes from the headers alone (the format: an 8-byte little-endian header length, a JSON
header of names, dtypes, shapes and byte offsets, then the raw data); :func:`write_streamed`
writes a safetensors file from a list of (name, shape, dtype, function that makes the tensor),
holding one tensor at a time. Together they convert a 7B checkpoint with the memory of its
largest tensors, never a whole model (let alone two float32 copies): importing a 1.6 GB float32
xLSTM (d_model 2048, vocabulary 50304) peaked at 0.48 GB above the interpreter's own. Safetensors
only: nothing is unpickled.
"""

from __future__ import annotations

import json
import math
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from swax.core.errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

DTYPE_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
"""torch dtypes and their names in a safetensors header."""
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


@dataclass(frozen=True)
class Entry:
    """One tensor of a file to write: its name, shape and dtype, and what makes it (called
    once, when its turn comes)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


class TensorFolder:
    """The tensors of a folder's safetensors files, read by name (``with TensorFolder(p) as f``).

    The files are the shards named by ``model.safetensors.index.json`` when it is there, else
    ``model.safetensors``, else every ``*.safetensors`` file. Their headers are parsed here
    (JSON: names, dtypes, shapes, offsets, each checked against the file's size) and a tensor
    is read into memory of its own when asked for (``readinto``, no memory map), so the files'
    pages never pile up in the process: converting a folder holds the tensors being converted,
    not the folder. A name in two files, an index naming a missing file, or a file that is not
    safetensors is a CheckpointError naming it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._where: dict[str, tuple[Path, str, tuple[int, ...], int]] = {}
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        for path in self._files():
            self._read_header(path)

    def _files(self) -> list[Path]:
        index = self.folder / INDEX_NAME
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                names = sorted(set(weight_map.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{index} is not a safetensors index ({e})") from None
            missing = [n for n in names if not (self.folder / n).is_file()]
            if missing:
                raise CheckpointError(f"{index} names {missing[0]}, which is not in {self.folder}")
            return [self.folder / n for n in names]
        if (self.folder / SINGLE_NAME).is_file():
            return [self.folder / SINGLE_NAME]
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(
                f"{self.folder} holds no safetensors weights ({SINGLE_NAME}, {INDEX_NAME} or "
                "*.safetensors); pickled .bin checkpoints are not read"
            )
        return files

    def _read_header(self, path: Path) -> None:
        def bad(why: str) -> CheckpointError:
            return CheckpointError(f"{path} is corrupt or not a safetensors file ({why})")

        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < n <= min(size - 8, 1 << 30):
                raise bad("no header")
            try:
                header = json.loads(f.read(n))
            except (ValueError, UnicodeDecodeError) as e:
                raise bad(f"header: {e}") from None
        if not isinstance(header, dict):
            raise bad("header is not a JSON object")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                code, shape, (start, stop) = (
                    info["dtype"],
                    tuple(info["shape"]),
                    info["data_offsets"],
                )
                width = torch.empty(0, dtype=CODE_DTYPES[code]).element_size()
            except (KeyError, TypeError, ValueError):
                raise bad(f"entry {name!r}") from None
            if not 0 <= start <= stop <= size - 8 - n or stop - start != math.prod(shape) * width:
                raise bad(f"the offsets of {name!r}")
            if name in self._where:
                raise CheckpointError(f"tensor {name} is in two files of {self.folder}")
            self._where[name] = (path, code, shape, 8 + n + start)

    def __enter__(self) -> TensorFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._cache.clear()

    def names(self) -> list[str]:
        return list(self._where)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape, from the headers (no tensor is read)."""
        return {n: shape for n, (_, _, shape, _) in self._where.items()}

    def dtype(self, name: str) -> torch.dtype:
        return CODE_DTYPES[self._where[name][1]]

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name``; the last two read are kept (a fused tensor feeds several)."""
        if name not in self._cache:
            path, code, shape, offset = self._where[name]
            t = torch.empty(shape, dtype=CODE_DTYPES[code])
            if t.numel():
                buf = memoryview(t.view(-1).view(torch.uint8).numpy())
                with open(path, "rb") as f:
                    f.seek(offset)
                    if f.readinto(buf) != len(buf):
                        raise CheckpointError(f"{path} ends inside tensor {name}")
            self._cache[name] = t
            while len(self._cache) > 2:
                self._cache.popitem(last=False)
        return self._cache[name]


def _header(entries: Sequence[Entry], metadata: dict[str, str] | None) -> bytes:
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for e in entries:
        size = math.prod(e.shape) * torch.empty(0, dtype=e.dtype).element_size()
        header[e.name] = {
            "dtype": DTYPE_CODES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned


def write_streamed(
    path: str | Path, entries: Sequence[Entry], metadata: dict[str, str] | None = None
) -> None:
    """Write the safetensors file ``path`` from ``entries``, in their order, making and writing
    one tensor at a time. Each made tensor must have its entry's shape; it is cast to the
    entry's dtype."""
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError("write_streamed: two entries have the same name")
    header = _header(entries, metadata)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for e in entries:
            t = e.make()
            if tuple(t.shape) != tuple(e.shape):
                raise ValueError(f"{e.name}: made shape {tuple(t.shape)}, expected {e.shape}")
            t = t.detach().to("cpu", e.dtype).contiguous()
            if t.numel():
                f.write(memoryview(t.view(-1).view(torch.uint8).numpy()))

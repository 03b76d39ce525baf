"""Safetensors read and written one tensor at a time, for converting large checkpoints.

:class:`TensorFolder` reads the tensors of a folder (``model.safetensors``, or the shards that
``model.safetensors.index.json`` names, or every ``*.safetensors`` file) by name, their shapes
and dtypes from the headers alone; :func:`write_streamed` writes a safetensors file from a list
of (name, shape, dtype, function that makes the tensor), holding one tensor at a time. Together
they convert a 7B checkpoint with the memory of its largest tensor, never a whole model (let
alone two float32 copies). Safetensors only: nothing is unpickled.
"""

from __future__ import annotations

import json
import math
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
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
    ``model.safetensors``, else every ``*.safetensors`` file. A name in two files, an index
    naming a missing file, or a file that is not safetensors is a CheckpointError naming it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._stack = ExitStack()
        self._where: dict[str, object] = {}
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        try:
            for path in self._files():
                self._open(path)
        except BaseException:
            self._stack.close()
            raise

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

    def _open(self, path: Path) -> None:
        from safetensors import SafetensorError, safe_open

        try:
            handle = self._stack.enter_context(safe_open(str(path), "pt"))
            names = list(handle.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path} is corrupt or not a safetensors file ({e})") from None
        for name in names:
            if name in self._where:
                raise CheckpointError(f"tensor {name} is in two files of {self.folder}")
            self._where[name] = handle

    def __enter__(self) -> TensorFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._cache.clear()
        self._stack.close()

    def names(self) -> list[str]:
        return list(self._where)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape, from the headers (no tensor is read)."""
        return {n: tuple(h.get_slice(n).get_shape()) for n, h in self._where.items()}

    def dtype(self, name: str) -> torch.dtype:
        code = self._where[name].get_slice(name).get_dtype()
        if code not in CODE_DTYPES:
            raise CheckpointError(f"tensor {name} of {self.folder} has dtype {code}")
        return CODE_DTYPES[code]

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name``; the last two read are kept (a fused tensor feeds several)."""
        if name not in self._cache:
            self._cache[name] = self._where[name].get_tensor(name)
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

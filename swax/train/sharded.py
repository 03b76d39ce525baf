"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its own
shard of the weights and AdamW moments, and a checkpoint loads into any world size (DCP reshards
on load), a single process included.

Layout of a sharded ``step_000100/`` (written as ``step_000100.tmp/``, renamed when complete):

- ``shards/``: DCP's files, ``__<rank>_0.distcp`` (one per rank: tensors only) and
  ``.metadata`` (where each shard lies);
- ``optimizer.json``: AdamW's param groups and any non-tensor state (JSON, as in the full
  format);
- ``rng.safetensors``: rank 0's RNG state (written by :mod:`swax.train.checkpoint`, as in the
  full format);
- ``trainer.json``: as in the full format, written last, with the SHA-256 of every file above.

Nothing is unpickled beyond what DCP's own metadata needs, and that through an unpickler that
admits only DCP's metadata classes and torch's size, dtype, layout and memory-format names; the
tensors are read by DCP with ``torch.load(weights_only=True)``; no non-tensor item is saved
through DCP (its loader would unpickle it freely).
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import warnings
from pathlib import Path

import torch


def single_process(fn) -> dict:
    """``no_dist=True`` for a DCP call ``fn`` made without a process group, where it takes it
    (torch >= 2.3 for save and load); else nothing (DCP then assumes it and warns)."""
    import inspect

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return {}
    return {"no_dist": True} if "no_dist" in inspect.signature(fn).parameters else {}


@contextlib.contextmanager
def quiet():
    """DCP warns on every call without a process group, which is how one process uses it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


SHARDS = "shards"
SHARDED_FILES = ("optimizer.json", "rng.safetensors")
"""The files of a sharded checkpoint besides ``shards/`` whose SHA-256 ``trainer.json`` records."""

_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_ALLOWED = {
    ("torch", "Size"),
    ("torch", "device"),
    ("torch", "layout"),
    ("torch", "strided"),
    ("torch", "memory_format"),
    ("torch", "contiguous_format"),
    ("torch", "preserve_format"),
    ("torch.serialization", "_get_layout"),  # a layout by its name
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata dataclasses and torch's plain names (dtypes among them), nothing
    that could run code."""

    def find_class(self, module: str, name: str):
        if module in _ALLOWED_MODULES and not name.startswith("__"):
            return super().find_class(module, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a checkpoint's metadata")


def _reader(path: Path):
    """DCP's file reader, its metadata read by :class:`_MetadataUnpickler`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            meta_path = Path(self._get_metadata_path(rank))
            data = meta_path.read_bytes()
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def read_metadata(path: Path):
    """The DCP metadata of the sharded checkpoint ``path`` (read safely)."""
    return _reader(Path(path) / SHARDS).read_metadata()


def shard_files(path: Path) -> list[str]:
    """The names (relative to the checkpoint) of its DCP files, sorted."""
    root = Path(path) / SHARDS
    return sorted(f"{SHARDS}/{p.name}" for p in root.iterdir() if p.is_file())


def split_optimizer(optim_sd: dict) -> tuple[dict[str, dict], dict]:
    """An optimizer state dict as both checkpoint formats keep it: ({param fqn: {name: tensor}},
    the content of ``optimizer.json``: its param groups and non-tensor state {"fqn::name":
    value})."""
    tensors: dict[str, dict] = {}
    scalars = {}
    for fqn, st in optim_sd.get("state", {}).items():
        for name, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors.setdefault(fqn, {})[name] = value
            else:
                scalars[f"{fqn}::{name}"] = value
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
        for g in optim_sd.get("param_groups", [])
    ]
    return tensors, {"param_groups": groups, "scalars": scalars}


def join_optimizer(tensors: dict[str, dict], meta: dict) -> dict:
    """The optimizer state dict :func:`split_optimizer` split (``meta``: optimizer.json)."""
    state: dict[str, dict] = {fqn: dict(st) for fqn, st in tensors.items()}
    for key, value in meta.get("scalars", {}).items():
        fqn, name = key.split("::", 1)
        state.setdefault(fqn, {})[name] = value
    groups = meta["param_groups"]
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups}


def split_state(model, optimizer) -> tuple[dict, dict]:
    """(tensors for DCP: {"model": …, "optim": {fqn: {name: tensor}}}, the content of
    optimizer.json) of the sharded state dicts (DTensors under FSDP2, plain tensors in one
    process)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    optim, meta = split_optimizer(optim_sd)
    return {"model": model_sd, "optim": optim}, meta


def write_side_files(tmp: Path, meta: dict) -> None:
    """Rank 0's part of a sharded checkpoint besides the shards and the RNG state."""
    (tmp / "optimizer.json").write_text(json.dumps(meta))


def load_sharded(path: Path, model, optimizer) -> None:
    """Load the shards of ``path`` into ``model`` and ``optimizer`` (any world size). Raises
    what DCP raises on a mismatch (the caller names it)."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import set_state_dict

    tensors, _ = split_state(model, optimizer)
    with quiet():
        load(tensors, storage_reader=_reader(path / SHARDS), **single_process(load))
    meta = json.loads((path / "optimizer.json").read_text())
    set_state_dict(
        model,
        optimizer,
        model_state_dict=tensors["model"],
        optim_state_dict=join_optimizer(tensors["optim"], meta),
    )


def saved_model_shapes(path: Path) -> dict[str, torch.Tensor]:
    """{parameter name: a meta tensor of its global shape} of a sharded checkpoint, from its
    metadata alone (what :func:`swax.model.state_dict_mismatch` compares)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out = {}
    for key, md in read_metadata(path).state_dict_metadata.items():
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
            out[key[len("model.") :]] = torch.empty(md.size, device="meta")
    return out

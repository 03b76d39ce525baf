"""File integrity: SHA-256 checksums of saved weights, verified on load, file modes, and
whether a set of tensors fits a model's state dict.

Exported models carry ``checksums.sha256`` beside their files, in the format of ``sha256sum``
(``sha256sum -c checksums.sha256`` checks it by hand); training checkpoints keep theirs in
``trainer.json``. A mismatch is a :class:`~swax.core.errors.CheckpointError` naming the file, so a
flipped bit is an error instead of a model that silently prints garbage.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from swax.core.errors import CorruptCheckpointError

CHECKSUMS_NAME = "checksums.sha256"

__all__ = [
    "CHECKSUMS_NAME",
    "sha256_file",
    "checksums",
    "verify_checksums",
    "write_checksum_file",
    "verify_checksum_file",
    "match_umask",
    "state_dict_mismatch",
]


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checksums(folder: str | Path, names: list[str]) -> dict[str, str]:
    """{name: SHA-256} of the files ``names`` in ``folder``."""
    return {name: sha256_file(Path(folder) / name) for name in names}


def verify_checksums(folder: str | Path, expected: dict[str, str], what: str) -> None:
    """Raise CheckpointError naming the first file of ``folder`` whose SHA-256 differs from
    ``expected`` (or that is missing). ``what`` names the folder in the message."""
    folder = Path(folder)
    for name, digest in expected.items():
        path = folder / name
        if not path.is_file():
            raise CorruptCheckpointError(f"{what} is missing {name}, listed in its checksums")
        actual = sha256_file(path)
        if actual != digest:
            raise CorruptCheckpointError(
                f"{path} does not match its SHA-256 checksum (expected {digest[:16]}…, got "
                f"{actual[:16]}…): the file is corrupt or was changed after it was saved"
            )


def write_checksum_file(folder: str | Path, names: list[str]) -> Path:
    """Write ``folder/checksums.sha256`` for ``names`` (atomically, in sha256sum's format)."""
    folder = Path(folder)
    lines = "".join(f"{d}  {n}\n" for n, d in checksums(folder, names).items())
    tmp = folder / (CHECKSUMS_NAME + ".tmp")
    tmp.write_text(lines)
    match_umask(tmp)
    os.replace(tmp, folder / CHECKSUMS_NAME)
    return folder / CHECKSUMS_NAME


def read_checksum_file(folder: str | Path) -> dict[str, str] | None:
    """{name: SHA-256} from ``folder/checksums.sha256``; None when the folder has none."""
    path = Path(folder) / CHECKSUMS_NAME
    if not path.is_file():
        return None
    out = {}
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            raise CorruptCheckpointError(f"{path} line {i} is not '<sha256>  <file name>'")
        out[name.strip()] = digest.lower()
    return out


def verify_checksum_file(folder: str | Path, names: list[str] | None = None) -> bool:
    """Check the files listed in ``folder/checksums.sha256`` (only ``names`` when given).
    Returns False when the folder has no checksum file (an export from before checksums),
    True when every listed file matches; raises CheckpointError otherwise."""
    expected = read_checksum_file(folder)
    if expected is None:
        return False
    if names is not None:
        expected = {n: d for n, d in expected.items() if n in names}
    verify_checksums(folder, expected, f"model folder {folder}")
    return True


_UMASK: int | None = None


def match_umask(path: str | Path) -> None:
    """Give a file written by a library that creates it 0600 (safetensors does) the mode an
    ordinary ``open()`` would have: 0666 less the process umask, like the JSON files next to
    it."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    try:
        os.chmod(path, 0o666 & ~_UMASK)
    except OSError:
        pass


def state_dict_mismatch(expected: dict, found: dict) -> str | None:
    """How the tensors ``found`` (name -> tensor) differ from the state dict ``expected``, in
    one line (missing and unexpected names, the first shape that differs); None when they
    match in names and shapes."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    parts = []
    if missing:
        parts.append(
            f"{len(missing)} missing ({', '.join(missing[:3])}{' …' if len(missing) > 3 else ''})"
        )
    if unexpected:
        more = " …" if len(unexpected) > 3 else ""
        parts.append(f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])}{more})")
    for k, v in expected.items():
        if k in found and tuple(found[k].shape) != tuple(v.shape):
            parts.append(
                f"{k} has shape {tuple(found[k].shape)} where the model expects {tuple(v.shape)}"
            )
            break
    return "; ".join(parts) or None

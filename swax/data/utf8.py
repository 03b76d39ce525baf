"""Training text that is not valid UTF-8 is read anyway (each bad sequence becomes U+FFFD, as
``errors="replace"`` does), but never silently: a warning names the file and counts the bytes,
once per file and process."""

from __future__ import annotations

import sys
from pathlib import Path

_warned: set[str] = set()


def invalid_bytes(data: bytes) -> int:
    """The number of bytes of ``data`` that are not part of a valid UTF-8 sequence."""
    return len(data) - len(data.decode("utf-8", "ignore").encode("utf-8"))


def decode_replacing(data: bytes) -> tuple[str, int]:
    """(``data`` decoded with errors="replace", the number of invalid bytes replaced)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), invalid_bytes(data)


def warn_invalid(path: str | Path, count: int) -> None:
    """``warning: PATH: N bytes are not valid UTF-8 (replaced with U+FFFD)`` on stderr, once
    per file and process; nothing for ``count`` 0."""
    key = str(Path(path).resolve())
    if count <= 0 or key in _warned:
        return
    _warned.add(key)
    what = "1 byte is" if count == 1 else f"{count} bytes are"
    print(f"warning: {path}: {what} not valid UTF-8 (replaced with U+FFFD)", file=sys.stderr)


def read_text_replacing(path: str | Path) -> str:
    """The text of a file as UTF-8, invalid bytes replaced by U+FFFD and counted in a warning
    (:func:`warn_invalid`); line endings \\r\\n and \\r read as \\n, as in text mode."""
    text, bad = decode_replacing(Path(path).read_bytes())
    warn_invalid(path, bad)
    return text.replace("\r\n", "\n").replace("\r", "\n")

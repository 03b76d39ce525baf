"""JSON Lines: the one reader and writer of the JSONL files swax reads and writes (RULER records,
task data, corpora, training metrics)."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from swax.core.errors import SwaxError
from swax.data.utf8 import decode_replacing, warn_invalid

__all__ = ["iter_jsonl", "read_jsonl", "write_jsonl", "json_safe"]


def iter_jsonl(
    path: str | Path, hint: str = "", errors: str = "strict"
) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON Lines file (gzip-compressed when
    its name ends in ``.gz``). A missing or unreadable file and a line that is not JSON are
    SwaxErrors naming the path and line, followed by ``hint`` (e.g. the expected schema).
    ``errors``: how undecodable UTF-8 is handled: ``"strict"`` (an error naming the file) or
    ``"replace"`` (read anyway, U+FFFD in place of the bad bytes, and a warning naming the
    file and counting them)."""
    path = Path(path)
    tail = f"; {hint}" if hint else ""
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise SwaxError(f"JSONL file {path} {what}{tail}")
    opener = gzip.open if path.suffix == ".gz" else open
    bad = 0
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if errors == "replace":
                    line, n = decode_replacing(raw)
                    bad += n
                else:
                    try:
                        line = raw.decode("utf-8", errors)
                    except UnicodeDecodeError as e:
                        raise SwaxError(
                            f"{path}:{lineno}: not UTF-8 text (byte {e.start + 1} of the line: "
                            f"{e.reason}){tail}"
                        ) from None
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SwaxError(f"{path}:{lineno}: invalid JSON ({e.msg}){tail}") from None
                yield lineno, value
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise SwaxError(f"cannot read JSONL file {path}: {e}{tail}") from None
    warn_invalid(path, bad)


def read_jsonl(path: str | Path, required: Sequence[str] = ()) -> list[dict]:
    """The objects of a JSONL file (blank lines skipped). A missing file, a line that is not a
    JSON object, or one without a ``required`` field is a SwaxError naming the path and line."""
    records = []
    for lineno, rec in iter_jsonl(path):
        if not isinstance(rec, dict):
            raise SwaxError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        missing = [k for k in required if k not in rec]
        if missing:
            raise SwaxError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
        records.append(rec)
    return records


def write_jsonl(records: Iterable[dict], path: str | Path) -> Path:
    """One JSON object per line (UTF-8, non-ASCII kept); parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float (also inside lists and dicts) replaced by
    None, so that ``json.dumps(..., allow_nan=False)`` writes standard JSON (a bare ``NaN`` is
    not JSON: other tools reject the file)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value

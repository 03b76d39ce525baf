"""The records ``swax eval niah`` evaluates: lengths (``--lengths``), folders written by
``--dump`` (:func:`dump_records`, :func:`records_grid`), and every record of a run, generated
or read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from swax.core.errors import SwaxError
from swax.eval.ruler import TASKS, generate_niah, read_jsonl, write_jsonl

DEFAULT_LENGTHS = "4k,8k,16k,32k,65k,131k"
"""The lengths of ``swax eval niah`` when neither --lengths nor --records gives them."""


def dump_files() -> list[str]:
    """The files ``swax eval niah --dump`` writes (glob patterns): ``TASK-LENGTH.jsonl``."""

    return [f"{t}-[0-9]*.jsonl" for t in TASKS]


def parse_length(text: str | int) -> int:
    """'4k' -> 4096, '131k' -> 131072, '128k' -> 131072, '2000' -> 2000."""
    if isinstance(text, int):
        return text
    t = str(text).strip().lower()
    try:
        if t.endswith("k"):
            k = int(t[:-1])
            return 131072 if k in (128, 131) else 65536 if k == 65 else k * 1024
        if t.endswith("m"):
            return int(t[:-1]) * 1024 * 1024
        return int(t)
    except ValueError:
        raise SwaxError(f"cannot read length {text!r}; expected a number like 4096 or 4k") from None


def parse_lengths(text: str | Sequence, what: str = "lengths") -> list[int]:
    """A comma list of lengths ("4k,8k,2000"); an empty list, a length that is not a number
    and one below 1 are SwaxErrors naming ``what`` (e.g. "--lengths") and the value."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        lengths = [parse_length(x) for x in items if str(x).strip()]
    except SwaxError as e:
        raise SwaxError(f"{what}: {e}") from None
    if not lengths or any(n < 1 for n in lengths):
        raise SwaxError(f"{what} must be positive lengths in tokens (e.g. 4k,8k), got {text!r}")
    return lengths


def dumped_cells(folder: str | Path) -> dict[str, list[int]]:
    """{task: sorted lengths} of the ``TASK-LENGTH.jsonl`` files in a folder written by
    ``--dump`` (in RULER's task order; other files are ignored). A missing folder, or one
    without such files, is a SwaxError naming it."""

    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise SwaxError(f"--records {folder} {what} (expected a folder written by --dump)")
    found: dict[str, set[int]] = {}
    for p in folder.iterdir():
        task, _, length = p.name.removesuffix(".jsonl").rpartition("-")
        if p.name.endswith(".jsonl") and task in TASKS and length.isdigit() and p.is_file():
            found.setdefault(task, set()).add(int(length))
    if not found:
        raise SwaxError(
            f"--records {folder} holds no TASK-LENGTH.jsonl records (write them with "
            "swax eval niah --dump DIR)"
        )
    return {t: sorted(found[t]) for t in TASKS if t in found}


def records_grid(
    folder: str | Path, tasks: Sequence[str] | None = None, lengths: Sequence[int] | None = None
) -> tuple[list[str], list[int]]:
    """(tasks, lengths) to evaluate from a ``--dump`` folder: those of its records, or the
    given ones (which narrow them). Every task must have records at every length (the results
    are a full table); a missing file is a SwaxError naming it and what the folder holds."""
    cells = dumped_cells(folder)
    tasks = list(cells) if tasks is None else list(tasks)
    if lengths is None:
        lengths = sorted({n for t in tasks for n in cells.get(t, ())})
    missing = [f"{t}-{n}.jsonl" for t in tasks for n in lengths if n not in cells.get(t, ())]
    if missing or not lengths:
        held = "; ".join(f"{t} at {','.join(map(str, ns))}" for t, ns in cells.items())
        raise SwaxError(
            f"--records {folder} has no {missing[0] if missing else 'records of ' + tasks[0]} "
            f"(it holds {held}); pass --tasks and --lengths it holds"
        )
    return tasks, list(lengths)


def load_dumped(folder: Path, task: str, length: int) -> list[dict]:

    return read_jsonl(folder / f"{task}-{length}.jsonl")


def _all_records(
    tokenizer, tasks, lengths, samples, seed, haystack_text, key_split, records_dir
) -> dict[tuple[str, int], list[dict]]:
    """{(task, length): records}, generated or read from ``records_dir``."""

    records = {}
    for length in lengths:
        for task in tasks:
            if records_dir is not None:
                records[task, length] = load_dumped(Path(records_dir), task, length)[:samples]
            else:
                records[task, length] = generate_niah(
                    task,
                    length,
                    samples,
                    tokenizer,
                    seed=seed,
                    haystack_text=haystack_text,
                    key_split=key_split,
                )
    return records


def dump_records(
    out_dir: str | Path,
    tokenizer,
    tasks,
    lengths,
    samples: int,
    seed: int,
    haystack_text: str | None = None,
    key_split: str | None = None,
) -> list[Path]:
    """Write ``TASK-LENGTH.jsonl`` (RULER's format) for every task and length; no model."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in tasks:
        for n in lengths:
            recs = generate_niah(
                task,
                n,
                samples,
                tokenizer,
                seed=seed,
                haystack_text=haystack_text,
                key_split=key_split,
            )
            p = out / f"{task}-{n}.jsonl"
            write_jsonl(recs, p)
            paths.append(p)
    return paths

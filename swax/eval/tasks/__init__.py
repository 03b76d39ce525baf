"""Short-context tasks: multiple choice by log-likelihood, LAMBADA, and code (pass@1).

Numbers are comparable with EleutherAI's lm-evaluation-harness (``lm_eval``) runs on the same
data: the tasks, their data files, prompts and few-shot examples are those of
:mod:`swax.eval.tasks.specs`, scored as the harness scores a causal LM (:mod:`swax.eval.scoring`).
This module evaluates them: :func:`evaluate_task` / :func:`evaluate_tasks` with the settings of
a :class:`TaskEvalSettings`, and writes the results (:func:`format_table`,
:func:`write_results`).

Metrics: ``acc`` = argmax of the summed log-likelihood of each continuation's tokens given the
context; ``acc_norm`` = argmax of that sum divided by the character length of the answer text
(without the leading space, as the harness does); LAMBADA ``acc`` = greedy decoding reproduces
the last word's tokens exactly, ``perplexity`` = exp(-mean log-likelihood of the last word);
code ``pass@1`` with one greedy sample. ``*_stderr`` is the standard error of the mean.

Python API::

    from swax.eval.tasks import evaluate_tasks, load_model_and_tokenizer, format_table
    model, tok = load_model_and_tokenizer("runs/tiny/model")
    results = evaluate_tasks(model, tok, ["arc_easy", "piqa"], data_dir="data/")
    print(format_table(results))
    results["arc_easy"]["metrics"]["acc_norm"], results["arc_easy"]["records"][0]

    from swax.eval.tasks import TaskEvalSettings
    evaluate_tasks(model, tok, "piqa", "data/", TaskEvalSettings(num_fewshot=5, limit=100))
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from swax.core.errors import SwaxError
from swax.eval.sandbox import run_programs
from swax.eval.scoring import (
    add_mean,
    encode_pair,
    generate_texts,
    progress_bar,
    score_continuations,
)
from swax.eval.tasks.specs import (
    FEWSHOT_SEED,
    HUMANEVAL_STOP,
    MBPP_STOP,
    TASKS,
    TaskSpec,
    _resolve_fewshot,
    _train_docs,
    code_program,
    fewshot_contexts,
    load_docs,
    parse_tasks,
    task_file,
)
from swax.export.inference import load_model_and_tokenizer
from swax.state import DEFAULT_WINDOW, _Default

__all__ = [
    "TaskEvalSettings",
    "load_model_and_tokenizer",
    "evaluate_task",
    "evaluate_tasks",
    "format_table",
    "write_results",
    "RESULT_FILES",
]

RESULT_FILES = ("results.json", *(f"{name}_records.jsonl" for name in TASKS))
"""The files :func:`write_results` (``swax eval tasks``) writes in its results folder."""


@dataclass(frozen=True)
class TaskEvalSettings:
    """How :func:`evaluate_task` / :func:`evaluate_tasks` evaluate (the same for every task)."""

    num_fewshot: int | dict | None = None
    """An int for every task, a {task: n} dict, or None for each task's default (0; mbpp 3 as
    in the harness; humaneval is always zero-shot)."""
    limit: int | None = None
    """Evaluate only the first ``limit`` records of each task."""
    batch_size: int = 8
    """Sequences per forward pass (and prompts per generation batch)."""
    window: int | None | _Default = DEFAULT_WINDOW
    """Attention window: a number of keys, None for full attention, or DEFAULT_WINDOW (the
    default) for ``model.config.window``."""
    fewshot_seed: int = FEWSHOT_SEED
    """Seed of the few-shot sampler (1234, the harness's default)."""
    max_new_tokens: int | None = None
    """Generation budget of code tasks (None: 1024 humaneval, 256 mbpp, the harness's)."""
    code_timeout: float = 10.0
    """Seconds per program of the code tasks (see :mod:`swax.eval.sandbox`)."""
    code_memory_mb: int | None = 1024
    """Address-space limit (MiB) of each program of the code tasks (None: no limit)."""
    code_workers: int | None = None
    """Programs of the code tasks run at once (None: the CPU count)."""
    progress: bool = True
    """Show tqdm progress bars with ETA."""
    compile: bool | None = None
    """Generation through the compiled decode step (see :func:`swax.generate.generate`)."""


def _loglikelihoods(spec: TaskSpec, docs, contexts, model, tokenizer, settings):
    """Per record, the (log-likelihood, is greedy) of each of its continuations."""
    requests, owners = [], []
    for i, (doc, ctx) in enumerate(zip(docs, contexts)):
        conts = [" " + c for c in doc["choices"]] if spec.kind == "mc" else [doc["target"]]
        for k, cont in enumerate(conts):
            requests.append(encode_pair(tokenizer, ctx, cont))
            owners.append((i, k))
    scores = score_continuations(
        model,
        requests,
        window=settings.window,
        batch_size=settings.batch_size,
        pad_id=tokenizer.eot_id,
        progress=settings.progress,
        desc=spec.name,
    )
    per_doc: list[list[tuple[float, bool]]] = [[] for _ in docs]
    for (i, _), sc in zip(owners, scores):
        per_doc[i].append(sc)
    return per_doc


def _multiple_choice(docs, contexts, per_doc):
    records, metrics = [], {}
    accs, norms = [], []
    for doc, ctx, sc in zip(docs, contexts, per_doc):
        lls = [ll for ll, _ in sc]
        norm = [ll / max(1, len(c)) for ll, c in zip(lls, doc["choices"])]
        pred = max(range(len(lls)), key=lambda k: (lls[k], -k))
        pred_norm = max(range(len(norm)), key=lambda k: (norm[k], -k))
        acc, acc_norm = float(pred == doc["gold"]), float(pred_norm == doc["gold"])
        accs.append(acc)
        norms.append(acc_norm)
        records.append(
            {
                "line": doc["line"],
                "context": ctx,
                "choices": doc["choices"],
                "gold": doc["gold"],
                "loglikelihoods": lls,
                "pred": pred,
                "pred_norm": pred_norm,
                "acc": acc,
                "acc_norm": acc_norm,
            }
        )
    add_mean("acc", accs, metrics)
    add_mean("acc_norm", norms, metrics)
    metrics["chance"] = sum(1 / len(doc["choices"]) for doc in docs) / max(1, len(docs))
    return metrics, records


def _lambada(docs, contexts, per_doc):
    records, metrics = [], {}
    accs, lls = [], []
    for doc, ctx, sc in zip(docs, contexts, per_doc):
        ll, greedy = sc[0]
        accs.append(float(greedy))
        lls.append(ll)
        records.append(
            {
                "line": doc["line"],
                "context": ctx,
                "target": doc["target"],
                "loglikelihood": ll,
                "is_greedy": greedy,
                "acc": float(greedy),
            }
        )
    add_mean("acc", accs, metrics)
    metrics["perplexity"] = math.exp(-sum(lls) / len(lls))
    return metrics, records


def _code(spec: TaskSpec, docs, contexts, model, tokenizer, settings):
    stop = HUMANEVAL_STOP if spec.name == "humaneval" else MBPP_STOP
    max_new_tokens = settings.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = 1024 if spec.name == "humaneval" else 256  # the harness's
    completions = generate_texts(
        model,
        tokenizer,
        contexts,
        stop=stop,
        max_new_tokens=max_new_tokens,
        window=settings.window,
        batch_size=settings.batch_size,
        progress=settings.progress,
        desc=f"{spec.name} generate",
        compile=settings.compile,
    )
    programs = [code_program(spec.name, doc, c) for doc, c in zip(docs, completions)]
    bar = progress_bar(len(programs), f"{spec.name} execute", settings.progress, unit="program")
    try:
        results = run_programs(
            programs,
            timeout=settings.code_timeout,
            memory_mb=settings.code_memory_mb,
            workers=settings.code_workers,
            on_done=lambda i, r: bar.update(1),
        )
    finally:
        bar.close()
    records = []
    for doc, ctx, comp, res in zip(docs, contexts, completions, results):
        records.append(
            {
                "line": doc["line"],
                "task_id": doc["task_id"],
                "prompt": ctx,
                "completion": comp,
                "passed": res.passed,
                "status": res.status,
                "detail": res.detail,
            }
        )
    metrics: dict = {}
    add_mean("pass@1", [float(r.passed) for r in results], metrics)
    metrics["landlock_abi"] = min((r.landlock_abi for r in results), default=0)
    return metrics, records


def _settings(settings: TaskEvalSettings | None, options: dict) -> TaskEvalSettings:
    """``settings`` (default: the defaults) with the fields named in ``options`` replaced; an
    unknown name is a TypeError naming it and the known ones."""
    known = {f.name for f in fields(TaskEvalSettings)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"unknown task evaluation option {unknown[0]!r}; expected one of {sorted(known)}"
        )
    return replace(settings or TaskEvalSettings(), **options)


def evaluate_task(
    model,
    tokenizer,
    task: str,
    data_dir: str | Path | None = None,
    settings: TaskEvalSettings | None = None,
    *,
    data_files: dict[str, str | Path] | None = None,
    docs: list[dict] | None = None,
    **options,
) -> dict:
    """One task: ``{"task", "metrics": {...}, "records": [...]}`` (see :func:`evaluate_tasks`);
    ``docs``: its records when already loaded (:func:`~swax.eval.tasks.specs.load_docs`)."""
    settings = _settings(settings, options)
    spec = TASKS[parse_tasks([task])[0]]
    if docs is None:
        docs = load_docs(spec.name, data_dir, data_files)
    source = str(task_file(spec.name, data_dir, data_files))
    pool = docs  # few-shot examples come from the whole file, whatever the limit
    limit = settings.limit
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SwaxError(f"limit must be an integer >= 1, got {limit!r}")
        docs = docs[:limit]
    n_shot = _resolve_fewshot(spec, settings.num_fewshot)
    if settings.window is DEFAULT_WINDOW:
        settings = replace(settings, window=model.config.window)
    contexts = fewshot_contexts(
        spec, docs, pool, n_shot, settings.fewshot_seed, source, data_dir, data_files
    )
    if spec.kind == "code":
        metrics, records = _code(spec, docs, contexts, model, tokenizer, settings)
    else:
        per_doc = _loglikelihoods(spec, docs, contexts, model, tokenizer, settings)
        score = _multiple_choice if spec.kind == "mc" else _lambada
        metrics, records = score(docs, contexts, per_doc)
    metrics = {"n": len(docs), "num_fewshot": n_shot, **metrics}
    return {"task": spec.name, "source": source, "metrics": metrics, "records": records}


def evaluate_tasks(
    model,
    tokenizer,
    tasks: str | Sequence[str],
    data_dir: str | Path | None = None,
    settings: TaskEvalSettings | None = None,
    *,
    data_files: dict[str, str | Path] | None = None,
    **options,
) -> dict[str, dict]:
    """Evaluate ``model`` on short-context tasks from local JSONL files.

    Args:
        tasks: names (``arc_easy``, ``arc_challenge``, ``hellaswag``, ``piqa``, ``lambada``,
            ``humaneval``, ``mbpp``), a comma-separated string, or ``"all"``.
        data_dir: folder holding ``{task}.jsonl`` (and optional ``{task}_train.jsonl``).
        settings: few-shot, limit, batch size, window, code sandbox limits, progress bars
            (see :class:`TaskEvalSettings`; default: its defaults).
        data_files: {task or task_train: path} overriding the default file names.
        options: fields of :class:`TaskEvalSettings` given as keywords (``limit=100``,
            ``num_fewshot=3``), over ``settings`` or its defaults.

    Returns ``{task: {"task", "source", "metrics": {...}, "records": [...]}}``. Every data file
    is read and checked before the first forward pass, so a missing or malformed file fails
    fast with a SwaxError naming the file, the line and the expected schema.
    """
    settings = _settings(settings, options)
    names = parse_tasks(tasks)
    loaded = {name: load_docs(name, data_dir, data_files) for name in names}
    for name in names:
        spec = TASKS[name]
        if _resolve_fewshot(spec, settings.num_fewshot) and spec.kind != "code":
            _train_docs(spec, data_dir, data_files)  # validate it now, if present
    return {
        name: evaluate_task(
            model, tokenizer, name, data_dir, settings, data_files=data_files, docs=loaded[name]
        )
        for name in names
    }


# ---------------------------------------------------------------------------------------------
# Output

_MAIN_METRICS = {"mc": ("acc", "acc_norm"), "lambada": ("acc", "perplexity"), "code": ("pass@1",)}


def _wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (95 % by default)."""
    p, z2 = k / n, z * z
    mid = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def format_table(results: dict[str, dict]) -> str:
    """A plain-text table: task, n, shots, metric, value ± stderr (percentages for accuracies,
    as lm-evaluation-harness prints fractions; here 0-100)."""
    rows = [("task", "n", "shots", "metric", "value", "stderr")]
    for name, res in results.items():
        m = res["metrics"]
        for metric in _MAIN_METRICS[TASKS[name].kind]:
            v = m.get(metric)
            se = m.get(f"{metric}_stderr")
            if metric == "perplexity":
                val, err = f"{v:.3f}", ""
            else:
                val = f"{100 * v:.2f}"
                err = "" if se is None else f"± {100 * se:.2f}"
                if se == 0 and m["n"]:  # all right or all wrong: a 0 error says nothing
                    lo, hi = _wilson(round(v * m["n"]), m["n"])
                    err = f"[{100 * lo:.2f}, {100 * hi:.2f}] 95 %"
            rows.append((name, str(m["n"]), str(m["num_fewshot"]), metric, val, err))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if c < 4 else cell.rjust(w) for c, (cell, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def reading_note(results: dict[str, dict], bundled: bool = False) -> str:
    """The lines under :func:`format_table` that say how to read it: the chance level of each
    multiple-choice task (a uniform guess over its records' choices), what lambada's numbers
    are, and, for the bundled samples, that a handful of records shows the pipeline works, not
    how good the model is."""
    parts = []
    chance = [
        f"{n} {100 * r['metrics']['chance']:.1f}"
        for n, r in results.items()
        if "chance" in r["metrics"]
    ]
    if chance:
        parts.append(
            "accuracy in % ± its standard error over the n records; chance (a uniform "
            f"guess): {', '.join(chance)}"
        )
    if "lambada" in results:
        parts.append(
            "lambada: acc = the last word is the greedy continuation (chance ≈ 0); perplexity = "
            "exp of the mean negative log-likelihood of the whole word, as lm-eval reports it "
            "(large for a byte-level model: one word is many bytes)"
        )
    if any(TASKS[n].kind == "code" for n in results):
        parts.append("pass@1: the share of problems whose generated program passes the tests")
    if bundled:
        n = max(r["metrics"]["n"] for r in results.values())
        parts.append(
            f"{n} bundled records per task show that the pipeline runs, not how good "
            "the model is: pass --data-dir with the real test sets"
        )
    return "\n".join(f"how to read: {p}" if i == 0 else f"  {p}" for i, p in enumerate(parts))


def write_results(
    out_dir: str | Path, results: dict[str, dict], settings: dict | None = None
) -> Path:
    """Write ``results.json`` ({"settings", "tasks": {task: metrics}}) and one
    ``{task}_records.jsonl`` per task into ``out_dir``; returns the results.json path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "settings": settings or {},
        "tasks": {k: {"source": v.get("source"), **v["metrics"]} for k, v in results.items()},
    }
    path = out / "results.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    for name, res in results.items():
        with open(out / f"{name}_records.jsonl", "w", encoding="utf-8") as f:
            for rec in res["records"]:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path

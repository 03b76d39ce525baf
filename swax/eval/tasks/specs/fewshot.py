"""Few-shot examples: the harness's seeded sampler, MBPP's fixed prompt examples, and the
prompt of every record (:func:`fewshot_contexts`)."""

from __future__ import annotations

import functools
import random
from pathlib import Path

from swax.core.errors import SwaxError
from swax.data.jsonl import read_jsonl
from swax.eval.tasks.specs.formats import TaskSpec, _mbpp
from swax.eval.tasks.specs.loading import _train_docs

FEWSHOT_SEED = 1234
"""lm-evaluation-harness's default ``fewshot_random_seed``."""


MBPP_FEWSHOT_FILE = Path(__file__).parents[1] / "fewshot" / "mbpp.jsonl"
"""The three prompt-split examples (task ids 2, 3, 4) that the harness's mbpp.yaml uses as
few-shot examples, in the upstream MBPP schema."""


@functools.cache
def mbpp_fewshot() -> tuple[dict, ...]:
    """The records of :data:`MBPP_FEWSHOT_FILE`."""
    return tuple(read_jsonl(MBPP_FEWSHOT_FILE))


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
    prompt examples (see :mod:`swax.eval.tasks.specs`)."""
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

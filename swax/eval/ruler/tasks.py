"""RULER's NIAH definitions: the prompt template, answer prefix, needle and noise sentences,
the essay depths, and the task table (:class:`NiahTask`, :data:`TASKS`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swax.core.errors import SwaxError

TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
"""``TASKS['niah']['template']`` of RULER's ``scripts/data/synthetic/constants.py``."""

ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
"""``TASKS['niah']['answer_prefix']`` of the same file."""

TOKENS_TO_GENERATE = 128
"""``TASKS['niah']['tokens_to_generate']``."""

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
"""The needle sentence of RULER's ``niah.py`` (the value type stays plural here)."""

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""The noise haystack's sentence of RULER's ``niah.py``."""

DEPTHS: tuple[int, ...] = tuple(
    int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)
)
"""Needle depths (percent) of the essay haystack: RULER's ``DEPTHS``."""

HAYSTACKS = ("noise", "essay", "needle")
NEEDLE_TYPES = ("words", "numbers", "uuids")


@dataclass(frozen=True)
class NiahTask:
    """One RULER NIAH task: its entry of ``synthetic.yaml``."""

    name: str
    type_haystack: str
    """noise (repeated sentences), essay (sentences of a text) or needle (distractor needles)."""
    type_needle_k: str
    """Kind of keys: words (adjective-noun), numbers (7 digits) or uuids."""
    type_needle_v: str
    """Kind of values: numbers or uuids (words also accepted, as in RULER)."""
    num_needle_k: int = 1
    """Keys with a needle in the context (raised to num_needle_q)."""
    num_needle_v: int = 1
    """Needles (values) per key."""
    num_needle_q: int = 1
    """Keys asked about in the question."""
    tokens_to_generate: int = TOKENS_TO_GENERATE

    @property
    def num_keys(self) -> int:
        """Keys actually placed: RULER's ``max(num_needle_k, num_needle_q)``."""
        return max(self.num_needle_k, self.num_needle_q)

    @property
    def num_needles(self) -> int:
        return self.num_keys * self.num_needle_v

    @property
    def singular(self) -> bool:
        """The question asks for a single value: RULER's singular wording."""
        return self.num_needle_q * self.num_needle_v == 1

    @property
    def value_word(self) -> str:
        """The value type as the template writes it ("number" or "numbers", ...)."""
        return self.type_needle_v[:-1] if self.singular else self.type_needle_v

    def prompt_template(self) -> str:
        """Template + answer prefix (``base`` model template) with RULER's singular wording,
        ``{type_needle_v}`` filled in; ``{context}`` and ``{query}`` are left to fill."""
        text = TEMPLATE + ANSWER_PREFIX
        if self.singular:
            for old, new in (
                ("Some", "A"),
                ("are all", "is"),
                ("are", "is"),
                ("answers", "answer"),
            ):
                text = text.replace(old, new)
        return text.replace("{type_needle_v}", self.value_word)

    def template(self) -> tuple[str, str]:
        """(template, answer prefix) as the model sees them, with ``{context}`` and ``{query}``
        placeholders: the prompt is ``template`` then (the model's) ``answer prefix``."""
        text = self.prompt_template()
        cut = text.rfind(ANSWER_PREFIX[:10])
        return text[:cut], text[cut:]


def _task(
    name: str, haystack: str, k_type: str, v_type: str, k: int = 1, v: int = 1, q: int = 1
) -> tuple[str, NiahTask]:
    return name, NiahTask(name, haystack, k_type, v_type, k, v, q)


TASKS: dict[str, NiahTask] = dict(
    [
        _task("niah_single_1", "noise", "words", "numbers"),
        _task("niah_single_2", "essay", "words", "numbers"),
        _task("niah_single_3", "essay", "words", "uuids"),
        _task("niah_multikey_1", "essay", "words", "numbers", k=4),
        _task("niah_multikey_2", "needle", "words", "numbers"),
        _task("niah_multikey_3", "needle", "uuids", "uuids"),
        _task("niah_multivalue", "essay", "words", "numbers", v=4),
        _task("niah_multiquery", "essay", "words", "numbers", q=4),
    ]
)
"""The eight NIAH tasks of RULER's ``scripts/synthetic.yaml``."""


def _resolve_task(task: str | NiahTask) -> NiahTask:
    if isinstance(task, NiahTask):
        return task
    if task not in TASKS:
        raise SwaxError(f"unknown NIAH task {task!r} (expected one of {', '.join(TASKS)})")
    return TASKS[task]

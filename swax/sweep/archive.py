"""A finished run's committed result (``archive/NAME/seedS.json``): its evaluation, the
summary's headline numbers and the episode ids it was trained with.

The episode ids say which tokens the retrieval episodes' keys, values and filler were: a run
whose ids lie inside the tokenizer's vocabulary shares them with the text (the regime study's
first runs used 128-175, which KJV holds as UTF-8 bytes), one whose ids start at the
tokenizer's vocabulary does not. Reports compare only runs of one id range.
"""

from __future__ import annotations

import json
from pathlib import Path

from swax.data.mqar import mqar_span, resolve_mqar_ids
from swax.data.tokenizer import load_tokenizer

SUMMARY_KEYS = ("initial_val_loss", "final_val_loss", "tokens", "tok_s", "elapsed", "steps")
"""The training summary's numbers kept in the committed result."""


def episode_ids(tcfg) -> dict | None:
    """The episode ids a run of training config ``tcfg`` trains with, as the loader resolves
    them: {"task": "mqar", "first", "last" (inclusive), "tokenizer_vocab"} for MQAR episodes,
    {"task": "needle"} for needle episodes (their ids are the tokenizer's own), None when the
    run mixes no episodes into its text."""
    syn = tcfg.data.synthetic
    if syn.fraction <= 0:
        return None
    if syn.task != "mqar":
        return {"task": syn.task}
    vocab = load_tokenizer(tcfg.data.tokenizer).vocab_size
    first = resolve_mqar_ids(syn, vocab).mqar_first_id
    return {
        "task": "mqar",
        "first": int(first),
        "last": int(first + mqar_span(syn) - 1),
        "tokenizer_vocab": int(vocab),
    }


def archive_result(path: Path, out: dict, summary: dict, ids: dict | None) -> None:
    """Write a run's committed result: its evaluation ``out``, the summary's headline numbers
    and its episode ids ``ids`` (atomically: a partial file is never taken for a finished
    run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: summary[k] for k in SUMMARY_KEYS if k in summary}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({**out, "summary": keep, "episode_ids": ids}, indent=1, allow_nan=True)
    )
    tmp.replace(path)

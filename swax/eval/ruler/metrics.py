"""RULER's NIAH and QA metrics (:func:`string_match_all`, :func:`string_match_part`) and its
cleanup of a prediction before scoring (:func:`postprocess_pred`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from swax.core.errors import SwaxError


def _check_pairs(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(preds) != len(refs):
        raise SwaxError(f"{len(preds)} predictions for {len(refs)} references")
    if not preds:
        raise SwaxError("no predictions to score")


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's metric for NIAH: per sample, the share of references found (case-insensitive
    substring) in the prediction; mean over samples, in percent, rounded to 2 decimals."""
    _check_pairs(preds, refs)
    total = sum(
        sum(1.0 if r.lower() in p.lower() else 0.0 for r in ref) / len(ref)
        for p, ref in zip(preds, refs)
    )
    return round(total / len(preds) * 100, 2)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER's metric for QA: a sample counts 1 when any reference is found in the prediction;
    mean over samples, in percent, rounded to 2 decimals."""
    _check_pairs(preds, refs)
    total = sum(
        max(1.0 if r.lower() in p.lower() else 0.0 for r in ref) for p, ref in zip(preds, refs)
    )
    return round(total / len(preds) * 100, 2)


def postprocess_pred(pred: str) -> str:
    """RULER's cleanup of a prediction before scoring (``scripts/eval/evaluate.py``
    ``postprocess_pred``): strip, turn every ASCII control character (U+0000 … U+001F) into a
    newline, strip again. Other characters, DEL and non-ASCII ones included, are kept; a
    control character inside a value therefore splits it and the value no longer matches."""
    return re.sub(r"[\x00-\x1f]", "\n", pred.strip()).strip()

"""Which episode ids each archived run of the regime study was trained with, and the rule that
one table holds runs of one id range.

A result archived by the sweep records its ids (``episode_ids``, swax.sweep.archive). Results
archived before that field existed are read from what is known of them (regime_study/NOTES.md
sections 8 and 9): the laziness map (laziness_map/results/laziness) and the rho = 1 % claims
(claims/results/claims) were trained with keys, values and filler at ids 128-175
(swax.data.mqar.LEGACY_FIRST_ID), which the KJV text also holds as UTF-8 bytes; the rho = 0
claims (claims/results/claims_rho0) were trained after the ids moved past the tokenizer's
vocabulary (commit b498ea2 precedes every one of them). Any other archive without the field is
read as old ids, the default before that commit.
"""

from __future__ import annotations

from pathlib import Path

from swax.core.errors import SwaxError
from swax.data.mqar import LEGACY_FIRST_ID, mqar_span
from swax.data.tokenizer import load_tokenizer
from swax.sweep import train_config

CLEAN_BEFORE_THE_FIELD = ("claims_rho0",)
"""Archives made before results recorded their ids whose runs used ids after the tokenizer's
vocabulary (regime_study/NOTES.md section 9)."""


def run_ids(ev: dict, cfg, name: str, seed: int) -> dict | None:
    """{"first", "last", "old" (ids inside the tokenizer's vocabulary, which text can emit),
    "recorded" (False: read from the archive's history)} of one archived result ``ev`` of run
    ``name``; None for a run without MQAR episodes."""
    rec = ev.get("episode_ids", "absent")
    if rec is None or (isinstance(rec, dict) and rec.get("task") != "mqar"):
        return None
    if isinstance(rec, dict):
        old = rec["first"] < rec["tokenizer_vocab"]
        return {"first": rec["first"], "last": rec["last"], "old": old, "recorded": True}
    tcfg = train_config(cfg, name, seed)
    syn = tcfg.data.synthetic
    if syn.task != "mqar" or syn.fraction <= 0:
        return None
    span = mqar_span(syn)
    if Path(cfg.archive).name in CLEAN_BEFORE_THE_FIELD:
        first = load_tokenizer(tcfg.data.tokenizer).vocab_size
        return {"first": first, "last": first + span - 1, "old": False, "recorded": False}
    return {
        "first": LEGACY_FIRST_ID,
        "last": LEGACY_FIRST_ID + span - 1,
        "old": True,
        "recorded": False,
    }


def label(ids: dict | None) -> str:
    """'old episode ids 128–175, which the KJV text also holds' or 'clean episode ids
    257–304, after the tokenizer's vocabulary'."""
    if ids is None:
        return "no episodes"
    span = f"{ids['first']}–{ids['last']}"
    if ids["old"]:
        return f"old episode ids {span}, which the KJV text also holds"
    return f"clean episode ids {span}, after the tokenizer's vocabulary"


def one_range(records: list[tuple[str, int, dict | None]], where: str) -> dict | None:
    """The one id range of ``records`` [(run name, seed, ids)], runs without episodes left
    out; a SwaxError (one line) when they mix ranges: a table compares runs of one kind."""
    by: dict[tuple, list] = {}
    for name, seed, ids in records:
        if ids is not None:
            by.setdefault((ids["first"], ids["last"]), []).append((name, seed, ids))
    if len(by) <= 1:
        return next(iter(by.values()))[0][2] if by else None
    parts = [
        f"{lo}–{hi} ({'old' if runs[0][2]['old'] else 'clean'}: {len(runs)} run"
        f"{'s' * (len(runs) != 1)}, e.g. {runs[0][0]} seed {runs[0][1]})"
        for (lo, hi), runs in sorted(by.items())
    ]
    raise SwaxError(
        f"{where} mixes runs trained on different episode ids: {' and '.join(parts)}; one "
        "table compares runs of one id range (keep the others in their own archive)"
    )

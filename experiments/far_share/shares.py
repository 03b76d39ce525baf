"""The natural far share of text (results/, made by ``python -m experiments.far_share run``)
on the map's scale.

Read by this study's report, the regime's reading (REPORT.md section 4) and the text study
(TEXT_RULE.md section 6's prediction, read from the map of record): the far-share tool's results
per corpus and tokenizer, the share at one (T, W), and the answers' share of a sweep's training
targets, which puts a far share of the episodes (the map's ρ) on the scale of all targets.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAR_SHARE = HERE / "results"
CORPORA = (("kjv", "KJV (prose)"), ("pystdlib", "Python standard library (code)"))
TOKENIZERS = (("byte", "bytes"), ("gpt2", "GPT-2 BPE"))


def answers_of_targets(cfg) -> float:
    """The share of all training targets that are episode answers (one answer per episode)."""
    b = cfg.base
    syn = b["data"]["synthetic"]
    f, T, q = syn.get("fraction", 0.0), b["seq_len"], syn.get("num_queries", 1)
    return f * q / (f * q + (1 - f) * T)


def load_far_shares(folder: Path = FAR_SHARE) -> dict[tuple[str, str], dict]:
    """{(corpus, tokenizer): the far-share tool's result} for the results in ``folder``."""
    out = {}
    for corpus, _ in CORPORA:
        for tok, _ in TOKENIZERS:
            p = folder / f"{corpus}-{tok}.json"
            if p.is_file():
                out[(corpus, tok)] = json.loads(p.read_text())
    return out


def far_at(res: dict, T: int, W: int) -> dict | None:
    """The row of a far-share result at training length ``T`` and window ``W`` (share, ci)."""
    for row in res["rows"]:
        if row["seq_len"] == T:
            for w in row["windows"]:
                if w["window"] == W:
                    return w
    return None

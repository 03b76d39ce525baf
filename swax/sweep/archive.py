"""A finished run's committed result (``archive/NAME/seedS.json``): its evaluation, the
summary's headline numbers and the episode ids it was trained with.

The episode ids say which tokens the retrieval episodes' keys, values and filler were: a run
whose ids lie inside the tokenizer's vocabulary shares them with the text (the regime study's
first runs used 128-175, which KJV holds as UTF-8 bytes), one whose ids start at the
tokenizer's vocabulary does not. Reports compare only runs of one id range.
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import torch

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


def git_commit() -> str | None:
    """The commit of the swax checkout this process runs from (None outside a git checkout)."""
    here = Path(__file__).resolve().parents[2]
    try:
        r = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


def provenance(tcfg) -> dict:
    """What a committed result was made with: the corpus (and the Python version, which defines
    the ``pystdlib`` corpus), the model family and windows, the mLSTM input-gate bias, the
    learning rate, the precision and the swax commit."""
    w, m = tcfg.window, tcfg.model
    precision = tcfg.dtype
    if precision == "auto":  # swax train: bfloat16 autocast on CUDA, float32 elsewhere
        precision = "bfloat16" if torch.cuda.is_available() else "float32"
    return {
        "corpus": tcfg.data.source,
        "python": platform.python_version(),
        "tokenizer": tcfg.data.tokenizer,
        "family": m.layer_pattern,
        "n_layers": m.n_layers,
        "d_model": m.d_model,
        "seq_len": tcfg.seq_len,
        "batch_size": tcfg.batch_size,
        "steps": tcfg.steps,
        "windows": {
            "kind": w.kind,
            "fixed": w.fixed_window,
            "short": w.short,
            "long": w.long,
            "p_short": w.p_short,
            "anneal_frac": w.anneal_frac,
        },
        "mlstm_igate_bias_init": m.mlstm_igate_bias_init,
        "lr": tcfg.optim.lr,
        "precision": precision,
        "torch": torch.__version__,
        "git_commit": git_commit(),
    }


def archive_result(
    path: Path, out: dict, summary: dict, ids: dict | None, prov: dict | None = None
) -> None:
    """Write a run's committed result: its evaluation ``out``, the summary's headline numbers,
    its episode ids ``ids`` and, when given, its :func:`provenance` (atomically: a partial file
    is never taken for a finished run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = {k: summary[k] for k in SUMMARY_KEYS if k in summary}
    res = {**out, "summary": keep, "episode_ids": ids}
    if prov is not None:
        res["provenance"] = prov
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, allow_nan=True))
    tmp.replace(path)

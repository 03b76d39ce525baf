"""`swax eval copies` and `swax eval passkey`: memory on text, for one model or several read on
the same events (a thin adapter to :mod:`swax.eval.memory`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from swax.cli import options as C
from swax.cli.args import option
from swax.cli.common import load_for
from swax.cli.evaluate import _eval_label, _eval_out, _footer
from swax.core.configs import bounded
from swax.core.errors import SwaxError
from swax.core.settings import resolve_window
from swax.eval import memory as M
from swax.eval.niah import parse_lengths
from swax.eval.recall import run_windows
from swax.probes.copies import copy_ranges
from swax.probes.passkey import KEY_CHARS, PREFIX, SUFFIX, passkey_retrieval


@dataclass
class MemoryConfig(C.EvalConfig):
    """What the memory probes on text share."""

    data: str | None = None
    """Corpus whose held-out split is read: kjv, pystdlib, a file or a folder (default: the
    run's own corpus, split as the run split it)."""
    field: str = "text"
    """JSONL/Parquet field of --data."""
    also: list[str] = option(default_factory=list, repeat=True, metavar="DIR")
    """Another model read on the same events (may be given several times): one table and one
    line in the plot each. Every model must share --model's tokenizer."""
    seq_len: int | None = option(None, bounds="[1, inf)")
    """Training length T (default: read from the run's config.yaml)."""
    probes: bool = True
    """Also read with the window cut to the run's shortest training window and with the
    recurrent state reset (--no-probes: the own window only)."""
    batch_size: int = option(16, bounds="[1, inf)")
    """Rows evaluated at once."""


@dataclass
class CopiesConfig(MemoryConfig):
    """Copy gain by reach on held-out text: what an earlier occurrence of the context is worth to
    the model, with a placebo, the window-cut and recurrent-reset probes and a reach × position
    split (see docs/evaluation.md)."""

    events: int = option(1000, bounds="[1, inf)")
    """Copy events per range of reach (the same events for every model)."""
    edges: str = "auto"
    """Comma list of reach edges (e.g. 8,32,128,1k,4k); auto: the context, ×4 up to T, 4T and
    each model's window."""
    context: int = option(0, bounds="[0, inf)")
    """Tokens of the repeated context that makes a copy event (and the n-gram baseline's
    order); 0 = 8 for the byte tokenizer, 4 otherwise."""
    past: int = option(4, bounds="[0, inf)")
    """Read the ranges of reach <= T again at positions past T, in rows of past × T tokens
    (0 = no reach × position split)."""
    baseline_tokens: int = option(0, bounds="[0, inf)")
    """Fit the n-gram baseline on the first this many training tokens (0 = all)."""
    heldout_tokens: int = option(0, bounds="[0, inf)")
    """Look for copy events in the first this many held-out tokens (0 = all)."""


@dataclass
class PasskeyConfig(MemoryConfig):
    """A random hex key planted in held-out text and asked for again at distance d: retrieval by
    greedy decoding and the loss on the key, against a control whose first key differs."""

    distances: str = "auto"
    """Comma list of distances in tokens (32, 1k, 16k); auto: 32 doubling up to 16 T."""
    trials: int = bounded(200, "[1, inf)")
    """Trials per distance (the same for every model)."""
    prefix: str = PREFIX
    """Text before both keys (the cue of the repeat)."""
    suffix: str = SUFFIX
    """Text after the first key."""
    key_chars: int = bounded(KEY_CHARS, "[1, inf)")
    """Hex digits of the key."""
    batch_size: int = option(8, bounds="[1, inf)")
    """Trials evaluated at once."""


def _subjects(cfg: MemoryConfig):
    """(the models as probe subjects, the first model's tokenizer, the training length)."""
    if cfg.model is None:
        raise SwaxError("--model: give a model folder (written by swax train or save_pretrained)")
    out, T, tok0 = [], cfg.seq_len, None
    for path in [cfg.model, *cfg.also]:
        one = C.EvalConfig(model=path, device=cfg.device, dtype=cfg.dtype, window=cfg.window)
        model, tok, _ = load_for(one)
        model.eval()
        if tok0 is None:
            tok0 = tok
        elif tok.vocab_size != tok0.vocab_size or tok.eot_id != tok0.eot_id:
            raise SwaxError(f"--also {path}: its tokenizer differs from --model's {cfg.model}")
        run = run_windows(path) or {}
        T = T or run.get("seq_len")
        explicit = str(cfg.window) != "default"
        window = resolve_window(cfg.window, model.config.window) if explicit else None
        window = window or run.get("own") or model.config.window
        cut = run.get("short") if cfg.probes else None
        cut = (cut or 8) if cfg.probes else None
        label = _eval_label(cfg) if path == cfg.model else Path(path).resolve().name
        if label == "model":
            label = Path(path).resolve().parent.name
        out.append(M.Subject(label, path, model, window, cut))
    if T is None:
        raise SwaxError("--seq-len: give the training length T (no run config.yaml beside --model)")
    return out, tok0, T


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_eval_copies(cfg: CopiesConfig) -> int:
    """Copy gain by reach -> OUT/copies.{json,md,png}."""
    out = _eval_out(cfg, "copies", M.COPIES_FILES)
    subjects, tok, T = _subjects(cfg)
    context = cfg.context or (8 if tok.vocab_size <= 257 else 4)
    windows = [s.window for s in subjects] + [s.probe_window for s in subjects]
    edges = (
        M.auto_edges(context, T, windows)
        if cfg.edges == "auto"
        else parse_lengths(cfg.edges, "--edges")
    )
    copy_ranges(edges, T)  # checks the edges before the text is read
    train, val = M.text_split(cfg.data, tok, M.run_data(cfg.model), cfg.field)
    from swax.train.peak import cache_dir

    res = M.copies(
        subjects,
        train,
        val,
        tok.eot_id,
        T,
        edges,
        cfg.events,
        context,
        past=cfg.past * T if cfg.past else 0,
        seed=cfg.seed,
        batch_size=cfg.batch_size,
        baseline_tokens=cfg.baseline_tokens,
        heldout_tokens=cfg.heldout_tokens,
        cache_dir=cache_dir() / "ngram",
        log=_log,
    )
    res["data"] = cfg.data or M.run_data(cfg.model).get("source")
    table = M.copies_table(res)
    path = M.write(out, res, table, M.plot_copies)
    print(table)
    print(_footer(path))
    return 0


def cmd_eval_passkey(cfg: PasskeyConfig) -> int:
    """Passkey retrieval by distance -> OUT/passkey.{json,md,png}."""
    out = _eval_out(cfg, "passkey", M.PASSKEY_FILES)
    subjects, tok, T = _subjects(cfg)
    if cfg.distances == "auto":
        distances, d = [], 32
        while d <= 16 * T:
            distances.append(d)
            d *= 2
    else:
        distances = parse_lengths(cfg.distances, "--distances")
    snippet_len = sum(len(tok.encode(x)) for x in (cfg.prefix, "0" * cfg.key_chars, cfg.suffix))
    if min(distances) < snippet_len:
        raise SwaxError(
            f"--distances {min(distances)}: shorter than the key's snippet ({snippet_len} tokens: "
            f"--prefix, {cfg.key_chars} hex digits, --suffix)"
        )
    _, val = M.text_split(cfg.data, tok, M.run_data(cfg.model), cfg.field)
    snippet = {"prefix": cfg.prefix, "suffix": cfg.suffix, "key_chars": cfg.key_chars}
    models = []
    for s in subjects:
        _log(f"passkey of {s.label} (window {s.window}) at {len(distances)} distances ...")
        rows = passkey_retrieval(
            s.model,
            val,
            tok,
            distances,
            cfg.trials,
            s.window,
            s.probe_window,
            probe_distances=T,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            progress=True,
            **snippet,
        )
        models.append(
            {
                "label": s.label,
                "model": s.path,
                "window": s.window,
                "probe_window": s.probe_window,
                "rows": rows,
            }
        )
    res = {
        "kind": "passkey",
        "seq_len": T,
        "trials": cfg.trials,
        "distances": distances,
        "seed": cfg.seed,
        "snippet": snippet,
        "probes_up_to": T,
        "models": models,
        "data": cfg.data or M.run_data(cfg.model).get("source"),
    }
    table = M.passkey_table(res)
    path = M.write(out, res, table, M.plot_passkey)
    print(table)
    print(_footer(path))
    return 0

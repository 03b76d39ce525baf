"""`swax data {prepare,verify}`: pre-tokenized memory-mapped shards (:mod:`swax.data.shards`);
`swax data far-share`: the natural far share of a corpus (:mod:`swax.data.copies`)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from swax.cli import options as C
from swax.core.errors import SwaxError
from swax.core.signals import Stopped, StopSignals
from swax.data.copies import natural_far_share
from swax.data.prepare import prepare_shards
from swax.data.shards import no_validation_reason, verify_shards
from swax.data.sources import iter_documents
from swax.data.tokenizer import load_tokenizer
from swax.eval.niah.records import parse_lengths

# ---- swax data prepare (pre-tokenized shards; see swax.data.shards) ----


def _prepare(cfg: C.DataPrepareConfig, stop):

    return prepare_shards(
        cfg.source,
        cfg.out,
        tokenizer=cfg.tokenizer,
        shard_tokens=cfg.shard_tokens,
        workers=cfg.workers,
        val_fraction=cfg.val_fraction,
        split_seed=cfg.split_seed,
        fmt=cfg.format,
        field=cfg.field,
        overwrite=cfg.overwrite,
        progress=cfg.progress,
        stop=stop,
    )


def cmd_data_prepare(cfg: C.DataPrepareConfig) -> int:

    if not cfg.out:
        raise SwaxError("swax data prepare needs --out DIR, the folder of the shard set")
    try:
        with StopSignals("swax data prepare", action="stopping after the current batch") as stop:
            index = _prepare(cfg, stop)
    except KeyboardInterrupt:
        raise Stopped(
            f"interrupted; the finished shards in {cfg.out} are kept: run the same command "
            "again to resume",
            stop.signum or signal.SIGINT,
        ) from None

    tr, va = index["train"], index["val"]
    print(
        f"{index['documents']:,} documents -> {tr['tokens']:,} training tokens in "
        f"{len(tr['shards'])} shards, {va['tokens']:,} validation tokens in "
        f"{len(va['shards'])} shards ({index['dtype']}, tokenizer {index['tokenizer']['name']})"
    )
    reason = no_validation_reason(index)
    if reason:
        print(f"warning: no validation data: {reason}", file=sys.stderr)
    print(f"shard set: {cfg.out} (train with data.source={cfg.out})")
    return 0


def cmd_data_verify(cfg: C.DataVerifyConfig) -> int:

    n = verify_shards(cfg.folder, progress=cfg.progress)
    print(f"{cfg.folder}: {n['shards']} shards, {n['tokens']:,} tokens: every SHA-256 matches")
    return 0


# ---- swax data far-share (the natural far share of a corpus; see swax.data.copies) ----


def _divisors(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(d < 1 for d in out):
        raise SwaxError(f"--divisors must be positive integers (e.g. 128,32,8,4), got {text!r}")
    return out


def cmd_data_far_share(cfg: C.DataFarShareConfig) -> int:

    seq_lens = parse_lengths(cfg.seq_lens, "--seq-lens")
    divisors = _divisors(cfg.divisors)
    tok = load_tokenizer(cfg.tokenizer)
    context = cfg.context or (8 if tok.name == "byte" else 4)
    t0 = time.perf_counter()
    docs = list(iter_documents(cfg.source, cfg.format, cfg.field))

    def say(line):
        print(f"[{time.perf_counter() - t0:5.1f}s] {line}", file=sys.stderr, flush=True)

    res = natural_far_share(
        docs, tok, seq_lens, divisors, context, cfg.held_out, cfg.samples, cfg.seed, say
    )
    import platform

    from swax.version import __version__

    res = {
        "source": cfg.source,
        **res,
        "seed": cfg.seed,
        "samples": cfg.samples,
        "python": platform.python_version(),
        "swax": __version__,
    }
    print(
        f"far share of {cfg.source} ({tok.name}, context {context}; "
        f"{res['documents']['held_out']:,} held-out documents, "
        f"{res['tokens']['held_out']:,} tokens): % of targets that only a copy from beyond W "
        "predicts, 95 % bootstrap interval over documents"
    )
    print("| T | W | far share (%) | 95 % interval | events beyond W | targets |")
    print("|---|---|---|---|---|---|")
    for row in res["rows"]:
        for w in row["windows"]:
            lo, hi = w["ci"]
            print(
                f"| {row['seq_len']} | {w['window']} (T/{w['divisor']}) | {100 * w['share']:.3f} "
                f"| {100 * lo:.3f}–{100 * hi:.3f} | {w['far_events']:,} | {w['targets']:,} |"
            )
    if cfg.out:
        out = Path(cfg.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")  # never a half-written result under its name
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(out)
        print(f"results: {out}")
    return 0

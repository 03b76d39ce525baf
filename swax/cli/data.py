"""`swax data {prepare,verify}`: pre-tokenized memory-mapped shards (:mod:`swax.data.shards`)."""

from __future__ import annotations

import signal
import sys

from swax.cli import options as C
from swax.core.errors import SwaxError
from swax.core.signals import Stopped, StopSignals
from swax.data.prepare import prepare_shards
from swax.data.shards import no_validation_reason, verify_shards

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

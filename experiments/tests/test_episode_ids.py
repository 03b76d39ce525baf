"""Episode ids no text can emit: every run of the studies' configurations mixes MQAR episodes
whose keys, values and filler never occur in the text rows it trains on (read here from the
token stream itself, not from the ids' definition), and the ids the archived runs used (128 and
up, which the KJV text also holds as UTF-8 bytes) are refused with one line naming them."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from swax.core.errors import SwaxError
from swax.data import PackedLoader, build_datasets
from swax.data.config import DataConfig, SyntheticConfig
from swax.data.mqar import mqar_ids
from swax.data.tokenizer import load_tokenizer
from swax.sweep import load_sweep, train_config
from swax.sweep.run import all_jobs

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    p.relative_to(ROOT).as_posix()
    for main in (ROOT / "experiments").glob("*/__main__.py")  # every study's sweeps
    for p in main.parent.glob("*.yaml")
    if "task: mqar" in p.read_text()
)


@functools.cache
def _data(source: str, fmt: str, tokenizer: str, val_fraction: float):
    tok = load_tokenizer(tokenizer)
    cfg = DataConfig(source=source, format=fmt, tokenizer=tokenizer, val_fraction=val_fraction)
    train, _ = build_datasets(cfg, tok, seq_len=1, seed=0)
    return tok, train


@functools.cache
def _text_ids(source: str, fmt: str, tokenizer: str, val_fraction: float) -> frozenset[int]:
    """Every id that occurs in the training text, counted from the tokens."""
    _, train = _data(source, fmt, tokenizer, val_fraction)
    return frozenset(np.flatnonzero(np.bincount(np.asarray(train.tokens))).tolist())


def _mqar_runs(config: str):
    cfg = load_sweep(ROOT / config)
    seen = set()
    for name, seed in all_jobs(cfg):
        t = train_config(cfg, name, seed)
        syn = t.data.synthetic
        key = (
            t.data.source,
            t.data.format,
            t.data.tokenizer,
            t.data.val_fraction,
            t.seq_len,
            repr(syn),
        )
        if syn.task == "mqar" and syn.fraction > 0 and key not in seen:
            seen.add(key)
            yield name, t


@pytest.mark.parametrize("config", CONFIGS)
def test_no_episode_id_occurs_in_the_text_rows(config):
    runs = list(_mqar_runs(config))
    assert runs, f"{config} mixes no MQAR episodes"
    for name, t in runs:
        d = t.data
        tok, train = _data(d.source, d.format, d.tokenizer, d.val_fraction)
        loader = PackedLoader(train, t.seq_len, 4, synthetic=d.synthetic, tokenizer=tok)
        ids = set(np.concatenate(mqar_ids(loader.synthetic)).tolist())
        text = _text_ids(d.source, d.format, d.tokenizer, d.val_fraction)
        assert not ids & text, f"{config} {name}: episode ids {sorted(ids & text)} in the text"
        # the rows the loader hands out: text rows hold no episode id, episode rows are there
        kinds = loader.item_kinds(0)
        episodes = text_rows = 0
        for g in range(64):
            x = loader._raw_item(g)[0]
            if kinds[g]:
                episodes += 1
                assert set(x.tolist()) & ids
            else:
                text_rows += 1
                assert not set(x.tolist()) & ids
        assert episodes and (text_rows or loader.corpus_in_epoch == 0)


def test_the_archived_runs_ids_clash_with_kjv_and_say_where():
    """The ids the claims and the map were trained with (keys from 128): KJV's U+2019 is
    E2 80 99, so key 128 and value 153 occur in the text, about 1,950 times each."""
    tok, train = _data("kjv", "auto", "byte", 0.02)
    legacy = SyntheticConfig(task="mqar", fraction=0.9, min_distance=2, mqar_first_id=128)
    with pytest.raises(SwaxError) as e:
        PackedLoader(train, 256, 4, synthetic=legacy, tokenizer=tok)
    msg = str(e.value)
    assert "\n" not in msg
    counts = np.bincount(np.asarray(train.tokens), minlength=257)
    for i in (128, 153):
        assert counts[i] > 1000  # counted here, independently of the loader
        first = int(np.flatnonzero(np.asarray(train.tokens) == i)[0])
        assert f"id {i} (byte 0x{i:02X}) {counts[i]:,} times, first at token {first:,}" in msg
    assert "key id 128" in msg and "value id 153" in msg and "mqar_first_id" in msg
    for i in range(128, 176):  # every clashing id is named, and only those
        assert (f" id {i} (" in msg) == bool(counts[i])


def test_a_clash_on_the_command_line_is_one_line(tmp_path, capsys):
    from swax.cli.main import main

    rc = main(
        [
            "train",
            f"run_dir={tmp_path / 'r'}",
            "steps=1",
            "seq_len=64",
            "batch_size=2",
            "window.long=32",
            "data.synthetic.task=mqar",
            "data.synthetic.fraction=0.5",
            "data.synthetic.min_distance=2",
            "data.synthetic.mqar_first_id=128",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len([line for line in err if "clash" in line]) == 1
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "r" / "model").exists()

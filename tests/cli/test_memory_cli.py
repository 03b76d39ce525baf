"""`swax eval copies` and `swax eval passkey`: the files they write, and bad input as one line
with exit status 2."""

from __future__ import annotations

import json

import pytest
import torch

from swax import SwaxConfig, SwaxLM
from tests.cli.test_cli import assert_one_line_error, run_inprocess


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("mem") / "model"
    cfg = SwaxConfig(d_model=32, n_layers=2, n_heads=2, layer_pattern="SX", window=16)
    SwaxLM(cfg).save_pretrained(d)
    return d


@pytest.mark.parametrize(
    "args,needles",
    [
        (["copies"], ["--model"]),
        (["passkey"], ["--model"]),
        (
            ["copies", "--model", "M", "--data", "/no/such/corpus", "--seq-len", "64"],
            ["/no/such/corpus"],
        ),
        (
            ["passkey", "--model", "M", "--data", "/no/such/corpus", "--seq-len", "64"],
            ["/no/such/corpus"],
        ),
        (["copies", "--model", "M", "--seq-len", "64"], ["--data"]),  # no run names a corpus
        (["copies", "--model", "M", "--data", "kjv"], ["--seq-len"]),  # nor a length
        (["copies", "--model", "M", "--events", "0"], ["--events", "0"]),
        (["copies", "--model", "M", "--edges", "0,8", "--seq-len", "64"], ["--edges", "0,8"]),
        (["passkey", "--model", "M", "--trials", "0"], ["--trials", "0"]),
        (["passkey", "--model", "M", "--distances", "0", "--seq-len", "64"], ["--distances", "0"]),
        (["passkey", "--model", "M", "--distances", "8", "--seq-len", "64"], ["--distances 8"]),
        (["copies", "--model", "/no/such/model"], ["/no/such/model"]),
    ],
)
def test_bad_input_is_one_line(capsys, tmp_path, model_dir, args, needles):
    args = [str(model_dir) if a == "M" else a for a in args]
    r = run_inprocess(capsys, "eval", *args, "--out", str(tmp_path / "out"))
    assert_one_line_error(r, *needles)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_both_commands_write_json_markdown_and_a_plot(capsys, tmp_path, model_dir):
    common = [
        "--model",
        str(model_dir),
        "--data",
        "kjv",
        "--seq-len",
        "64",
        "--also",
        str(model_dir),
    ]
    r = run_inprocess(
        capsys,
        "eval",
        "copies",
        *common,
        "--events",
        "4",
        "--baseline-tokens",
        "20000",
        "--heldout-tokens",
        "30000",
        "--out",
        str(tmp_path / "c"),
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "c" / "copies.json").read_text())
    assert len(res["models"]) == 2 and res["seq_len"] == 64 and res["edges"] == [8, 16, 32, 64, 256]
    keys = [row["key"] for row in res["models"][0]["rows"]]
    assert "r8_16_pastT" in keys and "r64_256" in keys and "beyond_16" in keys
    assert (tmp_path / "c" / "copies.png").stat().st_size > 0
    assert "gain − placebo" in (tmp_path / "c" / "copies.md").read_text()
    r = run_inprocess(
        capsys,
        "eval",
        "passkey",
        *common,
        "--trials",
        "3",
        "--distances",
        "32,128",
        "--out",
        str(tmp_path / "p"),
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "p" / "passkey.json").read_text())
    rows = res["models"][0]["rows"]
    assert [x["distance"] for x in rows] == [32, 128] and rows[0]["n"] == 3
    assert "probes" in rows[0] and "probes" not in rows[1]  # probes up to T = 64
    assert (tmp_path / "p" / "passkey.png").stat().st_size > 0

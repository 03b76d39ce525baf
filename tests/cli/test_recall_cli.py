"""`swax eval recall` (the window study's metric for one model) and `swax demo recall`."""

import json
import shutil

import pytest

from swax.cli import main
from swax.data import DataConfig, SyntheticConfig, build_datasets, load_model_tokenizer
from swax.model import SwaxLM
from swax.probes.episodes import episode_accuracy
from swax.train import train
from tests.train.test_train import small_cfg

MQAR = [
    "data.synthetic.task=mqar",
    "data.synthetic.fraction=1.0",
    "data.synthetic.num_needles=2",
    "data.synthetic.num_queries=2",
    "data.synthetic.min_distance=4",
    "window.kind=fixed",
    "window.fixed=8",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("recall")
    train(small_cfg(root, "steps=2", *MQAR, name="r"))
    return root / "r"


def test_eval_recall_reads_the_run_and_writes_the_study_format(run, tmp_path, capsys):
    out = tmp_path / "res"
    args = [
        "eval",
        "recall",
        "--model",
        str(run / "model"),
        "--lengths",
        "1x,2x",
        "--samples",
        "6",
        "--out",
        str(out),
        "--threads",
        "1",
        "--bucket-samples",
        "4",
    ]
    assert main(args) == 0
    res = json.loads((out / "recall.json").read_text())
    assert res["windows"] == {"long": 32, "train": 8} and res["seq_len"] == 64
    assert res["episodes"]["num_needles"] == 2  # the run's own episodes
    for label, window in res["windows"].items():
        got = res[f"episodes_{label}"]
        assert set(got) == {"64", "128"}
        # the same episodes scored directly (the study's metric, episodes from the seed)
        model = SwaxLM.from_pretrained(run / "model").eval()
        tok = load_model_tokenizer(run / "model")
        _, val = build_datasets(DataConfig(), tok, seq_len=1, seed=0)
        cfg = SyntheticConfig(
            task="mqar", fraction=1.0, num_needles=2, num_queries=2, min_distance=4
        )
        ref = episode_accuracy(
            model, tok, val.tokens, [64, 128], 6, cfg, window=window, seed=42, progress=False
        )
        for n in (64, 128):
            assert got[str(n)]["acc"] == ref[n]["acc"] and got[str(n)]["n"] == 12
    text = capsys.readouterr().out
    assert "64 (1x)" in text and "128 (2x)" in text and "train" in text
    # recall by distance bucket: the run's windows (fixed 8, long 32) and length 64
    assert res["bucket_windows"] == {"short": 8, "long": 32, "seq_len": 64}
    rows = res["buckets"]
    assert [(r["lo"], r["hi"]) for r in rows] == [(0, 8), (8, 32), (32, 64), (64, 256), (256, 1024)]
    assert [r["length"] for r in rows] == [64, 64, 64, 256, 1024]
    for r in rows:  # 4 episodes of 2 answers: the first always in the bucket, the second maybe
        assert 4 <= r["n"] <= 8 and set(r["probes"]) == {"window_cut", "reset"}
    assert res["laziness"]["kind"] in ("lazy", "memory", "partial", "none")
    assert "(W_long, T]" in text and "inside W_long" in text
    # read as a person would: named windows (no Python dict), a line on how to read the table
    assert "windows: long 32, train 8" in text and "{'" not in text
    assert "how to read:" in text and "chance 6.2%" in text
    assert "not trained on retrieval" not in text  # it was: its data were all episodes


def test_eval_recall_says_when_the_model_never_trained_on_retrieval(tmp_path, capsys):
    """A run folder (standing for its model/) whose data had no episodes: the reading line says
    that recall near chance is expected."""
    train(small_cfg(tmp_path, "steps=1", name="text"))
    args = [
        "eval",
        "recall",
        "--model",
        str(tmp_path / "text"),
        "--lengths",
        "1x",
        "--samples",
        "2",
        "--bucket-samples",
        "0",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "not trained on retrieval" in text and "data.synthetic.fraction is 0" in text


def test_eval_recall_bucket_edges_are_checked(run, tmp_path, capsys):
    args = [
        "eval",
        "recall",
        "--model",
        str(run / "model"),
        "--lengths",
        "1x",
        "--samples",
        "2",
        "--out",
        str(tmp_path / "o"),
        "--buckets",
        "32,8,64",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "--buckets: expected SHORT,LONG,T" in err and "'32,8,64'" in err and "\n" not in err


def test_eval_recall_errors_are_one_line(run, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(run / "model", bare)  # a model folder without its run around it
    args = ["eval", "recall", "--model", str(bare), "--lengths", "2x", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("swax: error: --lengths 2x: a multiple of the training length")
    assert "\n" not in err


@pytest.mark.slow
def test_demo_recall_trains_both_models_and_prints_recall_by_length(tmp_path):
    """`swax demo recall` with fewer steps (the full one is about 4 minutes): both models
    trained, the table printed, recall.json with each model's recall at 1x ... 32x; a second
    call reuses the runs."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "swax",
        "demo",
        "recall",
        "--run-dir",
        str(tmp_path / "d"),
        "steps=60",
        "--threads",
        "1",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "short W=8" in r.stdout and "long W=64" in r.stdout and "(32x train)" in r.stdout
    res = json.loads((tmp_path / "d" / "recall.json").read_text())
    assert set(res) == {"short", "long"}
    assert sorted(map(int, res["short"])) == [64 * m for m in (1, 2, 4, 8, 16, 32)]
    for role in ("short", "long"):
        assert (tmp_path / "d" / role / "model" / "model.safetensors").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "swax train:" not in again.stdout + again.stderr
    assert "reusing the finished short-window run" in again.stdout

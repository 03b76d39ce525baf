"""swax eval: the NIAH runner with stub models, perplexity by position, comparison, the CLI."""

import csv
import json
import re

import numpy as np
import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.data import ByteTokenizer
from swax.eval.compare import compare
from swax.eval.niah import SwaxPredictor, format_table, parse_lengths, run_niah
from swax.eval.ppl import bucketize, position_losses
from swax.eval.ruler import TASKS

NEEDLE = re.compile(r"One of the special magic \w+ for (.+?) is: (\S+?)\.(?:\s|$)")


def echo_needle(prompt: str, max_new_tokens: int) -> str:
    """A stub model that reads the needles and answers with the values of the queried keys."""
    question = prompt[prompt.rindex("What ") :]
    found = []
    for key, value in NEEDLE.findall(prompt):
        if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", question):
            found.append(value)
    return " " + ", ".join(found)


def constant(prompt: str, max_new_tokens: int) -> str:
    return " I do not know."


@pytest.fixture(scope="module")
def echo_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("niah") / "echo"
    res = run_niah(
        echo_needle,
        ByteTokenizer(),
        list(TASKS),
        [1024, 2048],
        samples=2,
        seed=1,
        out_dir=out,
        progress=False,
    )
    return out, res


def test_echo_model_scores_100_and_constant_scores_0(echo_results, tmp_path):
    out, res = echo_results
    for task in TASKS:
        assert res.scores[task] == {1024: 100.0, 2048: 100.0}, task
    const = run_niah(
        constant, ByteTokenizer(), list(TASKS), [1024], samples=2, seed=1, progress=False
    )
    assert all(const.scores[t][1024] == 0.0 for t in TASKS)


def test_predictions_are_cleaned_as_ruler_does(tmp_path):
    """Control characters become newlines before scoring (RULER's postprocess_pred): a value
    split by one is not found, one followed by one is."""

    def split_value(prompt: str, max_new_tokens: int) -> str:
        value = echo_needle(prompt, max_new_tokens).strip()
        return f"\t{value[:3]}\x00{value[3:]}\x1b\n"

    def value_then_control(prompt: str, max_new_tokens: int) -> str:
        return f"\x01{echo_needle(prompt, max_new_tokens).strip()}\x1b junk\x7f"

    args = (ByteTokenizer(), ["niah_single_1"], [1024])
    split = run_niah(split_value, *args, samples=2, seed=1, out_dir=tmp_path, progress=False)
    assert split.scores["niah_single_1"][1024] == 0.0
    rows = [json.loads(ln) for ln in (tmp_path / "pred" / "niah_single_1-1024.jsonl").open()]
    for row in rows:
        value = row["outputs"][0]
        assert row["pred"] == f"{value[:3]}\n{value[3:]}"
    kept = run_niah(value_then_control, *args, samples=2, seed=1, progress=False)
    assert kept.scores["niah_single_1"][1024] == 100.0


def test_results_folder(echo_results):
    out, res = echo_results
    data = json.loads((out / "results.json").read_text())
    assert data["average"] == {"1024": 100.0, "2048": 100.0}
    rows = list(csv.reader((out / "summary.csv").open()))
    assert rows[0] == ["task", "length", "score", "nulls", "samples"]
    assert len(rows) == 1 + 2 * len(TASKS)
    ruler_rows = list(csv.reader((out / "summary-1024.csv").open()))
    assert ruler_rows[0] == ["Tasks", *TASKS]
    assert ruler_rows[1][0] == "Score" and ruler_rows[2][0] == "Nulls"
    for task in TASKS:
        assert (out / f"heatmap-{task}.png").read_bytes()[:4] == b"\x89PNG"
        preds = [json.loads(ln) for ln in (out / "pred" / f"{task}-1024.jsonl").open()]
        assert len(preds) == 2 and all(p["score"] == 100.0 for p in preds)
    table = format_table(res, list(TASKS), [1024, 2048])
    assert "average" in table and "1k" in table and "2k" in table


def test_length_axes_are_labelled_with_lengths():
    from swax.core.plotting import draw_curves, format_length, pyplot

    lengths = [512, 1024, 4096, 131072, 2**20, 1536]
    assert [format_length(n) for n in lengths] == ["512", "1k", "4k", "128k", "1M", "1.5k"]
    plt = pyplot()
    fig, ax = plt.subplots()
    draw_curves(ax, {"a": ([512, 1024, 4096], [1.0, 2.0, 3.0])}, "length", "loss")
    fig.canvas.draw()
    labels = {t.get_text() for t in ax.get_xticklabels()}
    plt.close(fig)
    assert {"512", "1k", "2k", "4k"} <= labels, labels


def test_parse_lengths():
    assert parse_lengths("4k,8k,16k,32k,65k,131k") == [4096, 8192, 16384, 32768, 65536, 131072]
    assert parse_lengths("128k,1000") == [131072, 1000]


def test_position_losses_equal_a_full_forward():
    """Chunked with state passing vs one full forward computed independently here."""
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=50, window=8)).eval()
    tokens = np.random.default_rng(0).integers(0, 50, size=400)
    got = position_losses(model, tokens, length=100, samples=3, chunk=17, progress=False)
    starts = [0, 150, 300]
    for i, s in enumerate(starts):
        ids = torch.as_tensor(tokens[s : s + 100])[None]
        with torch.no_grad():
            logp = model(ids).log_softmax(-1)[0]
        ref = -logp[torch.arange(99), ids[0, 1:]].double().numpy()
        assert np.abs(got[i] - ref).max() < 1e-4


@pytest.mark.parametrize("window", [None, 8, "default"])
def test_position_losses_window_none_is_full_attention(window):
    # None used to mean the model's window here (so `swax eval ppl --window full` scored with
    # it); it is full attention, as in SwaxLM.forward. Reference: one plain forward.
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=50, window=8)).eval()
    tokens = np.random.default_rng(1).integers(0, 50, size=60)
    arg = {} if window == "default" else {"window": window}
    meant = 8 if window == "default" else window  # the window the call should use
    got = position_losses(model, tokens, length=60, samples=1, chunk=17, progress=False, **arg)
    ids = torch.as_tensor(tokens)[None]

    def nll(w):
        with torch.no_grad():
            logp = model(ids, window=w).log_softmax(-1)[0]
        return -logp[torch.arange(59), ids[0, 1:]].double().numpy()

    assert np.abs(got[0] - nll(meant)).max() < 1e-4
    assert np.abs(nll(None) - nll(8)).max() > 1e-2  # the windows differ on these 60 tokens
    assert SwaxPredictor(model, None, **arg).window == meant


def test_bucketize_hand_computed():
    losses = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    rows = bucketize(losses, [2, 4, 8])
    assert [r["loss"] for r in rows] == [1.5, 3.5, 6.0]
    assert [r["tokens"] for r in rows] == [2, 2, 3]


def test_compare_merges_folders(tmp_path, echo_results):
    out, _ = echo_results
    other = tmp_path / "zero"
    run_niah(
        constant,
        ByteTokenizer(),
        ["niah_single_1"],
        [1024, 2048],
        samples=1,
        out_dir=other,
        progress=False,
        settings={"label": "const"},
    )
    table = compare([out, other], tmp_path / "cmp")
    assert "echo" in table and "const" in table
    rows = list(csv.reader((tmp_path / "cmp" / "compare.csv").open()))
    assert rows[0] == ["model", "1024", "2048"]
    assert rows[1][1:] == ["100.0", "100.0"] and rows[2][1:] == ["0.0", "0.0"]
    assert (tmp_path / "cmp" / "compare.png").is_file()


# ------------------------------------------------------------------------------ CLI


def cli(*args):
    from swax.cli import main

    return main(list(args))


def test_eval_niah_cli_random_model(tmp_path, capsys):
    rc = cli(
        "eval",
        "niah",
        "--preset",
        "tiny",
        "--lengths",
        "1k",
        "--tasks",
        "niah_single_1",
        "--samples",
        "1",
        "--out",
        str(tmp_path / "r"),
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "niah_single_1" in out and "average" in out and "peak memory" in out
    assert (tmp_path / "r" / "results.json").is_file()


def test_eval_niah_dump_and_records(tmp_path, capsys):
    assert (
        cli(
            "eval",
            "niah",
            "--dump",
            str(tmp_path / "d"),
            "--tokenizer",
            "byte",
            "--lengths",
            "1k",
            "--tasks",
            "niah_single_1,niah_multivalue",
            "--samples",
            "2",
        )
        == 0
    )
    recs = [json.loads(ln) for ln in (tmp_path / "d" / "niah_single_1-1024.jsonl").open()]
    assert len(recs) == 2 and {"index", "input", "outputs", "length", "answer_prefix"} <= set(
        recs[0]
    )
    (tmp_path / "d" / "niah_single_1-1024.jsonl").write_text('{"index": 0, "input": \n')
    rc = cli(
        "eval",
        "niah",
        "--preset",
        "tiny",
        "--records",
        str(tmp_path / "d"),
        "--lengths",
        "1k",
        "--tasks",
        "niah_single_1",
        "--samples",
        "1",
        "--out",
        str(tmp_path / "o"),
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("swax: error:") and "niah_single_1-1024" in err[-1]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["niah", "--model", "/no/such/model"], "/no/such/model"),
        (["niah", "--preset", "tiny", "--tasks", "niah_single_9"], "niah_single_9"),
        (["niah"], "--model"),
        (["ppl", "--model", "/no/such/model"], "/no/such/model"),
        (["compare", "/no/such/results"], "/no/such/results"),
    ],
)
def test_eval_cli_errors_one_line(args, needle, capsys):
    rc = cli("eval", *args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("swax: error:") and needle in err[0], err


def test_eval_ppl_cli(tmp_path, capsys):
    text = tmp_path / "held.txt"
    text.write_text("And it came to pass in those days. " * 200)
    rc = cli(
        "eval",
        "ppl",
        "--preset",
        "tiny",
        "--data",
        str(text),
        "--lengths",
        "256,1k,2k",
        "--samples",
        "2",
        "--out",
        str(tmp_path / "p"),
    )
    assert rc == 0
    rows = list(csv.DictReader((tmp_path / "p" / "ppl.csv").open()))
    assert [int(r["bucket_end"]) for r in rows] == [256, 1024, 2048]
    assert (tmp_path / "p" / "ppl.png").is_file()


def test_episode_accuracy_matches_a_full_forward():
    """Chunked top-1 predictions at the answers vs one full forward, computed here."""
    from swax.data import SyntheticConfig
    from swax.data.synthetic import make_episode
    from swax.probes.episodes import episode_accuracy

    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=16)).eval()
    tok = ByteTokenizer()
    hay = np.array(tok.encode("and the earth was without form, and void; " * 300))
    cfg = SyntheticConfig(compact=True, num_needles=3, num_queries=2)
    got = episode_accuracy(
        model,
        tok,
        hay,
        [300, 700],
        samples=3,
        cfg=cfg,
        window=16,
        seed=7,
        chunk=64,
        progress=False,
        batch_size=2,
    )
    for length in (300, 700):
        correct = total = 0
        nll, n_tok = 0.0, 0
        for s in range(3):
            ep = make_episode(
                np.random.default_rng([7, length, s]), tok, hay, length, cfg, split="eval"
            )
            ids = torch.tensor([ep.tokens])
            with torch.no_grad():
                logits = model(ids, window=16)[0]
            top = logits.argmax(-1)
            logp = torch.log_softmax(logits.double(), -1)
            for a0, a1 in ep.answer_spans:
                correct += all(int(top[p - 1]) == ep.tokens[p] for p in range(a0, a1))
                total += 1
                nll -= sum(float(logp[p - 1, ep.tokens[p]]) for p in range(a0, a1))
                n_tok += a1 - a0
        assert got[length]["n"] == total
        assert got[length]["nll"] == pytest.approx(nll / n_tok, rel=1e-4)
        assert got[length]["acc"] == pytest.approx(100.0 * correct / total)
        assert sum(t for _, t in got[length]["by_depth"].values()) == total


class InductionStub:
    """A stand-in model that predicts, at every position, the token that followed the most
    recent earlier occurrence of the longest suffix (up to 8 tokens) of the context: perfect
    retrieval for key-value episodes. Keeps the context as its state, like a real model."""

    class config:  # noqa: N801
        window = 16

    embed = torch.nn.Embedding(1, 1)
    V = 257

    def __call__(self, x, window=None, state=None, return_state=False, logits_to_keep=None):
        ctxs = [([] if state is None else list(state[b])) + x[b].tolist() for b in range(len(x))]
        start = len(ctxs[0]) - x.shape[1]
        logits = torch.full((len(x), x.shape[1], self.V), -1e9)
        for b, ctx in enumerate(ctxs):
            for t in range(start, len(ctx)):
                for n in range(8, 0, -1):
                    suffix = ctx[t - n + 1 : t + 1]
                    hit = next(
                        (i for i in range(t - 1, n - 2, -1) if ctx[i - n + 1 : i + 1] == suffix),
                        None,
                    )
                    if hit is not None:
                        logits[b, t - start, ctx[hit + 1]] = 0.0
                        break
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return (logits, ctxs) if return_state else logits


def test_episode_accuracy_with_a_perfect_retriever():
    from swax.data import SyntheticConfig
    from swax.probes.episodes import episode_accuracy

    tok = ByteTokenizer()
    hay = np.array(tok.encode("and the earth was without form, and void; " * 300))
    cfg = SyntheticConfig(compact=True, num_needles=3, num_queries=2)
    got = episode_accuracy(
        InductionStub(), tok, hay, [300, 600], samples=2, cfg=cfg, seed=3, chunk=128, progress=False
    )
    assert got[300]["acc"] == 100.0 and got[600]["acc"] == 100.0
    assert got[300]["nll"] == pytest.approx(0.0, abs=1e-6)  # all mass on the right digit


# ------------------------------------------------------------------ output folders: no mixing


def _boom(*args, **kwargs):
    raise AssertionError("the work started before the output folder was checked")


def run_cli(capsys, *args):
    """(exit status, stdout, stderr lines) of ``swax ARGS`` in this process."""
    rc = cli(*args)
    out, err = capsys.readouterr()
    return rc, out, [ln for ln in err.splitlines() if ln.strip()]


def _niah_folder(out, lengths=(1024, 2048), label="echo"):
    run_niah(
        echo_needle,
        ByteTokenizer(),
        ["niah_single_1"],
        list(lengths),
        samples=1,
        out_dir=out,
        progress=False,
        settings={"label": label},
    )
    return out


def _ppl_folder(out, label="ppl-model"):
    from swax.eval.ppl import write_ppl

    rows = bucketize(np.array([[1.0, 2.0, 3.0, 4.0]]), [2, 4])
    write_ppl(out, rows, {"label": label})
    return out


def _tasks_folder(out, label="tasks-model"):
    from swax.eval.tasks import write_results

    results = {
        "piqa": {
            "source": "piqa.jsonl",
            "metrics": {"n": 2, "num_fewshot": 0, "acc": 0.5, "acc_norm": 1.0},
            "records": [{"line": 1}, {"line": 2}],
        }
    }
    write_results(out, results, {"label": label})
    return out


# command -> (arguments before --out, a writer of that command's results into a folder)
EVAL_OUTPUTS = {
    "niah": (["eval", "niah", "--preset", "tiny", "--lengths", "1k"], _niah_folder),
    "tasks": (["eval", "tasks", "--preset", "tiny"], _tasks_folder),
    "ppl": (["eval", "ppl", "--preset", "tiny"], _ppl_folder),
}


@pytest.mark.parametrize("command", [*EVAL_OUTPUTS, "compare", "dump"])
def test_eval_refuses_a_folder_of_earlier_results(tmp_path, capsys, monkeypatch, command):
    # a second swax eval niah into the same --out left the first run's summary-1024.csv and
    # pred/*-1024.jsonl beside the new results; swax eval ppl overwrote without notice
    import swax.cli.evaluate
    import swax.eval.compare
    import swax.eval.niah

    out = tmp_path / "out"
    if command == "compare":
        argv = ["eval", "compare", str(_niah_folder(tmp_path / "niah")), "--out", str(out)]
        compare([tmp_path / "niah"], out)
        monkeypatch.setattr(swax.cli.evaluate, "compare", _boom)
    elif command == "dump":
        argv = ["eval", "niah", "--dump", str(out), "--lengths", "1k", "--tasks", "niah_single_1"]
        assert cli(*argv, "--samples", "1") == 0
        monkeypatch.setattr(swax.cli.evaluate, "dump_records", _boom)
    else:
        args, write = EVAL_OUTPUTS[command]
        write(out)
        argv = [*args, "--out", str(out)]
    monkeypatch.setattr(swax.cli.evaluate, "load_for", _boom)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("swax: error: ") and str(out) in err[0] and "--overwrite" in err[0]
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing touched


@pytest.mark.parametrize("command", [*EVAL_OUTPUTS, "compare"])
def test_eval_never_deletes_other_files(tmp_path, capsys, monkeypatch, command):
    import swax.cli.evaluate
    import swax.eval.compare

    out = tmp_path / "out"
    if command == "compare":
        args = ["eval", "compare", str(_niah_folder(tmp_path / "niah"))]
        compare([tmp_path / "niah"], out)
        monkeypatch.setattr(swax.cli.evaluate, "compare", _boom)
    else:
        args, write = EVAL_OUTPUTS[command]
        write(out)
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(swax.cli.evaluate, "load_for", _boom)
    for extra in ([], ["--overwrite"]):
        rc, _, err = run_cli(capsys, *args, "--out", str(out), *extra)
        assert rc == 2 and len(err) == 1 and "notes.txt" in err[0] and str(out) in err[0], err
    assert (out / "notes.txt").read_text() == "mine"


def test_eval_niah_overwrite_removes_the_earlier_results(tmp_path, capsys, monkeypatch):
    import swax.eval.niah

    out = _niah_folder(tmp_path / "out", lengths=(1024, 2048))
    assert (out / "summary-2048.csv").is_file() and (
        out / "pred/niah_single_1-2048.jsonl"
    ).is_file()
    monkeypatch.setattr(swax.cli.evaluate, "SwaxPredictor", lambda *a, **k: constant)
    args = ["eval", "niah", "--preset", "tiny", "--lengths", "1k", "--tasks", "niah_single_1"]
    rc, _, err = run_cli(capsys, *args, "--samples", "1", "--out", str(out), "--overwrite")
    assert rc == 0, err
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert names == [
        "heatmap-niah_single_1.png",
        "pred",
        "pred/niah_single_1-1024.jsonl",
        "results.json",
        "summary-1024.csv",
        "summary.csv",
    ]
    assert json.loads((out / "results.json").read_text())["settings"]["lengths"] == [1024]


def test_eval_ppl_overwrite_replaces_its_files(tmp_path, capsys):
    text = tmp_path / "held.txt"
    text.write_text("And it came to pass in those days. " * 40)
    out = _ppl_folder(tmp_path / "p")
    args = ["eval", "ppl", "--preset", "tiny", "--data", str(text), "--lengths", "64,128"]
    rc, _, err = run_cli(capsys, *args, "--samples", "1", "--out", str(out))
    assert rc == 2 and "--overwrite" in err[0]
    rc, _, err = run_cli(capsys, *args, "--samples", "1", "--out", str(out), "--overwrite")
    assert rc == 0, err
    rows = list(csv.DictReader((out / "ppl.csv").open()))
    assert [int(r["bucket_end"]) for r in rows] == [64, 128]
    assert sorted(p.name for p in out.iterdir()) == ["ppl.csv", "ppl.json", "ppl.png"]


def test_check_output_dir(tmp_path):
    from swax.core.errors import SwaxError
    from swax.core.paths import check_output_dir

    outputs = ["results.json", "summary-[0-9]*.csv", "pred/*.jsonl"]
    new = tmp_path / "new" / "out"
    assert check_output_dir(new, "--out", outputs, "cmd") == new and not new.exists()
    d = tmp_path / "d"
    (d / "pred").mkdir(parents=True)
    check_output_dir(d, "--out", outputs, "cmd")  # an empty output folder inside: fine
    for name in ("results.json", "summary-1024.csv", "pred/a.jsonl"):
        (d / name).write_text("x")
    with pytest.raises(SwaxError, match=r"--out .*d already holds results of cmd.*--overwrite"):
        check_output_dir(d, "--out", outputs, "cmd")
    (d / "pred" / "keep.txt").write_text("mine")  # not an output, even in an output folder
    (d / "sub").mkdir()  # an empty folder the command does not make
    for overwrite in (False, True):
        with pytest.raises(SwaxError, match="does not write"):
            check_output_dir(d, "--out", outputs, "cmd", overwrite)
    (d / "pred" / "keep.txt").unlink()
    (d / "sub").rmdir()
    (tmp_path / "target.json").write_text("elsewhere")
    (d / "summary-2048.csv").symlink_to(tmp_path / "target.json")
    check_output_dir(d, "--out", outputs, "cmd", overwrite=True)
    assert list(d.iterdir()) == [] and (tmp_path / "target.json").read_text() == "elsewhere"


# -------------------------------------------------------------- compare: every kind of results


def test_compare_reads_niah_tasks_and_ppl_results(tmp_path, capsys):
    # swax eval compare refused a tasks results folder ("holds no 'average'")
    niah = _niah_folder(tmp_path / "niah", label="echo")
    tasks = _tasks_folder(tmp_path / "tasks", label="m")
    ppl = _ppl_folder(tmp_path / "ppl", label="m")
    out = tmp_path / "cmp"
    rc, stdout, err = run_cli(
        capsys, "eval", "compare", str(niah), str(tasks), str(ppl), "--out", str(out)
    )
    assert rc == 0, err
    assert "NIAH accuracy" in stdout and "short-context tasks" in stdout and "by position" in stdout
    rows = list(csv.reader((out / "compare-tasks.csv").open()))
    assert rows == [["task", "metric", "m"], ["piqa", "acc", "0.5"], ["piqa", "acc_norm", "1.0"]]
    assert re.search(r"^piqa +acc_norm +100\.00$", stdout, re.M), stdout
    rows = list(csv.reader((out / "compare-ppl.csv").open()))
    assert rows == [["bucket_end", "m"], ["2", "1.5"], ["4", "3.5"]]
    rows = list(csv.reader((out / "compare.csv").open()))
    assert rows == [["model", "1024", "2048"], ["echo", "100.0", "100.0"]]
    assert {p.name for p in out.iterdir()} == {
        "compare.csv",
        "compare.png",
        "compare-tasks.csv",
        "compare-ppl.csv",
        "compare-ppl.png",
    }


def test_compare_tasks_folders_written_by_the_command(tmp_path, capsys):
    """Two real swax eval tasks runs (the bundled samples) side by side."""
    outs = []
    for label in ("a", "b"):
        outs.append(str(tmp_path / label))
        args = ["eval", "tasks", "--preset", "tiny", "--tasks", "arc_easy,lambada", "--limit", "2"]
        rc, _, err = run_cli(capsys, *args, "--label", label, "--out", outs[-1])
        assert rc == 0, err
    rc, stdout, err = run_cli(capsys, "eval", "compare", *outs, "--out", str(tmp_path / "c"))
    assert rc == 0, err
    rows = list(csv.reader((tmp_path / "c" / "compare-tasks.csv").open()))
    assert rows[0] == ["task", "metric", "a", "b"]
    assert [r[:2] for r in rows[1:]] == [
        ["arc_easy", "acc"],
        ["arc_easy", "acc_norm"],
        ["lambada", "acc"],
        ["lambada", "perplexity"],
    ]
    saved = json.loads((tmp_path / "a" / "results.json").read_text())["tasks"]
    assert float(rows[4][2]) == pytest.approx(saved["lambada"]["perplexity"])


# ------------------------------------------------------------ niah --records: tasks and lengths


@pytest.fixture
def dumped(tmp_path, capsys):
    d = tmp_path / "records"
    args = ["eval", "niah", "--dump", str(d), "--lengths", "1k,2k", "--samples", "2"]
    assert cli(*args, "--tasks", "niah_single_1,niah_multikey_1") == 0
    capsys.readouterr()
    return d


def test_eval_niah_records_alone_takes_their_tasks_and_lengths(
    dumped, tmp_path, capsys, monkeypatch
):
    # --records DIR needed --tasks and --lengths repeated (else: "no niah_single_1-4096.jsonl")
    import swax.cli.evaluate

    monkeypatch.setattr(swax.cli.evaluate, "SwaxPredictor", lambda *a, **k: echo_needle)
    out = tmp_path / "o"
    rc, stdout, err = run_cli(
        capsys, "eval", "niah", "--preset", "tiny", "--records", str(dumped), "--out", str(out)
    )
    assert rc == 0, err
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["tasks"] == ["niah_single_1", "niah_multikey_1"]
    assert settings["lengths"] == [1024, 2048] and settings["samples"] == 2
    assert "2 samples per cell" in stdout and "niah_multikey_1  100.0  100.0" in stdout
    # explicit flags narrow them
    out = tmp_path / "o2"
    rc, _, err = run_cli(
        capsys,
        "eval",
        "niah",
        "--preset",
        "tiny",
        "--records",
        str(dumped),
        "--out",
        str(out),
        "--lengths",
        "2k",
        "--tasks",
        "niah_multikey_1",
    )
    assert rc == 0, err
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["tasks"] == ["niah_multikey_1"] and settings["lengths"] == [2048]


def test_eval_niah_records_missing_cells_name_the_file(dumped, tmp_path, capsys, monkeypatch):
    import swax.cli.evaluate

    monkeypatch.setattr(swax.cli.evaluate, "load_for", _boom)
    (dumped / "niah_multikey_1-2048.jsonl").unlink()
    base = [
        "eval",
        "niah",
        "--preset",
        "tiny",
        "--records",
        str(dumped),
        "--out",
        str(tmp_path / "o"),
    ]
    for extra, needle in (
        ([], "niah_multikey_1-2048.jsonl"),  # not a full table: which file is missing
        (["--lengths", "4k"], "niah_single_1-4096.jsonl"),
        (["--tasks", "niah_single_2"], "niah_single_2"),
    ):
        rc, _, err = run_cli(capsys, *base, *extra)
        assert rc == 2 and len(err) == 1 and needle in err[0] and str(dumped) in err[0], err
    empty = ["eval", "niah", "--preset", "tiny", "--records", str(tmp_path / "o")]
    (tmp_path / "o").mkdir()
    rc, _, err = run_cli(capsys, *empty, "--out", str(tmp_path / "o2"))
    assert rc == 2 and "no TASK-LENGTH.jsonl" in err[0], err


def test_niah_reports_prefill_and_decode_throughput(tmp_path):
    """results.json and the table carry the model's tokens/s by length; the token counts behind
    them equal what the model was actually called with (hooks count the tokens of every call:
    prefill chunks through the forward first, then one-token decode steps, which go to the
    embedding with one id per row)."""
    tok = ByteTokenizer()
    torch.manual_seed(0)
    cfg = SwaxConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=tok.vocab_size, window=16)
    model = SwaxLM(cfg).eval()
    calls: list[int] = []
    model.register_forward_pre_hook(
        lambda m, args, kw: calls.append(args[0].shape[1]), with_kwargs=True
    )
    model.embed.register_forward_pre_hook(
        lambda m, args: calls.append(1) if args[0].ndim == 1 else None
    )
    inner = SwaxPredictor(model, tok, prefill_chunk=300)
    inner("a first call warms the model up", 3)  # (its untimed warm-up calls are not counted)
    want = {}

    def predict(prompt, n):
        calls.clear()
        text = inner(prompt, n)
        P = len(tok.encode(prompt))
        n_pre = -(-P // 300)
        assert sum(calls[:n_pre]) == P and set(calls[n_pre:]) <= {1}
        length = 1024 if P < 1536 else 2048
        w = want.setdefault(length, [0, 0])
        w[0] += P
        w[1] += len(calls) - n_pre
        return text

    class Spy:  # predicts through ``predict`` and reports the inner predictor's timing
        def __call__(self, prompt, n):
            return predict(prompt, n)

        @property
        def last_timing(self):
            return inner.last_timing

    res = run_niah(
        Spy(), tok, ["niah_single_1"], [1024, 2048], samples=2, out_dir=tmp_path, progress=False
    )
    data = json.loads((tmp_path / "results.json").read_text())["throughput"]
    assert set(data) == {"1024", "2048"}
    for length, (pre, dec) in want.items():
        t = data[str(length)]
        assert (t["prefill_tokens"], t["decode_tokens"]) == (pre, dec)
        assert t["prefill_s"] > 0 and t["decode_s"] > 0
        assert t["prefill_tokens_per_s"] == pytest.approx(pre / t["prefill_s"], rel=1e-3)
    table = format_table(res, ["niah_single_1"], [1024, 2048])
    assert "prefill tok/s" in table.splitlines()[-2] and "decode tok/s" in table.splitlines()[-1]
    assert len(table.splitlines()[-2].split()) == 2 + 2  # the label's two words, two lengths


@pytest.mark.parametrize(
    "window, train, edges",
    [
        # stochastic: trained with the short window too; buckets at (short, long, T)
        ({"kind": "stochastic", "short": 8, "long": 32}, {"train": 8}, (8, 32, 64)),
        # fixed at the long window: nothing but the long window, buckets keep the short edge
        ({"kind": "fixed", "short": 8, "long": 32}, {}, (8, 32, 64)),
        # fixed below the short window: the inner bucket edge is the window trained with
        ({"kind": "fixed", "short": 16, "long": 32, "fixed": 4}, {"train": 4}, (4, 32, 64)),
        # fixed between short and long
        ({"kind": "fixed", "short": 8, "long": 32, "fixed": 24}, {"train": 24}, (8, 32, 64)),
    ],
)
def test_recall_reads_the_runs_window_schedule(tmp_path, window, train, edges):
    from swax.eval.recall import run_bucket_edges, training_setup

    (tmp_path / "model").mkdir()
    (tmp_path / "config.yaml").write_text(
        json.dumps({"window": window, "seq_len": 64, "data": {"synthetic": {"fraction": 0.0}}})
    )
    trained, windows, seq_len = training_setup(tmp_path / "model")
    assert (trained, windows, seq_len) == (None, train, 64)
    assert run_bucket_edges(tmp_path / "model") == edges
    (tmp_path / "other" / "model").mkdir(parents=True)
    assert run_bucket_edges(tmp_path / "other" / "model") is None  # no run folder around it


def test_recall_names_a_bad_window_in_the_run_config(tmp_path):
    from swax.core.errors import SwaxError
    from swax.eval.recall import run_bucket_edges

    (tmp_path / "model").mkdir()
    (tmp_path / "config.yaml").write_text(
        json.dumps({"window": {"kind": "sliding", "long": 32}, "seq_len": 64})
    )
    with pytest.raises(SwaxError, match=r"config.yaml: window: .*kind.*'sliding'"):
        run_bucket_edges(tmp_path / "model")

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
from swax.eval.niah import format_table, parse_lengths, run_niah
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
    from swax.eval.plots import draw_curves, format_length, pyplot

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
    from swax.eval.episodes import episode_accuracy

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
    from swax.eval.episodes import episode_accuracy

    tok = ByteTokenizer()
    hay = np.array(tok.encode("and the earth was without form, and void; " * 300))
    cfg = SyntheticConfig(compact=True, num_needles=3, num_queries=2)
    got = episode_accuracy(
        InductionStub(), tok, hay, [300, 600], samples=2, cfg=cfg, seed=3, chunk=128, progress=False
    )
    assert got[300]["acc"] == 100.0 and got[600]["acc"] == 100.0
    assert got[300]["nll"] == pytest.approx(0.0, abs=1e-6)  # all mass on the right digit

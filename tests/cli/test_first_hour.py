"""What a new user met in the first hour (issue 52): each item held by a test against the
program or the docs it contradicted."""

import re
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(capsys, *args):
    from swax.cli import main

    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


def test_threads_zero_means_the_same_in_the_docs_and_the_program():
    from swax.core.configs import field_docs
    from swax.train.config import TrainConfig

    doc = field_docs(TrainConfig)["threads"]
    assert doc.startswith("CPU threads for torch: 0 keeps the command's setting")
    cli = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert "`threads=N` key of `swax train` (`0`, its default, keeps the command's setting" in cli
    assert "whatever the load" not in cli


def test_the_compile_default_is_described_as_the_code_applies_it():
    from swax.cli.options import GenerateConfig
    from swax.core.configs import field_docs
    from swax.decode import COMPILE_MIN_TOKENS

    doc = " ".join(field_docs(GenerateConfig)["compile"].split())
    assert f"default: from {COMPILE_MIN_TOKENS} new tokens, on a CPU and a GPU alike" in doc
    assert "default: on a GPU" not in doc


def test_an_idle_machine_is_not_called_busy(monkeypatch):
    import swax.core.threads as T

    monkeypatch.setattr(T, "_cpu_ids", lambda: [0, 1])
    times = iter([(10.0, 100.0), (10.0, 200.0)])  # no one else ran in between
    monkeypatch.setattr(T, "_cpu_times", lambda ids: next(times))
    monkeypatch.setattr(T.time, "sleep", lambda s: None)
    n, why = T.auto_threads()
    assert n == T.usable_cpus() and "0.0 in use by others (measured now)" in why
    assert "busy" not in why


@pytest.mark.parametrize(
    "n, text", [(950, "950"), (41_000, "41.0k"), (3_276_800, "3.28M"), (1.2e9, "1.20B")]
)
def test_token_counts_keep_their_digits(n, text):
    from swax.core.progress import fmt_count

    assert fmt_count(n) == text


def test_a_stop_string_is_kept_in_the_printed_text_and_counted(capsys, monkeypatch):
    """Python's generate keeps the stop string's ids; the command prints the text they make,
    stop string included, and counts every new id."""
    import swax.cli.generate as G
    from swax.data.tokenizer import load_tokenizer

    tok = load_tokenizer("byte")
    new = tok.encode("and it was so.\n\nAnd")  # the model stopped after the stop string

    def fake_generate(model, ids, **kw):
        assert kw["stop_strings"] == ["\n\n"]
        return torch.cat([ids, torch.tensor([new])], 1)

    monkeypatch.setattr(G, "generate", fake_generate)
    r = _run(capsys, "generate", "--preset", "tiny", "--prompt", "x", "--stop", "\n\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "and it was so.\n\nAnd\n"
    assert f"{len(new)} new tokens" in r.stderr
    assert "prompt tokens read in" in r.stderr and "one-off set-up" in r.stderr


def test_a_long_generation_says_how_long_it_would_take(capsys, monkeypatch):
    import swax.cli.generate as G
    from swax.data.tokenizer import load_tokenizer

    clock = iter(range(0, 1000, 5))  # five seconds per reading of the clock
    monkeypatch.setattr(G.time, "perf_counter", lambda: float(next(clock)))
    s = G._Streamer(load_tokenizer("byte"), enabled=False, total=10**9, every=10.0)
    for _ in range(4):
        s(torch.tensor([65]))
    err = capsys.readouterr().err
    # one estimate, once the rate is known: one token in 15 s, 10^9 tokens in about 475 years
    assert err.count("new tokens would take about") == 1
    assert "[0.1 tok/s: 1,000,000,000 new tokens would take about 475 years; Ctrl-C" in err
    short = G._Streamer(load_tokenizer("byte"), enabled=False, total=50, every=10.0)
    for _ in range(4):
        short(torch.tensor([65]))
    assert "would take" not in capsys.readouterr().err


def test_the_docs_examples_name_models_that_make_demo_leaves():
    """runs/tiny is where a bare `swax train` writes; after `make demo` the model is
    runs/demo/model, which the examples that read a model name."""
    for page in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for m in re.finditer(r"--model (\S+)", page.read_text()):
            assert not m.group(1).strip("`").startswith("runs/tiny"), (page.name, m.group(0))

"""The `swax` command: one-line errors with non-zero exits, generation from a checkpoint."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swax import SwaxConfig, SwaxLM


def run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "swax", *args], capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("swax: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("ckpt") / "model"
    SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=16)).save_pretrained(d)
    return d


def test_window_zero(ckpt):
    assert_one_line_error(run("generate", "--model", str(ckpt), "--window", "0"), "window", "0")


def test_missing_checkpoint(tmp_path):
    assert_one_line_error(
        run("generate", "--model", str(tmp_path / "nope")), "does not exist", "nope"
    )


def test_corrupt_checkpoint(ckpt, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((ckpt / "config.json").read_text())
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    r = run("generate", "--model", str(bad))
    assert_one_line_error(r, "model.safetensors", "corrupt")
    # the checkpoint is left as it was
    assert (bad / "model.safetensors").read_bytes() == b"not a safetensors file"


def test_missing_prompt_file(ckpt, tmp_path):
    assert_one_line_error(
        run("generate", "--model", str(ckpt), "--prompt-file", str(tmp_path / "p.txt")), "p.txt"
    )


def test_unknown_preset():
    assert_one_line_error(run("info", "--preset", "huge"), "huge")


def test_generate_from_checkpoint(ckpt):
    r = run(
        "generate", "--model", str(ckpt), "--prompt", "abc", "--max-new-tokens", "8", "--no-stream"
    )
    assert r.returncode == 0, r.stderr
    assert "3 prompt tokens" in r.stderr and "8 new tokens" in r.stderr


def test_info():
    r = run("info", "--preset", "tiny", "--seq-len", "1024")
    assert r.returncode == 0, r.stderr
    assert "SXSX" in r.stdout and "parameters" in r.stdout
    # every backend, usable or why not, with its packages' versions
    lines = {tuple(ln.split()[:2]): ln for ln in r.stdout.splitlines() if ln.startswith("  ")}
    assert lines[("mlstm", "native")].split()[2] == "usable"
    triton = lines[("mlstm", "triton")]
    assert triton.split()[2] in ("usable", "unusable:") and "mlstm_kernels" in triton
    assert "flash-attn" in lines[("swa", "flash")]


def run_inprocess(capsys, *args):
    """``swax ARGS`` in this process (no interpreter start-up): (exit status, stdout, stderr)."""
    from swax.cli import main

    try:
        rc = main(list(args))
    except SystemExit as e:  # argparse errors exit from inside parse_args
        rc = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


@pytest.mark.parametrize(
    "args,needles",
    [
        # an unknown or unusable device is a one-line error, not a torch traceback
        (["--device", "foo"], ["'foo'", "cpu, cuda"]),
        (["--device", "mps"], ["'mps'"]),
        # a non-finite temperature used to reach torch.multinomial and crash
        (["--temperature", "nan"], ["--temperature", "nan"]),
        # option errors come before the random-weights note, so the error is the only line
        (["--max-new-tokens", "-3"], ["--max-new-tokens", ">= 0", "-3"]),
        (["--top-p", "1.5"], ["--top-p", "(0, 1]", "1.5"]),
        (["--top-k", "0"], ["--top-k", "0"]),
    ],
)
def test_bad_generate_options_one_line(capsys, args, needles):
    r = run_inprocess(capsys, "generate", "--preset", "tiny", "--max-new-tokens", "2", *args)
    assert_one_line_error(r, *needles)
    assert r.stdout == ""


def test_empty_stop_string_is_ignored(capsys):
    r = run_inprocess(
        capsys,
        "generate",
        "--preset",
        "tiny",
        "--prompt",
        "abc",
        "--max-new-tokens",
        "6",
        "--stop",
        "",
        "--no-stream",
    )
    assert r.returncode == 0, r.stderr
    assert "6 new tokens" in r.stderr


# ------------------------------------------------------------------------------ one config path


def test_every_command_has_help_with_defaults(capsys):
    from swax.cli import COMMANDS

    names = [
        [name, *([sub] if isinstance(entry, dict) else [])]
        for name, entry in COMMANDS.items()
        for sub in (entry if isinstance(entry, dict) else [None])
    ]
    for args in names:
        r = run_inprocess(capsys, *args, "--help")
        assert r.returncode == 0, (args, r.stderr)
        assert "usage: swax " + " ".join(args) in r.stdout
    r = run_inprocess(capsys, "--help")
    assert "``" not in r.stdout and "generate" in r.stdout
    r = run_inprocess(capsys, "generate", "--help")
    assert "--max-new-tokens N" in r.stdout and "(default: 64)" in r.stdout
    assert "(default: auto)" in r.stdout  # one device default everywhere
    r = run_inprocess(capsys, "train", "--help")
    for key in ("optim.lr", "window.p_short", "data.synthetic.fraction", "checkpoint.every"):
        assert f"  {key} " in r.stdout, key


def test_configs_are_the_same_from_python_and_the_command_line():
    from swax.cli import build_parser
    from swax.cli.args import from_args
    from swax.cli.options import GenerateConfig, NiahConfig

    ns = build_parser().parse_args(
        [
            "generate",
            "--top-k",
            "5",
            "--stop",
            "a",
            "--stop",
            "b",
            "--no-stream",
            "--window",
            "full",
        ]
    )
    cfg = from_args(ns.config_cls, ns)
    assert cfg == GenerateConfig(top_k=5, stop=["a", "b"], stream=False, window="full")
    assert cfg.device == "auto" and cfg.max_new_tokens == 64  # defaults from the dataclass
    ns = build_parser().parse_args(["eval", "niah", "--preset", "tiny", "--samples", "3"])
    assert from_args(ns.config_cls, ns) == NiahConfig(preset="tiny", samples=3)
    with pytest.raises(ValueError, match="samples must be a positive integer, got 0"):
        NiahConfig(samples=0)


def test_parse_window_and_resolve_device():
    from swax.core.errors import ConfigError
    from swax.core.settings import parse_window, resolve_device, resolve_window

    assert [parse_window(x) for x in ("default", "FULL", "none", "128", 64)] == [
        "default",
        "full",
        "full",
        128,
        64,
    ]
    for bad in ("0", "-3", "abc", 2.5, True):
        with pytest.raises(ConfigError, match="window"):
            parse_window(bad)
    assert resolve_window("default", 512) == 512 and resolve_window("full", 512) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("foo", "mps", "cuda:x"):
        with pytest.raises(ConfigError, match="unknown device"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'cuda' requested but CUDA is not available"):
            resolve_device("cuda")
        assert resolve_device("cuda", fallback_to_cpu=True) == torch.device("cpu")


def test_sweep_bad_arguments_are_one_line_errors(tmp_path):
    from pathlib import Path

    sweep = str(Path(__file__).resolve().parents[2] / "experiments/window_sweep/sweep.yaml")
    assert_one_line_error(run("sweep", sweep, "--jobs", "0"), "--jobs", "0")
    assert_one_line_error(run("sweep", sweep, "--only", "nope"), "unknown sweep run 'nope'")
    assert_one_line_error(run("sweep", str(tmp_path / "none.yaml")), "does not exist")
    (tmp_path / "bad.yaml").write_text("runs:\n  a: 1\n")
    assert_one_line_error(
        run("sweep", str(tmp_path / "bad.yaml")), "runs.a: expected a mapping of config keys, got 1"
    )


# ------------------------------------------------------------------------ user errors, bugs

INTERNAL_ERROR = """
import importlib, sys

M = importlib.import_module("swax.cli.main")  # the module (swax.cli.main is also the function)

def broken(cfg):
    raise {exc}("an internal bug (test)")

M.COMMANDS["info"] = (M.COMMANDS["info"][0], broken, "")
sys.exit(M.main(["info", "--preset", "tiny"]))
"""


@pytest.mark.parametrize("exc", ["ValueError", "RuntimeError", "FileNotFoundError"])
def test_an_internal_error_shows_its_traceback(exc):
    """Only a SwaxError (a user error) is one line: any other exception is a bug, and its
    traceback is what a report needs; the exit status is Python's 1, not the usage error's 2."""
    r = subprocess.run(
        [sys.executable, "-c", INTERNAL_ERROR.format(exc=exc)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback (most recent call last)" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"{exc}: an internal bug (test)", r.stderr
    assert "swax: error" not in r.stderr


def test_user_errors_are_swax_errors_and_one_line(capsys, monkeypatch, tmp_path):
    """A SwaxError raised by a command is one line with exit 2 (also one that is a ValueError
    too, as InputError and ConfigError are): here a prompt with ids beyond a model's
    vocabulary (a model of 100 ids with the byte tokenizer's 257)."""
    import importlib

    from swax import InputError
    from swax.data import ByteTokenizer, save_tokenizer

    M = importlib.import_module("swax.cli.main")

    d = tmp_path / "model"
    SwaxLM(SwaxConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=2)).save_pretrained(d)
    save_tokenizer(ByteTokenizer(), d)
    r = run_inprocess(
        capsys, "generate", "--model", str(d), "--prompt", "ab~", "--max-new-tokens", "1"
    )
    assert_one_line_error(r, "token id 126 is out of range for vocab_size 100")  # '~' is 126

    def raises(cfg):
        raise InputError("bad input (test)")

    monkeypatch.setitem(M.COMMANDS, "info", (M.COMMANDS["info"][0], raises, ""))
    assert_one_line_error(run_inprocess(capsys, "info"), "bad input (test)")
    monkeypatch.setitem(M.COMMANDS, "info", (M.COMMANDS["info"][0], lambda c: int("x"), ""))
    with pytest.raises(ValueError, match="invalid literal"):  # a bug: not caught
        run_inprocess(capsys, "info")


# ------------------------------------------------------------------------------ output folders


def _unwritable(tmp_path, kind: str) -> str:
    """A folder path root cannot write either: under a regular file, or in /proc or /sys."""
    if kind == "under_file":
        (tmp_path / "file").write_text("keep me")
        return str(tmp_path / "file" / "out")
    if not Path(f"/{kind}").is_dir():
        pytest.skip(f"no /{kind} here")
    return f"/{kind}/swax-test-out"


def _boom(*args, **kwargs):
    raise AssertionError("the work started before the output folder was checked")


def _sweep_yaml(tmp_path, out: str) -> str:
    p = tmp_path / "sweep.yaml"
    base = "{steps: 1, seq_len: 64, window: {long: 64}}"
    p.write_text(f"out_dir: {out}\nseeds: [0]\nbase: {base}\nruns: {{a: {{}}}}\n")
    return str(p)


EVAL = "swax.cli.evaluate"
OUTPUT_COMMANDS = {
    # command line (OUT: the unwritable path) and what it must not reach: (module, attribute), the
    # name the command calls (its swax.cli module imports these at its top)
    "train": (["train", "run_dir=OUT", "steps=1"], ("swax.cli.train", "train")),
    "demo": (["demo", "--run-dir", "OUT"], ("swax.cli.demo", "train")),
    "eval_niah": (
        ["eval", "niah", "--preset", "tiny", "--out", "OUT"],
        (EVAL, "load_for"),
    ),
    "eval_niah_dump": (["eval", "niah", "--dump", "OUT"], (EVAL, "dump_records")),
    "eval_tasks": (
        ["eval", "tasks", "--preset", "tiny", "--out", "OUT"],
        (EVAL, "load_for"),
    ),
    "eval_ppl": (
        ["eval", "ppl", "--preset", "tiny", "--out", "OUT"],
        (EVAL, "load_for"),
    ),
    "eval_compare": (
        ["eval", "compare", "RESULTS", "--out", "OUT"],
        (EVAL, "compare"),
    ),
    "sweep": (["sweep", "SWEEP"], ("swax.cli.sweep", "run_sweep")),
    "plot_run": (["plot-run", "RUN", "--out", "OUT/loss.png"], ("swax.cli.train", "plot_run")),
}


@pytest.mark.parametrize("kind", ["under_file", "proc", "sys"])
@pytest.mark.parametrize("command", list(OUTPUT_COMMANDS))
def test_unwritable_output_is_one_line_before_the_work(
    tmp_path, capsys, monkeypatch, command, kind
):
    # these were tracebacks (exit 1), or (eval ppl, eval tasks) failed only after evaluating
    import importlib

    out = _unwritable(tmp_path, kind)
    args, (module, attr) = OUTPUT_COMMANDS[command]
    monkeypatch.setattr(importlib.import_module(module), attr, _boom)
    subs = {"OUT": out, "RESULTS": str(tmp_path), "RUN": str(tmp_path)}
    subs["SWEEP"] = _sweep_yaml(tmp_path, out) if command == "sweep" else ""
    args = [next((a.replace(k, v) for k, v in subs.items() if k in a), a) for a in args]
    r = run_inprocess(capsys, *args)
    assert_one_line_error(r, out)
    assert "not writable" in r.stderr or "not a folder" in r.stderr
    if kind == "under_file":  # nothing already saved is touched
        assert (tmp_path / "file").read_text() == "keep me"


def test_unwritable_run_dir_from_the_command_line(tmp_path):
    (tmp_path / "f").write_text("")
    r = run("train", f"run_dir={tmp_path / 'f' / 'run'}", "steps=1")
    assert_one_line_error(r, "run_dir", str(tmp_path / "f" / "run"), "not writable")


def test_check_writable_dir_leaves_no_trace(tmp_path):
    from swax.core.errors import SwaxError
    from swax.core.paths import check_writable_dir

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep.txt").write_text("x")
    assert check_writable_dir(tmp_path / "old", "--out") == tmp_path / "old"
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["keep.txt"]
    check_writable_dir(tmp_path / "a" / "b", "--out")  # checked, then the made folders removed
    assert not (tmp_path / "a").exists()
    check_writable_dir(tmp_path / "a" / "b", "run_dir", keep=True)
    assert (tmp_path / "a" / "b").is_dir()
    with pytest.raises(SwaxError, match="--out .*keep.txt exists and is not a folder"):
        check_writable_dir(tmp_path / "old" / "keep.txt", "--out")


# ------------------------------------------------------------------------------ threads


def test_every_command_takes_threads(capsys):
    from swax.cli import COMMANDS

    for name, entry in COMMANDS.items():
        for sub in entry if isinstance(entry, dict) else [None]:
            r = run_inprocess(capsys, name, *([sub] if sub else []), "--help")
            assert "--threads N" in r.stdout and "SWAX_THREADS" in r.stdout, (name, sub)


def test_threads_option_and_variable_reach_torch(capsys, monkeypatch):
    n = torch.get_num_threads()
    try:
        monkeypatch.delenv("SWAX_THREADS", raising=False)
        assert run_inprocess(capsys, "info", "--preset", "tiny", "--threads", "3").returncode == 0
        assert torch.get_num_threads() == 3
        monkeypatch.setenv("SWAX_THREADS", "2")
        assert run_inprocess(capsys, "info", "--preset", "tiny").returncode == 0
        assert torch.get_num_threads() == 2
        # the option wins over the variable; 0 is one thread per CPU this process may use
        assert run_inprocess(capsys, "info", "--preset", "tiny", "--threads", "3").returncode == 0
        assert torch.get_num_threads() == 3
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
        assert run_inprocess(capsys, "info", "--preset", "tiny", "--threads", "0").returncode == 0
        assert torch.get_num_threads() == 1  # a one-CPU mask on a machine with more cores
    finally:
        torch.set_num_threads(n)


def _stat(busy: int, idle: int, cpus=(0, 1)) -> str:
    """A /proc/stat whose CPUs each have ``busy`` user and ``idle`` idle jiffies."""
    rows = [f"cpu  {busy * len(cpus)} 0 0 {idle * len(cpus)} 0 0 0 0 0 0"]
    rows += [f"cpu{i} {busy} 0 0 {idle} 0 0 0 0 0 0" for i in cpus]
    return "\n".join(rows + ["intr 1 2 3", "ctxt 5"]) + "\n"


def test_cpu_times_read_only_this_process_cpus(tmp_path):
    import swax.core.threads as T

    path = tmp_path / "stat"
    path.write_text(_stat(30, 70, cpus=(0, 1, 2)))
    assert T._cpu_times({0, 2}, str(path)) == (60.0, 200.0)  # two CPUs of 30 + 70
    assert T._cpu_times(None, str(path)) == (90.0, 300.0)
    assert T._cpu_times({0}, str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    "others, cpus, share, expected",
    [(0.0, 2, 1, 2), (0.3, 2, 1, 2), (0.7, 2, 1, 1), (1.0, 2, 1, 1), (2.0, 2, 1, 1),
     (9.0, 2, 1, 1), (0.0, 8, 2, 4), (4.0, 8, 1, 4), (4.0, 8, 2, 2), (None, 4, 1, 4),
     (None, 4, 2, 2)],
)  # fmt: skip
def test_auto_threads_is_the_free_cpus(monkeypatch, others, cpus, expected, share):
    """auto = round(usable CPUs − the others' busy CPUs) per process of ours, at least 1, at
    most the usable CPUs (hand-worked cases)."""
    import swax.core.threads as T

    monkeypatch.setattr(T, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(T, "other_load", lambda: None if others is None else (others, "test"))
    n, why = T.auto_threads(share)
    assert n == expected, why
    assert f"{cpus} usable CPU(s)" in why


def test_other_load_sees_a_busy_cpu():
    """The real /proc/stat: a process spinning on the one CPU this process may use shows as at
    least half a CPU of others' work."""

    if not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/stat"):
        pytest.skip("needs Linux's affinity and /proc/stat")
    code = (
        "import os, subprocess, sys, time\n"
        "import swax.core.threads as T\n"
        "cpu = min(os.sched_getaffinity(0))\n"
        "os.sched_setaffinity(0, {cpu})\n"
        "spin = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "time.sleep(0.5)\n"
        "try:\n"
        "    print(T.other_load(0.5)[0])\n"
        "finally:\n"
        "    spin.kill()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) >= 0.5, r.stdout


def test_auto_is_the_default_and_says_what_it_chose(capsys, monkeypatch):
    """No --threads and no $SWAX_THREADS: a computing command watches the load (auto) and its
    header says what it chose; a command that computes nothing does not wait to look."""
    import swax.core.threads as T

    monkeypatch.delenv("SWAX_THREADS", raising=False)
    monkeypatch.setattr(T, "usable_cpus", lambda: 2)
    looked = []
    monkeypatch.setattr(T, "other_load", lambda: looked.append(1) or (1.6, "measured now"))
    n = torch.get_num_threads()
    try:
        assert run_inprocess(capsys, "info", "--preset", "tiny").returncode == 0
        assert not looked and torch.get_num_threads() == 2
        r = run_inprocess(capsys, "eval", "recall", "--model", "/nonexistent/model")
        assert r.returncode == 2 and looked and torch.get_num_threads() == 1
        assert T.threads_note().startswith("threads 1 (auto: 2 usable CPU(s), 1.6 in use by")
        assert "--threads N" in T.threads_note()
    finally:
        torch.set_num_threads(n)


def test_generate_reports_its_threads(ckpt):
    import os

    env = {**os.environ, "SWAX_THREADS": "1"}
    args = ["generate", "--model", str(ckpt), "--max-new-tokens", "2", "--no-stream"]
    r = subprocess.run(
        [sys.executable, "-m", "swax", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "threads 1 (as asked)]" in r.stderr
    r = run(*args, "--threads", "2")
    assert r.returncode == 0 and "threads 2 (as asked)]" in r.stderr, r.stderr


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_bad_threads_are_one_line(capsys, monkeypatch, value):
    monkeypatch.delenv("SWAX_THREADS", raising=False)
    r = run_inprocess(capsys, "info", "--preset", "tiny", f"--threads={value}")
    assert_one_line_error(r, "--threads", "threads >= 0", repr(value))
    monkeypatch.setenv("SWAX_THREADS", value)
    r = run_inprocess(capsys, "info", "--preset", "tiny")
    assert_one_line_error(r, "SWAX_THREADS", "threads >= 0", repr(value))
    assert r.stdout == ""


def test_train_threads_option_among_overrides(capsys, monkeypatch):
    # argparse ends the key=value list at the first option; the rest still count as overrides

    seen = {}

    def fake_train(cfg):
        seen["cfg"] = cfg
        return {"final_val_loss": 1.0, "tok_s": 1.0, "model_dir": "m", "steps_run": 1}

    monkeypatch.setattr("swax.cli.train.train", fake_train)  # the function the command calls
    n = torch.get_num_threads()
    try:
        args = ["train", "steps=3", "--threads", "1", "seq_len=256", "run_dir=/tmp/swax-x"]
        monkeypatch.setattr("swax.cli.train.check_writable_dir", lambda *a, **k: None)
        assert run_inprocess(capsys, *args).returncode == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)
    assert seen["cfg"].steps == 3 and seen["cfg"].seq_len == 256


# ------------------------------------------------------------------------------ input files


def test_binary_inputs_name_the_file(tmp_path, capsys):
    # a binary --haystack, sweep YAML or train config gave "'utf-8' codec can't decode ..."
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    for args in (
        ["eval", "niah", "--preset", "tiny", "--lengths", "1k", "--haystack", str(binary)],
        ["sweep", str(binary)],
        ["train", str(binary)],
    ):
        r = run_inprocess(capsys, *args)
        assert_one_line_error(r, str(binary), "not UTF-8")


def test_corrupt_results_file_names_it(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("{not json")
    r = run_inprocess(capsys, "eval", "compare", str(tmp_path / "r"), "--out", str(tmp_path / "c"))
    assert_one_line_error(r, "results.json")


@pytest.mark.parametrize("command", ["niah", "ppl"])
def test_negative_lengths_name_the_option(capsys, command):
    # argparse read "-1k" as an option: "argument --lengths: expected one argument"
    r = run_inprocess(capsys, "eval", command, "--preset", "tiny", "--lengths", "-1k")
    assert_one_line_error(r, "--lengths", "-1k", "positive")
    r = run_inprocess(capsys, "eval", command, "--preset", "tiny", "--lengths", "4k,abc")
    assert_one_line_error(r, "--lengths", "'abc'")


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_code_timeout_must_be_positive(capsys, value):
    r = run_inprocess(capsys, "eval", "tasks", "--preset", "tiny", "--code-timeout", value)
    assert_one_line_error(r, "code", value)


def test_generate_keeps_cpu_flex_off_unless_asked(tmp_path, capsys, monkeypatch):
    """`swax generate` runs one prompt: on the CPU it does not compile flex (seconds, more than
    it saves there) for a long-window model where "auto" would, unless SWAX_CPU_FLEX=1 says so;
    the same prefill from Python does take it."""
    from swax.generate import prefill
    from swax.ops.swa import flex as swa_flex
    from swax.ops.swa.forward import _blockwise_fwd

    torch.manual_seed(0)
    d = tmp_path / "w512"
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=512))
    model.save_pretrained(d)
    calls = []

    def recorder(q, k, v, window, scale, padded):  # stands in for the compiled kernel
        calls.append(q.shape[2])
        return _blockwise_fwd(q, k, v, window, scale)

    monkeypatch.setattr(swa_flex, "_flex_cpu_call", recorder)
    monkeypatch.setattr(swa_flex, "_flex_cpu_template", lambda: None)
    monkeypatch.setattr(
        swa_flex, "_FLEX_CPU_STATE", {"failed": None, "shapes": set(), "announced": True}
    )
    monkeypatch.delenv("SWAX_CPU_FLEX", raising=False)
    args = [
        "generate",
        "--model",
        str(d),
        "--prompt",
        "x" * 300,
        "--max-new-tokens",
        "2",
        "--no-stream",
    ]
    r = run_inprocess(capsys, *args)
    assert r.returncode == 0, r.stderr
    assert "300 prompt tokens" in r.stderr and calls == []
    with torch.no_grad():
        prefill(model, torch.zeros(1, 300, dtype=torch.long))
    assert calls == [300]  # one SWA layer, one chunk: auto takes flex outside the command
    calls.clear()
    monkeypatch.setenv("SWAX_CPU_FLEX", "1")
    r = run_inprocess(capsys, *args)
    assert r.returncode == 0, r.stderr
    assert calls == [300]


def test_auto_threads_follow_the_load_during_a_run(monkeypatch):
    """AutoThreads: the CPUs' busy time since the last look less this process's own CPU time is
    the others' load; the count is re-picked from it (hand-worked: 2 CPUs 95 % busy = 1.9, this
    process 0.9 of a CPU, others 1.0 -> 1 thread; then others 0.1 -> 2 threads)."""
    import types

    import swax.core.threads as T

    clock = {"wall": 0.0, "cpu": 0.0}
    fake_time = types.SimpleNamespace(
        monotonic=lambda: clock["wall"], process_time=lambda: clock["cpu"], sleep=lambda s: None
    )
    monkeypatch.setattr(T, "time", fake_time)
    monkeypatch.setattr(T, "usable_cpus", lambda: 2)
    monkeypatch.setattr(T, "_cpu_ids", lambda: {0, 1})
    monkeypatch.setattr(T, "other_load", lambda: (0.0, "test"))
    stat = {"busy": 0.0, "total": 0.0}
    monkeypatch.setattr(T, "_cpu_times", lambda ids: (stat["busy"], stat["total"]))
    n = torch.get_num_threads()
    try:
        assert T.set_threads("auto") == 2
        gov = T.AutoThreads(every=10)
        clock.update(wall=5.0, cpu=4.5)
        assert gov.check() is None  # not yet 10 s
        clock.update(wall=10.0, cpu=9.0)  # 0.9 of a CPU over 10 s
        stat.update(busy=1900.0, total=2000.0)  # 2 CPUs 95 % busy
        msg = gov.check()
        assert msg and msg.startswith("now threads 1 (auto: 2 usable CPU(s), 1.0 in use")
        assert torch.get_num_threads() == 1
        clock.update(wall=20.0, cpu=18.0)  # 0.9 of a CPU again
        stat.update(busy=1900.0 + 1000.0, total=4000.0)  # 50 % busy: others 0.1
        assert gov.check().startswith("now threads 2") and torch.get_num_threads() == 2
        T.set_threads(1)  # an explicit count: nothing follows the load
        assert not T.AutoThreads(every=0).active
    finally:
        torch.set_num_threads(n)


def _fake_generate(tokens, then=None):
    """A stand-in for swax.generate.generate: hands ``tokens`` to on_token one by one, then
    raises ``then`` (or returns them after the prompt)."""

    def fake(model, ids, max_new_tokens, on_token=None, **kw):
        for t in tokens:
            on_token(torch.tensor([t]))
        if then is not None:
            raise then
        return torch.cat([ids, torch.tensor([tokens])], dim=1)

    return fake


def test_generate_ctrl_c_prints_what_was_generated(capsys, monkeypatch):
    import swax.cli.generate as G
    from swax.cli import main

    monkeypatch.setattr(G, "generate", _fake_generate(list(b"In the"), KeyboardInterrupt()))
    rc = main(
        [
            "generate",
            "--preset",
            "tiny",
            "--no-stream",
            "--max-new-tokens",
            "1000",
            "--threads",
            "1",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 130
    assert out.strip() == "In the"
    assert "[interrupted after 6 new tokens]" in err and err.count("interrupted") == 1


def test_generate_without_streaming_shows_progress(capsys, monkeypatch):
    import swax.cli.generate as G
    from swax.cli import main

    class Every(G._Streamer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.every = 0.0  # a progress line after every token

    monkeypatch.setattr(G, "_Streamer", Every)
    monkeypatch.setattr(G, "generate", _fake_generate(list(b"abc")))
    rc = main(
        ["generate", "--preset", "tiny", "--no-stream", "--max-new-tokens", "3", "--threads", "1"]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip() == "abc"
    assert "generating: 3 of 3 new tokens" in err


def test_streaming_holds_back_a_split_character(capsys, monkeypatch):
    import swax.cli.generate as G
    from swax.cli import main

    monkeypatch.setattr(G, "generate", _fake_generate(list("é a".encode())))  # C3 A9 20 61
    rc = main(
        ["generate", "--preset", "tiny", "--stream", "--max-new-tokens", "4", "--threads", "1"]
    )
    out, _ = capsys.readouterr()
    assert rc == 0 and out == "é a\n"

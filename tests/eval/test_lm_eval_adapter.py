"""The lm-evaluation-harness adapter, run offline through lm-eval's own API and CLI."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'swax[eval]')")

from lm_eval.api.instance import Instance  # noqa: E402

from swax import SwaxConfig, SwaxLM  # noqa: E402
from swax.data import load_tokenizer  # noqa: E402
from swax.eval.lm_eval_adapter import SwaxEvalLM  # noqa: E402

WINDOW = 16

ARC = [
    {
        "question": "Which gas do plants take in from the air?",
        "choices": {
            "text": ["oxygen", "carbon dioxide", "helium", "neon"],
            "label": ["A", "B", "C", "D"],
        },
        "answerKey": "B",
    },
    {
        "question": "What is frozen water called?",
        "choices": {"text": ["ice", "steam", "sand"], "label": ["1", "2", "3"]},
        "answerKey": "1",
    },
    {
        "question": "Which animal is a mammal?",
        "choices": {"text": ["shark", "whale", "trout", "eel"], "label": ["A", "B", "C", "D"]},
        "answerKey": "B",
    },
    {
        "question": "What does a thermometer measure?",
        "choices": {
            "text": ["mass", "temperature", "length", "speed"],
            "label": ["A", "B", "C", "D"],
        },
        "answerKey": "B",
    },
    {
        "question": "Which planet is closest to the Sun?",
        "choices": {"text": ["Mercury", "Mars", "Jupiter"], "label": ["A", "B", "C"]},
        "answerKey": "A",
    },
]
LAMBADA = [
    {"text": "she opened the door and saw her old friend standing there"},
    {"text": "the ship sailed across the sea until it reached the harbor"},
    {"text": "he put the key in the lock and opened the door"},
]

MC_YAML = """task: swax_test_arc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
LAMBADA_YAML = """task: swax_test_lambada
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, init_std=0.2, window=WINDOW)).eval()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("byte")


@pytest.fixture(scope="module")
def lm(model, tok):
    return SwaxEvalLM(model=model, tokenizer=tok, batch_size=3, device="cpu")


@pytest.fixture
def task_dir(tmp_path, model):
    model.save_pretrained(tmp_path / "model")  # byte tokenizer by default
    data = tmp_path / "data"
    data.mkdir()
    (data / "arc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ARC))
    (data / "lambada.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LAMBADA))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    cache = tmp_path / "hf_cache"
    (tasks / "swax_test_arc.yaml").write_text(MC_YAML.format(data=data / "arc.jsonl", cache=cache))
    (tasks / "swax_test_lambada.yaml").write_text(
        LAMBADA_YAML.format(data=data / "lambada.jsonl", cache=cache)
    )
    return tmp_path


def ref_loglikelihood(model, context, continuation):
    """One forward pass per (context + continuation), byte tokens, summed log-softmax."""
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    ctx = list(stripped.encode()) or [256]
    cont = list(continuation.encode())
    with torch.no_grad():
        logp = model(torch.tensor([ctx + cont]), window=WINDOW).double().log_softmax(-1)[0]
    rows = [logp[len(ctx) - 1 + j] for j in range(len(cont))]
    return (
        sum(float(r[t]) for r, t in zip(rows, cont)),
        all(int(r.argmax()) == t for r, t in zip(rows, cont)),
    )


def ref_arc_metrics(model):
    acc, acc_norm = [], []
    for doc in ARC:
        q = f"Question: {doc['question']}\nAnswer:"
        texts = doc["choices"]["text"]
        lls = [ref_loglikelihood(model, q, " " + c)[0] for c in texts]
        gold = doc["choices"]["label"].index(doc["answerKey"])
        acc.append(float(max(range(len(lls)), key=lambda k: (lls[k], -k)) == gold))
        norm = [ll / len(c) for ll, c in zip(lls, texts)]
        acc_norm.append(float(max(range(len(norm)), key=lambda k: (norm[k], -k)) == gold))
    return sum(acc) / len(acc), sum(acc_norm) / len(acc_norm)


def ref_lambada_metrics(model):
    lls, accs = [], []
    for doc in LAMBADA:
        words = doc["text"].split(" ")
        ll, greedy = ref_loglikelihood(model, " ".join(words[:-1]), " " + words[-1])
        lls.append(ll)
        accs.append(float(greedy))
    return sum(accs) / len(accs), math.exp(-sum(lls) / len(lls))


def req(kind, *args):
    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


def test_loglikelihood_matches_independent_loop(lm, model):
    pairs = [
        ("Question: why?\nAnswer:", " because"),
        ("Question: why?\nAnswer: ", "no"),
        ("", "hello"),
        ("a", "b"),
        ("The quick brown fox jumps over the", " lazy dog"),
    ]
    got = lm.loglikelihood([req("loglikelihood", c, x) for c, x in pairs], disable_tqdm=True)
    for (c, x), (ll, greedy) in zip(pairs, got):
        ref_ll, ref_greedy = ref_loglikelihood(model, c, x)
        assert ll == pytest.approx(ref_ll, abs=1e-3)
        assert greedy == ref_greedy


def test_loglikelihood_rolling_is_full_context(model, tok):
    lm = SwaxEvalLM(model=model, tokenizer=tok, batch_size=2, chunk_size=5)
    texts = ["In the beginning God created the heaven and the earth. " * 2, "Hi", "x y z"]
    got = lm.loglikelihood_rolling(
        [req("loglikelihood_rolling", t) for t in texts], disable_tqdm=True
    )
    for text, value in zip(texts, got):
        ids = [256] + list(text.encode())
        with torch.no_grad():
            logp = model(torch.tensor([ids]), window=WINDOW).double().log_softmax(-1)[0]
        ref = sum(float(logp[i, t]) for i, t in enumerate(ids[1:]))
        assert value == pytest.approx(ref, abs=1e-3)


def test_generate_until_greedy_and_stops(lm, model):
    from swax.generate import generate

    prompts = ["abc", "xyz", "hello", "aaaa", "the"]
    free = lm.generate_until(
        [req("generate_until", p, {"max_gen_toks": 10}) for p in prompts], disable_tqdm=True
    )
    for p, text in zip(prompts, free):
        ids = generate(
            model,
            torch.tensor([list(p.encode())]),
            max_new_tokens=10,
            window=WINDOW,
            eos_token_id=256,
        )[0, len(p) :].tolist()
        ids = ids[: ids.index(256)] if 256 in ids else ids
        assert text == bytes(ids).decode("utf-8", errors="replace")
    # an ASCII stop string (bytes of a random model are mostly not text)
    p, text, k = next(
        (p, t, k)
        for p, t in zip(prompts, free)
        for k in range(1, len(t) - 1)
        if t[k : k + 2].isascii() and t[k : k + 2].isprintable()
    )
    stop = text[k : k + 2]
    cut = lm.generate_until(
        [req("generate_until", p, {"until": [stop], "max_gen_toks": 10, "do_sample": False})],
        disable_tqdm=True,
    )
    assert cut == [text[: text.find(stop)]]


def test_model_args_errors(tmp_path):
    from swax import SwaxError

    with pytest.raises(SwaxError, match="pretrained=DIR"):
        SwaxEvalLM()
    with pytest.raises(SwaxError, match="checkpoint directory .* does not exist"):
        SwaxEvalLM(pretrained=str(tmp_path / "missing"))
    with pytest.raises(SwaxError, match="window must be a positive integer or 'full'"):
        SwaxEvalLM(model=SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2)), window="abc")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_errors_unless_it_is_lm_evals_default():
    from swax import SwaxError

    model = SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2))
    with pytest.raises(SwaxError, match="'cuda:0' requested but CUDA is not available"):
        SwaxEvalLM(model=model, device="cuda:0")
    with pytest.raises(SwaxError, match="'cuda:0' requested"):  # given in model_args
        SwaxEvalLM.create_from_arg_obj({"model": model, "device": "cuda:0"}, {"device": "cpu"})
    # lm-eval's own --device default (cuda:0) falls back to the CPU
    lm = SwaxEvalLM.create_from_arg_obj({"model": model}, {"device": "cuda:0"})
    assert lm.device.type == "cpu"


def test_simple_evaluate_on_local_json_task(task_dir, model, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(task_dir / "tasks"), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model="swax",
        model_args=f"pretrained={task_dir / 'model'},batch_size=3,device=cpu",
        tasks=["swax_test_arc", "swax_test_lambada"],
        task_manager=tm,
    )
    res = out["results"]
    acc, acc_norm = ref_arc_metrics(model)
    assert res["swax_test_arc"]["acc,none"] == pytest.approx(acc)
    assert res["swax_test_arc"]["acc_norm,none"] == pytest.approx(acc_norm)
    lam_acc, lam_ppl = ref_lambada_metrics(model)
    assert res["swax_test_lambada"]["acc,none"] == pytest.approx(lam_acc)
    assert res["swax_test_lambada"]["perplexity,none"] == pytest.approx(lam_ppl, rel=1e-4)

    # the native evaluator on the same data gives the same numbers
    from swax.eval.tasks import TaskEvalSettings, evaluate_tasks

    (task_dir / "data" / "arc_easy.jsonl").write_text((task_dir / "data" / "arc.jsonl").read_text())
    native = evaluate_tasks(
        model,
        load_tokenizer("byte"),
        "arc_easy,lambada",
        task_dir / "data",
        TaskEvalSettings(progress=False),
    )
    assert native["arc_easy"]["metrics"]["acc"] == pytest.approx(acc)
    assert native["arc_easy"]["metrics"]["acc_norm"] == pytest.approx(acc_norm)
    assert native["lambada"]["metrics"]["perplexity"] == pytest.approx(lam_ppl, rel=1e-4)


@pytest.mark.slow
def test_command_line_route(task_dir, model):
    """`python -m swax.eval.lm_eval_adapter` = lm-eval's CLI with the swax model registered."""
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    out_dir = task_dir / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swax.eval.lm_eval_adapter",
            "--model_args",
            f"pretrained={task_dir / 'model'},batch_size=4",
            "--tasks",
            "swax_test_arc",
            "--include_path",
            str(task_dir / "tasks"),
            "--output_path",
            str(out_dir),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "swax_test_arc" in proc.stdout
    files = list(out_dir.rglob("results_*.json"))
    assert files, proc.stdout[-2000:]
    res = json.loads(files[0].read_text())["results"]["swax_test_arc"]
    acc, acc_norm = ref_arc_metrics(model)
    assert res["acc,none"] == pytest.approx(acc)
    assert res["acc_norm,none"] == pytest.approx(acc_norm)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["offline", "bad_args"])
def test_command_line_errors_are_one_line(task_dir, case):
    """A built-in task without network (lm-eval fetches its data from the hub) and bad
    --model_args: one line each and exit 2 (both were tracebacks)."""
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    model_args = f"pretrained={task_dir / 'model'}" if case == "offline" else "preset=tiny"
    proc = subprocess.run(
        [sys.executable, "-m", "swax.eval.lm_eval_adapter", "--model_args", model_args]
        + ["--tasks", "arc_easy", "--limit", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and errors[0].startswith("swax-lm-eval: error: "), proc.stderr[-2000:]
    assert ("HF_DATASETS_CACHE" if case == "offline" else "pretrained=DIR") in errors[0]


def test_only_hub_errors_count_as_offline():
    from swax.eval.lm_eval_adapter import _is_offline_error

    class OfflineModeIsEnabled(Exception):  # huggingface_hub's name
        pass

    wrapped = RuntimeError("dataset")
    wrapped.__cause__ = OfflineModeIsEnabled("offline")
    assert _is_offline_error(OfflineModeIsEnabled()) and _is_offline_error(wrapped)
    for e in (BrokenPipeError(), ConnectionRefusedError(), ConnectionResetError(), ValueError()):
        assert not _is_offline_error(e), e

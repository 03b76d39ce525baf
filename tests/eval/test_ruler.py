"""RULER NIAH generator and scorer, checked against RULER's definitions written out here as
literal strings (scripts/synthetic.yaml, scripts/data/synthetic/constants.py, niah.py,
scripts/eval/synthetic/constants.py), independently of swax.eval.ruler's own constants."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import pytest

from swax.core.errors import SwaxError
from swax.data import key_vocabulary, load_tokenizer
from swax.eval.ruler import (
    TASKS,
    NiahTask,
    generate_niah,
    postprocess_pred,
    read_jsonl,
    string_match_all,
    string_match_part,
    write_jsonl,
)

# synthetic.yaml: type_haystack, type_needle_k, type_needle_v, num_needle_k, num_needle_v,
# num_needle_q
YAML = {
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
}

SINGULAR = (
    "A special magic {v} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {v} afterwards.\n{{context}}\nWhat is the special magic {v} "
    "for {{query}} mentioned in the provided text?"
)
SINGULAR_PREFIX = " The special magic {v} for {{query}} mentioned in the provided text is"
PLURAL = (
    "Some special magic {v} are hidden within the following text. Make sure to memorize "
    "it. I will quiz you about the {v} afterwards.\n{{context}}\nWhat are all the special "
    "magic {v} for {{query}} mentioned in the provided text?"
)
PLURAL_PREFIX = " The special magic {v} for {{query}} mentioned in the provided text are"

EXPECTED_TEMPLATE = {
    "niah_single_1": (SINGULAR, SINGULAR_PREFIX, "number"),
    "niah_single_2": (SINGULAR, SINGULAR_PREFIX, "number"),
    "niah_single_3": (SINGULAR, SINGULAR_PREFIX, "uuid"),
    "niah_multikey_1": (SINGULAR, SINGULAR_PREFIX, "number"),
    "niah_multikey_2": (SINGULAR, SINGULAR_PREFIX, "number"),
    "niah_multikey_3": (SINGULAR, SINGULAR_PREFIX, "uuid"),
    "niah_multivalue": (PLURAL, PLURAL_PREFIX, "numbers"),
    "niah_multiquery": (PLURAL, PLURAL_PREFIX, "numbers"),
}

NOISE_SENTENCE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: (\S+?)\.(?=\s|$)")
NUMBER_RE = re.compile(r"[1-9][0-9]{6}")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
TTG = 128


@functools.cache
def tokenizer(name: str):
    return load_tokenizer(name)


@functools.cache
def wonderwords_lists() -> tuple[frozenset[str], frozenset[str]]:
    from wonderwords import random_word

    return (
        frozenset(random_word._get_words_from_text_file("adjectivelist.txt")),
        frozenset(random_word._get_words_from_text_file("nounlist.txt")),
    )


def is_ruler_word_key(key: str) -> bool:
    adjs, nouns = wonderwords_lists()
    return any(key[:i] in adjs and key[i + 1 :] in nouns for i in range(len(key)) if key[i] == "-")


def expected(task: str) -> tuple[str, str]:
    template, prefix, v = EXPECTED_TEMPLATE[task]
    return template.format(v=v), prefix.format(v=v)


def parse(rec: dict, task: str) -> dict:
    """Context, needles, queries of a record, parsed with the literal template."""
    template, prefix = expected(task)
    head, question = template.split("{context}")
    head = head.replace("{query}", "")
    text = rec["input"]
    assert text.startswith(head)
    q = re.search(
        r"\nWhat (?:is|are all) the special magic \w+ for (.+) mentioned in the "
        r"provided text\?$",
        text,
    )
    assert q, text[-300:]
    query = q.group(1)
    assert text == head + text[len(head) : q.start()] + question.replace("{query}", query)
    assert rec["answer_prefix"] == prefix.replace("{query}", query)
    queries = (
        query.split(", ")
        if ", and " not in query
        else query.split(", and ")[0].split(", ") + [query.split(", and ")[1]]
    )
    context = text[len(head) : q.start()]
    needles = [(m.group(2), m.group(3), m.start(), m.group(1)) for m in NEEDLE_RE.finditer(context)]
    return {"context": context, "needles": needles, "queries": queries, "query": query}


# --------------------------------------------------------------------------------------------
# Task definitions and templates


def test_tasks_match_synthetic_yaml():
    assert set(TASKS) == set(YAML)
    for name, (hay, k, v, nk, nv, nq) in YAML.items():
        t = TASKS[name]
        assert isinstance(t, NiahTask)
        assert (t.type_haystack, t.type_needle_k, t.type_needle_v) == (hay, k, v)
        assert (t.num_needle_k, t.num_needle_v, t.num_needle_q) == (nk, nv, nq)
        assert t.tokens_to_generate == TTG
    with pytest.raises(dataclasses.FrozenInstanceError):
        TASKS["niah_single_1"].num_needle_k = 2  # frozen


@pytest.mark.parametrize("task", sorted(YAML))
def test_template_and_answer_prefix(task):
    assert TASKS[task].template() == expected(task)
    rec = generate_niah(task, 2048, 1, tokenizer("byte"))[0]
    p = parse(rec, task)
    template, prefix = expected(task)
    full = template.replace("{context}", p["context"]) + prefix
    assert rec["input"] + rec["answer_prefix"] == full.replace("{query}", p["query"])
    assert rec["answer_prefix"].startswith(" The special magic ")
    assert rec["task"] == task and rec["max_length"] == 2048 and rec["tokens_to_generate"] == TTG


# --------------------------------------------------------------------------------------------
# Needles, values, haystacks


@pytest.mark.parametrize("task", sorted(YAML))
def test_needle_counts_and_formats(task):
    hay, k_type, v_type, nk, nv, nq = YAML[task]
    for rec in generate_niah(task, 4096, 3, tokenizer("byte"), seed=7):
        p = parse(rec, task)
        assert len(p["queries"]) == nq
        plural_v = {"numbers": "numbers", "uuids": "uuids"}[v_type]
        assert all(kind == plural_v for *_, kind in p["needles"])  # needle keeps the plural
        value_re = NUMBER_RE if v_type == "numbers" else UUID_RE
        assert all(value_re.fullmatch(v) for _, v, _, _ in p["needles"])
        for key, *_ in p["needles"]:
            assert UUID_RE.fullmatch(key) if k_type == "uuids" else is_ruler_word_key(key)
        by_key: dict[str, list[str]] = {}
        for key, value, *_ in p["needles"]:
            by_key.setdefault(key, []).append(value)
        for q in p["queries"]:
            assert len(by_key[q]) == nv
        assert sorted(rec["outputs"]) == sorted(v for q in p["queries"] for v in by_key[q])
        assert len(rec["depth"]) == len(rec["outputs"])
        lines = p["context"].split("\n")
        if hay == "needle":  # every line is a needle; only the queried key's are real
            assert len(p["needles"]) == len(lines) > 1
            assert sum(key in p["queries"] for key, *_ in p["needles"]) == nq * nv
        else:
            assert len(by_key) == max(nk, nq)
            assert len(p["needles"]) == max(nk, nq) * nv
        if hay == "noise":
            assert all(line == NOISE_SENTENCE or NEEDLE_RE.fullmatch(line) for line in lines)
            assert sum(line == NOISE_SENTENCE for line in lines) > 0
        if hay == "essay":
            assert "\n" not in p["context"] and "In the beginning God created" in p["context"]
        for q in p["queries"]:
            for v in by_key[q]:
                assert f"One of the special magic {plural_v} for {q} is: {v}." in rec["input"]
        if nq > 1:
            assert p["query"] == ", ".join(p["queries"][:-1]) + ", and " + p["queries"][-1]


def test_essay_depths_follow_ruler_sentence_rule():
    """With a haystack of uniform sentences, needle i sits after exactly int(S * d_i / 100)
    of the S sentences (RULER's insertion_positions), needles in increasing depth."""
    text = " ".join(f"Line {i} ends here." for i in range(3000))
    ruler_depths = sorted({round(100 * i / 39) for i in range(40)})
    for task in ("niah_single_2", "niah_multivalue", "niah_multiquery", "niah_multikey_1"):
        for rec in generate_niah(task, 8192, 3, tokenizer("byte"), haystack_text=text):
            p = parse(rec, task)
            ctx = p["context"]
            assert set(NEEDLE_RE.sub("", ctx).split()) <= {
                "Line",
                "ends",
                "here.",
                *map(str, range(3000)),
            }
            num_sents = len(re.findall(r"\bLine\b", ctx))
            values = {v: s for _, v, s, _ in p["needles"]}
            for value, depth in zip(rec["outputs"], rec["depth"]):
                assert depth in ruler_depths
                before = len(re.findall(r"\bLine\b", ctx[: values[value]]))
                assert before == int(num_sents * (depth / 100))


@pytest.mark.parametrize("tok", ["byte", "gpt2"])
@pytest.mark.parametrize("task", sorted(YAML))
def test_needles_sit_at_requested_depth(task, tok):
    # Noise and needle haystacks place needles by line, the essay by sentence count: KJV
    # sentences vary in length, so there position / length is only close to the depth (the
    # exact sentence rule is checked above).
    tol = 8 if YAML[task][0] == "essay" else 1.5
    for rec in generate_niah(task, 16384, 2, tokenizer(tok), seed=3):
        p = parse(rec, task)
        starts = {v: s for _, v, s, _ in p["needles"]}
        for value, depth in zip(rec["outputs"], rec["depth"]):
            assert 0 <= depth <= 100
            measured = 100 * starts[value] / len(p["context"])
            assert abs(measured - depth) < tol, (value, depth, measured)


# --------------------------------------------------------------------------------------------
# Lengths


def _check_fit(rec, tok, length, task):
    n = len(tok.encode(rec["input"] + rec["answer_prefix"]))
    assert rec["length"] == n + TTG <= length
    if rec["length"] < 0.9 * length:
        # Only a haystack sentence longer than a tenth of the context may leave that gap: a
        # uuid distractor needle (114 bytes) in 1024 bytes. It must not have fitted.
        assert (task, tok.name, length) == ("niah_multikey_3", "byte", 1024)
        line = "\n" + rec["input"].split("\n")[1]
        assert NEEDLE_RE.fullmatch(line[1:]) and length - rec["length"] < len(tok.encode(line))


@pytest.mark.parametrize("tok", ["byte", "gpt2"])
@pytest.mark.parametrize("length", [1024, 4096, 16384])
def test_prompts_fit_and_fill_the_length(tok, length):
    t = tokenizer(tok)
    for task in sorted(YAML):
        for rec in generate_niah(task, length, 2, t, seed=11):
            _check_fit(rec, t, length, task)


@pytest.mark.parametrize("task", ["niah_single_2", "niah_multikey_2"])
def test_one_131k_byte_sample(task):
    t = tokenizer("byte")
    (rec,) = generate_niah(task, 131072, 1, t)
    _check_fit(rec, t, 131072, task)
    assert rec["length"] >= 0.99 * 131072
    p = parse(rec, task)
    starts = {v: s for _, v, s, _ in p["needles"]}
    tol = 3 if task == "niah_single_2" else 0.5
    assert abs(100 * starts[rec["outputs"][0]] / len(p["context"]) - rec["depth"][0]) < tol


def test_haystack_search_is_maximal_with_a_misleading_estimate():
    from swax.eval.ruler import _Counts, _fit

    def count(n):  # not additive, with bumps; the estimate says 2 per unit, the truth is ~3
        return 50 + 3 * n + (n % 7 == 0) + (n // 100)

    for budget in (50, 51, 53, 54, 1000, 4093, 100_000):
        approx = _Counts(lambda a, b: [2] * (b - a))
        n = _fit(count, approx, 0, budget)
        if budget < count(0):  # 51
            assert n is None
        else:
            assert count(n) <= budget < count(n + 1)


def test_tokens_to_generate_override():
    t = tokenizer("gpt2")
    (rec,) = generate_niah("niah_single_1", 4096, 1, t, tokens_to_generate=32)
    assert rec["tokens_to_generate"] == 32
    assert 0.98 * 4096 <= rec["length"] == len(t.encode(rec["input"] + rec["answer_prefix"])) + 32
    assert rec["length"] <= 4096


def test_too_short_or_bad_arguments():
    t = tokenizer("byte")
    with pytest.raises(SwaxError, match="300"):
        generate_niah("niah_single_1", 300, 1, t)
    with pytest.raises(SwaxError, match="niah_nope"):
        generate_niah("niah_nope", 4096, 1, t)
    with pytest.raises(SwaxError, match="0"):
        generate_niah("niah_single_1", 0, 1, t)
    with pytest.raises(SwaxError, match="bogus"):
        generate_niah("niah_single_1", 4096, 1, t, key_split="bogus")
    with pytest.raises(SwaxError, match="empty"):
        generate_niah("niah_single_2", 4096, 1, t, haystack_text="  \n ")


# --------------------------------------------------------------------------------------------
# Seeds and key vocabularies


def test_seeded_and_varied():
    t = tokenizer("gpt2")
    for task in ("niah_single_1", "niah_multikey_2", "niah_multivalue"):
        a = generate_niah(task, 2048, 4, t, seed=5)
        assert a == generate_niah(task, 2048, 4, t, seed=5)
        b = generate_niah(task, 2048, 4, t, seed=6)
        assert [r["outputs"] for r in a] != [r["outputs"] for r in b]
        assert [r["index"] for r in a] == [0, 1, 2, 3]
        values = [v for r in a for v in r["outputs"]]
        assert len(set(values)) == len(values)
        queries = {parse(r, task)["query"] for r in a}
        assert len(queries) == len(a)
        assert len({tuple(r["depth"]) for r in a}) > 1


def test_eval_key_split():
    vocab = key_vocabulary("eval")
    for task in ("niah_multikey_2", "niah_multiquery", "niah_single_1"):
        for rec in generate_niah(task, 4096, 2, tokenizer("byte"), key_split="eval"):
            p = parse(rec, task)
            keys = [k for k, *_ in p["needles"]] + p["queries"]
            assert keys and all(k in vocab for k in keys)
    # uuid keys are unaffected
    rec = generate_niah("niah_multikey_3", 4096, 1, tokenizer("byte"), key_split="eval")[0]
    assert UUID_RE.fullmatch(parse(rec, "niah_multikey_3")["queries"][0])


def test_custom_essay_text_is_repeated():
    text = "Alpha beta gamma. Delta epsilon! Zeta eta theta?"
    rec = generate_niah("niah_single_2", 4096, 1, tokenizer("byte"), haystack_text=text)[0]
    ctx = parse(rec, "niah_single_2")["context"]
    assert set(NEEDLE_RE.sub("", ctx).split()) <= set(text.split())
    assert ctx.count("Delta epsilon!") > 20


# --------------------------------------------------------------------------------------------
# Scoring


def test_string_match_all_and_part():
    refs4 = [["1111111", "2222222", "3333333", "4444444"]]
    assert string_match_all(["The answer is 1234567."], [["1234567"]]) == 100.0
    assert string_match_all(["1111111 and 2222222"], refs4) == 50.0  # 2 of 4
    assert string_match_part(["1111111 and 2222222"], refs4) == 100.0
    assert string_match_all(["no idea"], [["1234567"]]) == 0.0
    assert string_match_part(["no idea"], refs4) == 0.0
    assert string_match_all(["THE KEY IS ABC-DEF-1A"], [["abc-def-1a"]]) == 100.0
    assert string_match_part(["Abc"], [["aBC", "x"]]) == 100.0
    # (1 + 1/3 + 0) / 3 * 100 = 44.444... -> 44.44
    preds = ["7654321", "a 1111111 b", "nothing"]
    refs = [["7654321"], ["1111111", "2222222", "3333333"], ["5555555"]]
    assert string_match_all(preds, refs) == 44.44
    # part: (1 + 1 + 0) / 3 * 100 = 66.67
    assert string_match_part(preds, refs) == 66.67
    with pytest.raises(SwaxError):
        string_match_all(["a"], [["a"], ["b"]])
    with pytest.raises(SwaxError):
        string_match_all([], [])


def test_postprocess_pred_turns_control_characters_into_newlines():
    # RULER (scripts/eval/evaluate.py): strip, re.sub(r"[\x00-\x1f]", "\n", ...), strip
    assert postprocess_pred("  1234567\n") == "1234567"
    assert postprocess_pred("\x00 12\x0034\t5\x1b6 \x1f") == "12\n34\n5\n6"
    assert postprocess_pred("a\rb\x0bc") == "a\nb\nc"
    # only U+0000 … U+001F: DEL and non-ASCII characters stay as they are
    assert postprocess_pred("12\x7f34\u200b5\u00e9") == "12\x7f34\u200b5\u00e9"
    # a control character inside a value splits it, so it no longer matches (dropping the
    # character instead would turn "123\x00456" into a match)
    pred = postprocess_pred(" 123\x00456")
    assert string_match_all([pred], [["123456"]]) == 0.0
    assert string_match_all([pred], [["123", "456"]]) == 100.0


def test_echo_of_references_scores_100():
    recs = generate_niah("niah_multivalue", 2048, 3, tokenizer("byte"))
    refs = [r["outputs"] for r in recs]
    assert string_match_all([" ".join(r) for r in refs], refs) == 100.0
    assert string_match_all(["" for _ in refs], refs) == 0.0


# --------------------------------------------------------------------------------------------
# JSONL


def test_jsonl_round_trip_and_errors(tmp_path):
    recs = generate_niah("niah_multiquery", 2048, 2, tokenizer("byte"))
    path = write_jsonl(recs, tmp_path / "sub" / "niah_multiquery-2048.jsonl")
    assert read_jsonl(path) == recs
    for line in path.read_text().splitlines():
        assert {"index", "input", "outputs", "length", "answer_prefix"} <= set(json.loads(line))
    with pytest.raises(SwaxError, match="missing.jsonl"):
        read_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(recs[0]) + "\n{not json\n")
    with pytest.raises(SwaxError, match=r"bad\.jsonl:2"):
        read_jsonl(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(SwaxError, match=r"bad\.jsonl:1"):
        read_jsonl(bad)
    bad.write_text(json.dumps({"input": "x"}) + "\n")
    with pytest.raises(SwaxError, match="outputs"):
        read_jsonl(bad, required=("input", "outputs"))

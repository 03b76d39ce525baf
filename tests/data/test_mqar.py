"""MQAR episodes (swax.data.mqar), their use as training data, and recall evaluation on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.core.errors import ConfigError, SwaxError
from swax.data import PackedLoader, SyntheticConfig, TokenDataset
from swax.data.mqar import make_mqar_episode, mqar_ids
from swax.data.tokenizer import ByteTokenizer
from swax.probes.episodes import episode_accuracy

CFG = SyntheticConfig(
    task="mqar", mqar_first_id=128, fraction=1.0, num_needles=4, num_queries=3, min_distance=8
)


def _pairs_and_queries(tokens, cfg):
    """Parse an episode without the generator's bookkeeping: the key/value pairs are the key-range
    tokens followed by a value-range token before the last 2Q tokens; queries are the tail."""
    keys, values, noise = (set(r.tolist()) for r in mqar_ids(cfg))
    q = cfg.num_queries
    body, tail = tokens[: -2 * q], tokens[-2 * q :]
    pairs = {body[i]: body[i + 1] for i in range(len(body) - 1) if body[i] in keys}
    assert all(t in noise for i, t in enumerate(body) if t not in keys and t not in values)
    return pairs, list(zip(tail[::2], tail[1::2]))


@pytest.mark.parametrize("length", [40, 65, 300])
def test_episode_layout(length):
    for s in range(20):
        ep = make_mqar_episode(np.random.default_rng(s), length, CFG)
        t = ep.tokens
        assert len(t) == length
        pairs, queries = _pairs_and_queries(t, CFG)
        assert len(pairs) == CFG.num_needles  # distinct keys
        assert len(queries) == CFG.num_queries and len({k for k, _ in queries}) == CFG.num_queries
        for (k, v), (a0, a1) in zip(queries, ep.answer_spans):
            assert pairs[k] == v  # the answer is the value stored with the queried key
            assert t[a0:a1] == [v] and t[a0 - 1] == k
        s0, s1 = ep.needle_span
        assert s1 - s0 == 2 * CFG.num_needles
        first_q = ep.question_spans[0][0]
        assert first_q - s1 == ep.distance >= CFG.min_distance
        # the queried pairs' positions, in query order
        for (k, _), pos in zip(queries, ep.needle_positions):
            assert t[pos] == k


def test_distances_cover_the_allowed_range():
    cfg = SyntheticConfig(
        task="mqar", mqar_first_id=128, num_needles=2, num_queries=2, min_distance=5, max_distance=9
    )
    d = {make_mqar_episode(np.random.default_rng(s), 64, cfg).distance for s in range(200)}
    assert d == set(range(5, 10))


def test_text_filler_comes_from_the_haystack():
    cfg = SyntheticConfig(
        task="mqar", mqar_first_id=128, num_needles=2, num_queries=2, mqar_noise=0
    )
    hay = np.arange(1000, 1100)
    ep = make_mqar_episode(np.random.default_rng(0), 50, cfg, hay)
    keys, values, _ = (set(r.tolist()) for r in mqar_ids(cfg))
    filler = [x for x in ep.tokens if x not in keys and x not in values]
    assert len(filler) == 50 - 8 and all(1000 <= x < 1100 for x in filler)
    with pytest.raises(SwaxError, match="haystack"):
        make_mqar_episode(np.random.default_rng(0), 50, cfg, None)


def test_bad_settings_are_named():
    with pytest.raises(SwaxError, match="too short"):
        make_mqar_episode(np.random.default_rng(0), 20, CFG)
    with pytest.raises(ConfigError, match="mqar_keys"):
        SyntheticConfig(task="mqar", mqar_first_id=128, num_needles=20, num_queries=1)
    with pytest.raises(ConfigError, match="task"):
        SyntheticConfig(task="mqr")
    tok = ByteTokenizer()
    ds = TokenDataset(np.arange(500, dtype=np.int32) % 200, tok.eot_id, 1, "x", tok)
    big = SyntheticConfig(task="mqar", fraction=0.5, mqar_first_id=250)
    with pytest.raises(SwaxError, match="include the tokenizer.s end-of-text id 256"):
        PackedLoader(ds, 64, 4, synthetic=big, tokenizer=tok)


def test_loader_with_episodes_only_supervises_the_answers():
    tok = ByteTokenizer()
    ds = TokenDataset(np.arange(2000, dtype=np.int32) % 100, tok.eot_id, 1, "x", tok)
    cfg = SyntheticConfig(
        task="mqar",
        fraction=1.0,
        num_needles=4,
        num_queries=4,
        answers_only=True,
        min_distance=8,
        mqar_first_id=128,
    )
    loader = PackedLoader(ds, 64, 8, synthetic=cfg, tokenizer=tok)
    assert loader.sequences_per_epoch == loader.corpus_sequences  # episodes only
    keys, values, noise = (set(r.tolist()) for r in mqar_ids(cfg))
    for _ in range(3):
        x, y = loader.next_batch()
        assert set(x.flatten().tolist()) <= keys | values | noise  # no corpus text
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            targets = [(i, t) for i, t in enumerate(row_y) if t != -100]
            assert len(targets) == 4
            for i, t in targets:  # input i is a query key; the target is its stored value
                pairs, _ = _pairs_and_queries(row_x[: i + 1] + [t], cfg)
                assert row_x[i] in keys and t == pairs[row_x[i]]


class LastValueOf:
    """A stand-in model for MQAR: at a key token it predicts the value that followed the key's
    first occurrence (perfect recall). Keeps the context as its state."""

    class config:  # noqa: N801
        window = 16
        layer_types = "S"

    embed = torch.nn.Embedding(1, 1)
    V = 257

    def __call__(self, x, window=None, state=None, return_state=False, logits_to_keep=None):
        ctxs = [([] if state is None else list(state[b])) + x[b].tolist() for b in range(len(x))]
        start = len(ctxs[0]) - x.shape[1]
        logits = torch.zeros(len(x), x.shape[1], self.V)
        for b, ctx in enumerate(ctxs):
            for t in range(start, len(ctx)):
                first = ctx.index(ctx[t])
                if first < t:
                    logits[b, t - start, ctx[first + 1]] = 50.0
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return (logits, ctxs) if return_state else logits


def test_episode_accuracy_on_mqar_with_a_perfect_retriever():
    got = episode_accuracy(
        LastValueOf(),
        None,
        [],
        [64, 256],
        samples=5,
        cfg=CFG,
        chunk=48,
        progress=False,
        batch_size=2,
    )
    for length in (64, 256):
        assert got[length]["acc"] == 100.0 and got[length]["n"] == 5 * CFG.num_queries
        assert got[length]["nll"] < 1e-6


def _model(pattern, window=16):
    torch.manual_seed(0)
    return SwaxLM(
        SwaxConfig(
            d_model=32,
            n_layers=2,
            n_heads=2,
            layer_pattern=pattern,
            window=window,
            mlstm_igate_bias_init=0.0,
        )
    ).eval()


def _answers_logp(model, ids, spans, window):
    with torch.no_grad():
        lp = torch.log_softmax(model(ids, window=window).double(), -1)[0]
    return [float(lp[a0 - 1, ids[0, a0]]) for a0, _ in spans]


def test_window_none_is_full_attention():
    model = _model("SX")
    cfg = SyntheticConfig(
        task="mqar", mqar_first_id=128, num_needles=2, num_queries=2, min_distance=4
    )
    got = episode_accuracy(model, None, [], [120], samples=1, cfg=cfg, window=None, progress=False)
    ep = make_mqar_episode(np.random.default_rng([1234, 120, 0]), 120, cfg)
    ref = _answers_logp(model, torch.tensor([ep.tokens]), ep.answer_spans, None)
    assert got[120]["nll"] == pytest.approx(-sum(ref) / 2, rel=1e-5)
    short = _answers_logp(model, torch.tensor([ep.tokens]), ep.answer_spans, 4)
    assert abs(sum(short) - sum(ref)) > 1e-4  # the window matters for this model


def test_reset_recurrent_empties_only_the_recurrent_memory():
    cfg = SyntheticConfig(
        task="mqar", mqar_first_id=128, num_needles=2, num_queries=2, min_distance=4
    )
    ep = make_mqar_episode(np.random.default_rng([1234, 90, 0]), 90, cfg)
    ids = torch.tensor([ep.tokens])
    cut = ep.question_spans[0][0]
    # mLSTM only: a reset before the question is the same as starting there
    x_model = _model("X")
    got = episode_accuracy(
        x_model, None, [], [90], samples=1, cfg=cfg, reset_recurrent=True, progress=False, chunk=32
    )
    ref = _answers_logp(
        x_model, ids[:, cut:], [(a - cut, b - cut) for a, b in ep.answer_spans], None
    )
    assert got[90]["nll"] == pytest.approx(-sum(ref) / 2, rel=1e-5)
    # attention only: nothing to reset
    s_model = _model("S")
    a = episode_accuracy(
        s_model,
        None,
        [],
        [90],
        samples=1,
        cfg=cfg,
        window=16,
        reset_recurrent=True,
        progress=False,
        chunk=32,
    )
    ref = _answers_logp(s_model, ids, ep.answer_spans, 16)
    assert a[90]["nll"] == pytest.approx(-sum(ref) / 2, rel=1e-5)


def test_window_cut_and_reset_leave_no_path_from_the_pair_to_the_answer():
    """With the window shorter than the pair-question distance and the recurrent memory emptied
    before the question, a 2-layer SX model's answer cannot depend on the pair: changing the
    stored value must not change the prediction (a reset right after the pair would fail this:
    the attention layer still sees the pair for W tokens and feeds it to the mLSTM)."""
    from swax.probes.episodes import _top1

    model = _model("SX")
    cfg = SyntheticConfig(
        task="mqar", mqar_first_id=128, num_needles=1, num_queries=1, min_distance=12
    )
    ep = make_mqar_episode(np.random.default_rng(5), 60, cfg)
    ids = torch.tensor([ep.tokens])
    (a0, _), s0 = ep.answer_spans[0], ep.needle_span[0]
    other = ids.clone()
    other[0, s0 + 1] = 144 + (int(ids[0, s0 + 1]) - 144 + 5) % 16  # another value
    q = ep.question_spans[0][0]
    for reset, same in (([q], True), ([ep.needle_span[1]], False)):
        _, lp = _top1(model, ids, 8, [a0 - 1], 16, reset)
        _, lp2 = _top1(model, other, 8, [a0 - 1], 16, reset)
        assert torch.equal(lp, lp2) == same


def test_far_share_draws_that_share_of_distances_beyond_far_from():
    from swax.data.episode import draw_distance

    cfg = SyntheticConfig(
        task="mqar", mqar_first_id=128, min_distance=8, far_share=0.3, far_from=32
    )
    rng = np.random.default_rng(0)
    d = np.array([draw_distance(rng, cfg, 250) for _ in range(4000)])
    far = d > 32
    # binomial(4000, 0.3): standard deviation 29 draws; 5 sigma
    assert abs(far.sum() - 1200) < 5 * 29
    assert d[~far].min() >= 8 and d[~far].max() <= 32 and d[far].max() <= 250
    # each side uniform: its mean within 5 standard errors (sd of uniform(a, b): (b - a) / sqrt 12)
    for part, a, b in ((d[far], 33, 250), (d[~far], 8, 32)):
        assert abs(part.mean() - (a + b) / 2) < 5 * (b - a) / 12**0.5 / len(part) ** 0.5
    assert all(draw_distance(rng, cfg, 20) <= 20 for _ in range(50))  # too short: all near
    # without far_share: one uniform draw, the same as before the option existed
    plain = SyntheticConfig(task="mqar", mqar_first_id=128, min_distance=8)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert [draw_distance(a, plain, 99) for _ in range(20)] == [
        int(b.integers(8, 100)) for _ in range(20)
    ]
    with pytest.raises(SwaxError, match="far_share needs far_from"):
        draw_distance(rng, SyntheticConfig(task="mqar", mqar_first_id=128, far_share=0.1), 99)
    with pytest.raises(SwaxError, match="far_from=4"):
        draw_distance(
            rng,
            SyntheticConfig(
                task="mqar", mqar_first_id=128, min_distance=8, far_share=0.1, far_from=4
            ),
            99,
        )


def test_far_from_defaults_to_the_long_window():
    from swax.train.config import load_train_config

    tc = load_train_config(None, ["window.long=48", "data.synthetic.far_share=0.1"])
    assert tc.data.synthetic.far_from == 48
    tc = load_train_config(None, ["window.long=48", "data.synthetic.far_from=20"])
    assert tc.data.synthetic.far_from == 20


def test_answer_weight_weights_the_answers_in_the_training_loss():
    """The loader marks each answer with the weight and text with 1; the training loss is the
    weighted mean, checked against cross-entropy computed here token by token."""
    from swax.train.step import _cross_entropy_sum, _target_weight

    tok = ByteTokenizer()
    text = np.frombuffer(b"in the beginning was the word " * 200, dtype=np.uint8).astype(np.int32)
    ds = TokenDataset(text, tok.eot_id, 1, "x", tok)
    cfg = SyntheticConfig(
        task="mqar",
        fraction=0.5,
        num_needles=1,
        num_queries=1,
        answers_only=True,
        min_distance=8,
        mqar_noise=0,
        answer_weight=7.0,
        mqar_first_id=128,
    )
    loader = PackedLoader(ds, 64, 8, synthetic=cfg, tokenizer=tok)
    x, y, w = loader.next_batch()
    supervised = y != -100
    episode_rows = supervised.sum(1) == 1  # answers only: one target per episode
    assert episode_rows.any() and (~episode_rows).any()
    assert (w[episode_rows][supervised[episode_rows]] == 7.0).all()
    assert (w[~episode_rows] == 1.0).all()
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2))
    with torch.no_grad():
        logits = model(x, window=8)
    expected = 0.0
    for r in range(x.shape[0]):
        for t in range(x.shape[1]):
            if y[r, t] != -100:
                nll = -torch.log_softmax(logits[r, t].double(), -1)[y[r, t]]
                expected += float(w[r, t]) * float(nll)
    got = float(_cross_entropy_sum(logits, y, w))
    assert abs(got - expected) <= 1e-5 * expected
    assert _target_weight(y, w) == pytest.approx(float(w[supervised].sum()))
    plain = SyntheticConfig(**{**vars(cfg), "answer_weight": 1})
    unweighted = PackedLoader(ds, 64, 8, synthetic=plain, tokenizer=tok)
    assert len(unweighted.next_batch()) == 2  # no weights: (x, y) as before


def test_supervise_filler_trains_on_text_but_not_on_pairs_or_query_keys():
    tok = ByteTokenizer()
    text = np.frombuffer(b"and the earth was without form " * 300, dtype=np.uint8).astype(np.int32)
    ds = TokenDataset(text, tok.eot_id, 1, "x", tok)
    cfg = SyntheticConfig(
        task="mqar",
        fraction=1.0,
        num_needles=3,
        num_queries=2,
        answers_only=True,
        min_distance=8,
        mqar_noise=0,
        supervise_filler=True,
        mqar_first_id=128,
    )
    loader = PackedLoader(ds, 80, 4, synthetic=cfg, tokenizer=tok)
    keys, values, _ = (set(r.tolist()) for r in mqar_ids(cfg))
    x, y = loader.next_batch()
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        full = row_x + [row_y[-1]]
        for i, t in enumerate(row_y):
            token_pos = i + 1  # target i is token i + 1 of the episode
            if full[token_pos] in keys:  # a pair's key or a query key: never a target
                assert t == -100
            elif full[token_pos] in values:  # a stored value (no) or an answer (yes)
                assert (t == -100) == (full[token_pos - 1] in keys and token_pos < 80 - 4)
            else:  # text filler
                assert t == full[token_pos]
    with pytest.raises(ConfigError, match="supervise_filler needs task: mqar"):
        SyntheticConfig(task="mqar", mqar_first_id=128, supervise_filler=True)


def test_distractors_make_the_answer_a_lookup_by_key():
    """With value tokens scattered in the filler the queried value is not the only value in
    the context: the token after the key's first occurrence answers every query (a binding
    retriever), the last value seen before the query answers few (no binding)."""
    cfg = SyntheticConfig(
        task="mqar",
        mqar_first_id=128,
        num_needles=1,
        num_queries=1,
        min_distance=8,
        mqar_distractors=0.25,
    )
    keys, values, noise = (set(r.tolist()) for r in mqar_ids(cfg))
    rng = np.random.default_rng(0)
    n, bound, last_value, share = 400, 0, 0, []
    for _ in range(n):
        ep = make_mqar_episode(rng, 128, cfg)
        toks = ep.tokens
        q, (a0, _) = ep.question_spans[0][0], ep.answer_spans[0]
        fill = [t for i, t in enumerate(toks[:q]) if not ep.needle_span[0] <= i < ep.needle_span[1]]
        share.append(sum(t in values for t in fill) / len(fill))
        assert set(fill) <= values | noise  # keys only in the pair block and the query
        bound += toks[toks.index(toks[q]) + 1] == toks[a0]
        last_value += [t for t in toks[:q] if t in values][-1] == toks[a0]
    assert bound == n
    # the last value before the query is a distractor unless the distance holds none of them
    # (or one equal to the answer): far from every episode
    assert last_value < n / 4
    assert abs(np.mean(share) - 0.25) < 0.02  # binomial over ~100 filler tokens × 400 episodes


def test_episode_ids_are_checked_against_a_shard_set_chunk_by_chunk(tmp_path, monkeypatch):
    """A memory-mapped shard set is scanned chunk by chunk: the counts and first positions of
    the clashing ids equal numpy's over the whole stream, across chunk and shard boundaries."""
    import swax.data.mqar as M
    from swax.data import DataConfig, build_datasets
    from swax.data.prepare import prepare_shards

    src = tmp_path / "docs"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(30):
        (src / f"{i}.txt").write_text(
            " ".join("".join(rng.choice(list("abcxyz"), 5)) for _ in range(60))
        )
    prepare_shards(str(src), tmp_path / "set", shard_tokens=3000, val_fraction=0.1, progress=False)
    tok = ByteTokenizer()
    train, _ = build_datasets(DataConfig(source=str(tmp_path / "set")), tok, 64, 0)
    stream = np.asarray(train.tokens[0 : len(train.tokens)])
    monkeypatch.setattr(M, "SCAN_CHUNK", 1000)  # many chunks, boundaries inside shards
    cfg = SyntheticConfig(task="mqar", fraction=0.5, mqar_first_id=96, mqar_keys=4,
                          mqar_values=4, mqar_noise=4)  # fmt: skip  # ids 96..107: a b c
    found = M.text_id_clashes(cfg, train.tokens, tok.vocab_size)
    for i in range(96, 108):
        hits = np.flatnonzero(stream == i)
        assert (i in found) == bool(len(hits))
        if len(hits):
            assert found[i] == (len(hits), int(hits[0]))
    assert set(found) == {97, 98, 99}
    with pytest.raises(SwaxError, match=r"key id 97 \(byte 0x61\)"):
        PackedLoader(train, 64, 2, synthetic=cfg, tokenizer=tok)
    # the default ids (after the vocabulary) need no scan and load
    ok = SyntheticConfig(task="mqar", fraction=0.5, min_distance=2)
    assert PackedLoader(train, 64, 2, synthetic=ok, tokenizer=tok).synthetic.mqar_first_id == 257

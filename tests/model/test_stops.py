"""Stopping rows: eos, stop sequences and stop strings against a naive reference.

The reference reads the tokens of a generation without any stop (rows are independent, so a
row's tokens up to its stop do not depend on the others) and applies the rules the slow way:
after every step, the whole text of the row decoded again and searched; the output is each row
cut at its stop and padded, as long as the longest row. swax matches stop sequences on a tail
of the ids on the device, decodes stop strings from the last few ids only, and reads back
whether every row has stopped only every few steps: none of that may change the ids, the
``on_token`` calls, the returned state or ``generate_batch``'s rows.
"""

import pytest
import torch

import swax.generate as G
from swax import SwaxConfig, SwaxLM
from swax.generate import generate, generate_batch

VOCAB = 61
ALPHABET = ["a", "b", "é", "€", "😀", "ab", " ", "xy", "ß", "z"]


def decode(ids):
    """Ids to text: every id gives one to two characters, some of several UTF-8 bytes."""
    return "".join(ALPHABET[i % len(ALPHABET)] for i in ids)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = SwaxConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_layers=2,
        n_heads=4,
        window=8,
        chunk_size=16,
        layer_pattern="SX",
        init_std=0.5,
    )
    return SwaxLM(cfg).eval()


def reference(free, eos=None, stops=(), stop_strings=(), pad=0, text_of=None):
    """(ids per row, output length, {row: kept}) by the naive rules from the free tokens."""
    n_max, text_of = len(free[0]), text_of or decode
    ends = {}
    for b, row in enumerate(free):
        for t in range(n_max - 1):  # the last step is never checked: the budget ends there
            ids = row[: t + 1]
            if (
                (eos is not None and row[t] == eos)
                or any(ids[-len(s) :] == list(s) for s in stops)
                or any(s in text_of(ids) for s in stop_strings)
            ):
                ends[b] = t + 1
                break
    n = max(ends.values()) if len(ends) == len(free) else n_max
    rows = [row[: ends.get(b, n)] + [pad] * (n - ends.get(b, n)) for b, row in enumerate(free)]
    return rows, n, ends


def every_n(monkeypatch, n):
    """Read back whether every row stopped every ``n`` steps, also on the CPU."""
    monkeypatch.setattr(G, "_check_every", lambda device, return_state: 1 if return_state else n)


def pick_stops(free):
    """Stops that end rows at different steps, some never: from the free tokens themselves."""
    r0, r1 = free[0], free[1]
    return dict(
        eos=r0[9],
        stops=[r1[4:7], [VOCAB + 5]],  # a 3-id sequence, and one that never comes
        stop_strings=[decode(free[2][13:15])[1:], "never-there"],
    )


@pytest.mark.parametrize("every", [1, 3, 8])
@pytest.mark.parametrize("compile", [False, True])
def test_generate_stops_like_the_naive_rules(model, monkeypatch, every, compile):
    every_n(monkeypatch, every)
    ids = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    free = generate(model, ids, 40, compile=False)[:, 7:].tolist()
    stop = pick_stops(free)
    want, n, _ = reference(free, **stop, pad=0)
    seen = []
    monkeypatch.setenv("SWAX_COMPILE_BACKEND", "aot_eager")
    got = generate(
        model,
        ids,
        40,
        eos_token_id=stop["eos"],
        stop_sequences=stop["stops"],
        stop_strings=stop["stop_strings"],
        detokenize=decode,
        pad_token_id=0,
        compile=compile,
        on_token=lambda t: seen.append(t.tolist()),
    )
    assert got[:, 7:].tolist() == want
    assert n < 40 and len(set(len(r) for r in want)) == 1
    assert seen == [[r[t] for r in want] for t in range(n)]  # one call per kept step


def test_a_stop_string_found_late_pads_what_followed(model, monkeypatch):
    """Stop strings are read every 8 steps here: the row's ids after its stop, already fed
    back, become padding; the other rows run on."""
    every_n(monkeypatch, 8)
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    free = generate(model, ids, 30)[:, 5:].tolist()
    s = decode(free[0][2:4])  # ends row 0 at step 3 (or earlier), found at step 7
    want, n, _ = reference(free, stop_strings=[s], pad=7)
    got = generate(model, ids, 30, stop_strings=[s], detokenize=decode, pad_token_id=7)
    assert got[:, 5:].tolist() == want and n == 30
    assert want[0][4:] == [7] * 26


@pytest.mark.parametrize("every", [1, 8])
def test_the_returned_state_stops_where_the_output_stops(model, monkeypatch, every):
    every_n(monkeypatch, every)
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    free = generate(model, ids, 30)[0, 6:].tolist()
    eos = free[11]
    out, state = generate(model, ids, 30, eos_token_id=eos, return_state=True)
    n = free.index(eos) + 1
    plain, plain_state = generate(model, ids, n, return_state=True)
    assert torch.equal(out, plain) and state.pos == plain_state.pos == 6 + n - 1
    for a, b in zip(state.layers, plain_state.layers):
        for x, y in zip(
            a if isinstance(a, tuple) else (a.k, a.v), b if isinstance(b, tuple) else (b.k, b.v)
        ):
            assert torch.equal(x, y)


def test_stop_strings_decode_only_the_last_few_ids(model):
    """Incremental: each decode call sees the few ids that hold the longest stop string's bytes
    + 16, however long the output (the whole output per step would be quadratic)."""
    lengths = []

    def counting(ids):
        lengths.append(len(ids))
        return decode(ids)

    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(6))
    generate(model, ids, 300, stop_strings=["never-there"], detokenize=counting)
    # every id decodes to >= 1 byte: at most 11 + 16 ids, and one more just appended
    assert max(lengths) <= 11 + 16 + 1
    # a check per row and step, and a trial decode per id dropped or kept: at most 3 per step
    assert 2 * 300 < len(lengths) <= 3 * 2 * 300


def test_a_stop_string_across_ids_that_decode_to_nothing(model, monkeypatch):
    """Three ids in four decode to no text here: a stop string of a few characters spans more
    ids than it has bytes, and is still found where the naive rule finds it."""
    every_n(monkeypatch, 1)

    def sparse(ids):
        return "".join(ALPHABET[i % len(ALPHABET)] for i in ids if i % 4 == 0)

    ids = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(7))
    free = generate(model, ids, 60)[:, 5:].tolist()
    target = free[0][3:50]
    s = sparse(target)
    texty = [j for j, i in enumerate(target) if i % 4 == 0]
    span = texty[-1] - texty[0] + 1  # the ids from the stop string's first character to its last
    # the old rule kept the last (bytes + 8) ids: this stop string spans well beyond that
    assert span >= len(s.encode()) + 8 + 10, (span, len(s.encode()))
    want, n, ends = reference(free, stop_strings=[s], pad=0, text_of=sparse)
    got = generate(model, ids, 60, stop_strings=[s], detokenize=sparse, pad_token_id=0)
    assert ends and got[:, 5:].tolist() == want


@pytest.mark.parametrize("every", [1, 8])
def test_generate_batch_rows_stop_as_each_prompt_alone(model, monkeypatch, every):
    every_n(monkeypatch, every)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (4, 9, 4, 6)]
    free = [generate(model, torch.tensor([p]), 30)[0, len(p) :].tolist() for p in prompts]
    stop = dict(eos=free[0][6], stops=[free[1][10:12]], stop_strings=[decode(free[3][3:5])])
    got = generate_batch(
        model,
        prompts,
        30,
        eos_token_id=stop["eos"],
        stop_sequences=stop["stops"],
        stop_strings=stop["stop_strings"],
        detokenize=decode,
        batch_size=3,
        compile=False,
    )
    for row, p_free in zip(got, free):
        _, _, ends = reference([p_free], **stop)
        assert row == p_free[: ends.get(0, 30)]
    assert len(got[0]) <= 7 and len(got[1]) <= 12  # stops that did end rows

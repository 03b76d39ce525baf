"""Packed documents (doc_ids): each layer and model on a packed batch against each document run
alone (the independent reference: the same code on one document, no packing), and the loader's
document starts against its end-of-text separators. Each comparison is also made with the mask
switched off, where it must fail: the tests can tell.

Tolerances: the float32 noise floor measured on the same inputs, i.e. how far the float32
result for the document alone is from the float64 one (times a margin for the other summation
order), never a constant picked from one machine's output."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.layers import FullAttention, GatedDeltaNetLayer, MLSTMLayer, SlidingWindowAttention
from swax.ops import gated_delta_rule, mlstm, sliding_window_attention
from swax.ops.conv import causal_conv1d
from swax.ops.packing import doc_conv1d, doc_positions, document_spans

# two rows: one with a 1-token document and one (38 … 127) crossing the chunk boundaries at 64
# and 128 of chunk size 64 (and 16, 32), one row a single document
LENGTHS = [[1, 37, 90, 72], [200]]
T = 200


def packed_ids(lengths=LENGTHS, first=3) -> torch.Tensor:
    doc = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, ls in enumerate(lengths):
        t = 0
        for j, n in enumerate(ls):
            doc[b, t : t + n] = first + j
            t += n
        assert t == T
    return doc


def docs_of(lengths=LENGTHS):
    for b, ls in enumerate(lengths):
        t = 0
        for n in ls:
            yield b, slice(t, t + n)
            t += n


def floor_and_tol(f32: torch.Tensor, f64: torch.Tensor) -> float:
    """8 × the measured float32 noise floor, at least 8 float32 ulps of the values' size."""
    floor = (f32.double() - f64).abs().max().item()
    return 8 * max(floor, 1.2e-7 * f64.abs().max().item())


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------------------ helpers


def test_positions_and_spans():
    doc = packed_ids()
    pos = doc_positions(doc)
    assert pos[0, :5].tolist() == [0, 0, 1, 2, 3]
    assert pos[0, 38].item() == 0 and pos[0, 127].item() == 89 and pos[0, 128].item() == 0
    assert pos[1].tolist() == list(range(T))
    assert document_spans(doc) == [(0, 0, 1), (0, 1, 38), (0, 38, 128), (0, 128, 200), (1, 0, 200)]


@pytest.mark.parametrize("bad", ["float", "shape", "decreasing"])
def test_bad_doc_ids_are_errors(bad):
    model = SwaxLM(SwaxConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, window=4))
    ids = torch.zeros(2, 8, dtype=torch.long)
    doc = {
        "float": torch.zeros(2, 8),
        "shape": torch.zeros(2, 7, dtype=torch.long),
        "decreasing": torch.tensor([[0, 0, 1, 0, 1, 1, 1, 1]] * 2),
    }[bad]
    with pytest.raises(ValueError, match="doc_ids"):
        model(ids, doc_ids=doc)


# ------------------------------------------------------------------------------ ops


def _seq_inputs(seed, H=2, D=8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, H, T, D, generator=g, dtype=dtype) for _ in range(3)], g


@pytest.mark.parametrize("window", [None, 7, 64, 1000])
@pytest.mark.parametrize("backend", ["blockwise", "reference"])
def test_attention_op_per_document(window, backend):
    (q, k, v), _ = _seq_inputs(0)
    k, v = k[:, :1], v[:, :1]  # grouped-query attention: 2 query heads share one key head
    doc = packed_ids()
    out = sliding_window_attention(
        q.float(), k.float(), v.float(), window, backend=backend, doc_ids=doc
    )
    plain = sliding_window_attention(q.float(), k.float(), v.float(), window, backend=backend)
    errs, off = [], []
    for b, s in docs_of():
        args = (q[b : b + 1, :, s], k[b : b + 1, :, s], v[b : b + 1, :, s], window)
        ref = sliding_window_attention(*args, backend="reference")  # float64, alone
        tol = floor_and_tol(
            sliding_window_attention(*(a.float() for a in args[:3]), window, backend=backend), ref
        )
        errs.append(max_err(out[b : b + 1, :, s], ref) / tol)
        off.append(max_err(plain[b : b + 1, :, s], ref) / tol)
    assert max(errs) <= 1
    assert max(off) > 1  # without the mask the documents see each other


def test_dispatcher_skips_backends_without_document_masks():
    from swax.ops import available_backends
    from swax.ops.registry import BackendUnavailableError, record_backends

    q = torch.zeros(1, 2, 8, 4)
    doc = torch.zeros(1, 8, dtype=torch.long)
    names = available_backends("swa", q, q, q, 4, doc)
    assert "flash" not in names and "flex" not in names
    assert names[0] == "blockwise"
    with pytest.raises(BackendUnavailableError, match="'flex' .*document masking"):
        sliding_window_attention(q, q, q, 4, backend="flex", doc_ids=doc)
    with record_backends() as calls:
        out = sliding_window_attention(q, q, q, 4, doc_ids=doc)
    assert calls == [("swa", "blockwise")] and out.shape == q.shape


def _gates(g, H=2):
    i = torch.randn(2, H, T, generator=g, dtype=torch.float64)
    f = torch.randn(2, H, T, generator=g, dtype=torch.float64) + 3
    return i, f


@pytest.mark.parametrize("mode,backend", [("chunk", "native"), ("chunk", "autograd"),
                                          ("recurrent", None)])  # fmt: skip
def test_mlstm_op_per_document(mode, backend):
    (q, k, v), g = _seq_inputs(1)
    i, f = _gates(g)
    doc = packed_ids()
    x32 = [t.float() for t in (q, k, v, i, f)]
    kw = dict(mode=mode, chunk_size=16, backend=backend, output_final_state=True)
    h, state = mlstm(*x32, doc_ids=doc, **kw)
    h_off, _ = mlstm(*x32, **kw)
    errs, off = [], []
    for b, s in docs_of():
        alone = [t[b : b + 1, :, s] for t in (q, k, v, i, f)]
        ref, ref_state = mlstm(*alone, mode="recurrent", output_final_state=True)  # float64
        h32, st32 = mlstm(*(t.float() for t in alone), **kw)
        tol = floor_and_tol(h32, ref)
        errs.append(max_err(h[b : b + 1, :, s], ref) / tol)
        off.append(max_err(h_off[b : b + 1, :, s], ref) / tol)
        if s.stop == T:  # the row's last document: the final state is its state
            for got, want, w32 in zip(state, ref_state, st32):
                assert max_err(got[b : b + 1], want) <= floor_and_tol(w32, want)
    assert max(errs) <= 1 and max(off) > 1


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_gated_delta_op_per_document(mode):
    (q, k, v), g = _seq_inputs(2)
    q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    gl = -torch.rand(2, 2, T, generator=g, dtype=torch.float64)
    beta = torch.rand(2, 2, T, generator=g, dtype=torch.float64)
    doc = packed_ids()
    x32 = [t.float() for t in (q, k, v, gl, beta)]
    kw = dict(mode=mode, chunk_size=16, output_final_state=True)
    o, S = gated_delta_rule(*x32, doc_ids=doc, **kw)
    o_off, _ = gated_delta_rule(*x32, **kw)
    errs, off = [], []
    for b, s in docs_of():
        alone = [t[b : b + 1, :, s] for t in (q, k, v, gl, beta)]
        ref, ref_S = gated_delta_rule(*alone, mode="recurrent", output_final_state=True)
        o32, S32 = gated_delta_rule(*(t.float() for t in alone), **kw)
        tol = floor_and_tol(o32, ref)
        errs.append(max_err(o[b : b + 1, :, s], ref) / tol)
        off.append(max_err(o_off[b : b + 1, :, s], ref) / tol)
        if s.stop == T:
            assert max_err(S[b : b + 1], ref_S) <= floor_and_tol(S32, ref_S)
    assert max(errs) <= 1 and max(off) > 1


def test_conv_per_document():
    g = torch.Generator().manual_seed(3)
    u = torch.randn(2, 6, T, generator=g, dtype=torch.float64)
    w = torch.randn(6, 4, generator=g, dtype=torch.float64)
    doc = packed_ids()
    y, state = doc_conv1d(u, w, doc)
    for b, s in docs_of():
        ref, ref_state = causal_conv1d(u[b : b + 1, :, s], w)  # zeros before the document
        assert max_err(y[b : b + 1, :, s], ref) <= 1e-12
        if s.stop == T:
            assert max_err(state[b : b + 1], ref_state) <= 1e-12
    assert max_err(causal_conv1d(u, w)[0][0:1, :, 1:38], y[0:1, :, 1:38]) > 1e-3  # mask off


# ------------------------------------------------------------------------------ layers


LAYERS = {
    "S": lambda: SlidingWindowAttention(32, 4, n_kv_heads=2),
    "A": lambda: FullAttention(32, 4),
    "X": lambda: MLSTMLayer(32, 2, chunk_size=16, igate_bias_init=-2.0),
    "X+conv": lambda: MLSTMLayer(32, 2, chunk_size=16, igate_bias_init=-2.0, conv_size=4),
    "D": lambda: GatedDeltaNetLayer(32, 2, chunk_size=16),
}


def _layer_run(layer, x, doc_ids=None):
    x = x.clone().requires_grad_(True)
    y = layer(x, 24, doc_ids=doc_ids) if doc_ids is not None else layer(x, 24)
    (y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype)).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    return y.detach(), x.grad, grads


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_layer_packed_equals_documents_alone(kind):
    torch.manual_seed(4)
    layer = LAYERS[kind]()
    layer64 = copy.deepcopy(layer).double()
    x = torch.randn(2, T, 32)
    doc = packed_ids()
    y, gx, gp = _layer_run(layer, x, doc)
    y_off, gx_off, _ = _layer_run(layer, x)
    grads_alone = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in gp.items()}
    grads_alone32 = {n: torch.zeros_like(p) for n, p in gp.items()}
    y_errs, gx_errs, off = [], [], []
    for b, s in docs_of():
        xs = x[b : b + 1, s]
        y64, gx64, gp64 = _layer_run(layer64, xs.double())
        y32, gx32, gp32 = _layer_run(layer, xs)
        for n in gp:
            grads_alone[n] += gp64[n]
            grads_alone32[n] += gp32[n]
        y_errs.append(max_err(y[b : b + 1, s], y64) / floor_and_tol(y32, y64))
        gx_errs.append(max_err(gx[b : b + 1, s], gx64) / floor_and_tol(gx32, gx64))
        off.append(max_err(y_off[b : b + 1, s], y64) / floor_and_tol(y32, y64))
    assert max(y_errs) <= 1, y_errs
    assert max(gx_errs) <= 1, gx_errs
    assert max(off) > 1  # with the mask off the packed batch differs from the documents
    for n in gp:  # the parameters' gradients: the sum over documents
        assert max_err(gp[n], grads_alone[n]) <= floor_and_tol(grads_alone32[n], grads_alone[n])


# ------------------------------------------------------------------------------ models


def _model(pattern, **kw):
    torch.manual_seed(5)
    cfg = dict(
        vocab_size=61,
        d_model=32,
        n_layers=2 * len(pattern),
        n_heads=4,
        window=16,
        chunk_size=16,
        layer_pattern=pattern,
        mlstm_igate_bias_init=-2.0,
    )
    return SwaxLM(SwaxConfig(**{**cfg, **kw}))


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA"])
def test_model_packed_equals_documents_alone(pattern):
    model = _model(pattern)
    model64 = copy.deepcopy(model).double()
    ids = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(6))
    doc = packed_ids()
    logits = model(ids, doc_ids=doc)
    logits.float().logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    off = model(ids)
    errs, off_errs = [], []
    g64 = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    g32 = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for b, s in docs_of():
        for m, acc in ((model64, g64), (model, g32)):
            m.zero_grad()
            m(ids[b : b + 1, s]).logsumexp(-1).sum().backward()
            for n, p in m.named_parameters():
                acc[n] += p.grad
        with torch.no_grad():
            ref = model64(ids[b : b + 1, s])
            tol = floor_and_tol(model(ids[b : b + 1, s]), ref)
        errs.append(max_err(logits[b : b + 1, s], ref) / tol)
        off_errs.append(max_err(off[b : b + 1, s], ref) / tol)
    assert max(errs) <= 1, errs
    assert max(off_errs) > 1
    for n in grads:
        assert max_err(grads[n], g64[n]) <= floor_and_tol(g32[n], g64[n]), n


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA", "XS"])
def test_packed_prefill_then_decode_equals_the_last_document_alone(pattern):
    """Prefill of a packed prompt, then decoding: the logits are those of the row's last
    document prefilled alone and decoded with the same tokens (rows end in documents that
    start at different positions: 128 and 0; the window 16 is shorter than both)."""
    model = _model(pattern, mlstm_conv_size=4) if "X" in pattern else _model(pattern)
    ids = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(7))
    nxt = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(8))
    doc = packed_ids()
    with torch.no_grad():
        _, state = model(ids, doc_ids=doc, return_state=True)
        steps = []
        for t in range(nxt.shape[1]):
            lg, state = model(nxt[:, t : t + 1], state=state, return_state=True)
            steps.append(lg)
        got = torch.cat(steps, 1)
        _, plain_state = model(ids, return_state=True)
        plain = model(nxt[:, :1], state=plain_state)
        for b, start in ((0, 128), (1, 0)):
            alone = model(torch.cat([ids[b : b + 1, start:], nxt[b : b + 1]], 1))[:, -5:]
            alone64 = copy.deepcopy(model).double()(
                torch.cat([ids[b : b + 1, start:], nxt[b : b + 1]], 1)
            )[:, -5:]
            tol = floor_and_tol(alone, alone64)
            assert max_err(got[b : b + 1], alone64) <= tol
            if start > 0:  # without the mask the first decode step sees the earlier documents
                assert max_err(plain[b : b + 1], alone64[:, :1]) > tol


def test_beam_rows_of_a_packed_state():
    """select_rows keeps each row's document start (beam search over a packed prompt)."""
    model = _model("SX")
    ids = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        _, state = model(ids, doc_ids=packed_ids(), return_state=True)
        swapped = state.select_rows(torch.tensor([1, 0]))
        tok = torch.full((2, 1), 5)
        a, b = model(tok, state=state), model(tok, state=swapped)
        plain = model(tok, state=model(ids, return_state=True)[1].select_rows(torch.tensor([1, 0])))
    tol = 16 * torch.finfo(torch.float32).eps * a.abs().max().item()  # batched-matmul rounding
    assert max_err(a.flip(0), b) <= tol
    assert max_err(plain[1:], b[1:]) > tol  # row 0's document start (128) matters


# ------------------------------------------------------------------------------ loader


def test_loader_document_starts_match_the_separators():
    from swax.data.loader import PackedLoader, document_ids

    eot = 0
    rng = np.random.default_rng(0)
    stream = []
    for _ in range(40):
        stream += list(rng.integers(1, 50, rng.integers(1, 30))) + [eot]
    loader = PackedLoader(
        np.array(stream, np.int32), seq_len=32, micro_batch=4, seed=1, doc_mask=True
    )
    x, y, w, doc = loader.next_batch()
    assert torch.all(w == 1)
    for row, d in zip(x.tolist(), doc.tolist()):
        expect, cur = [], 0
        for t in range(len(row)):
            if t > 0 and row[t - 1] == eot:
                cur += 1
            expect.append(cur)
        assert d == expect
    assert torch.equal(document_ids(x, eot), doc)
    assert int(doc.max()) > 0  # several documents per row: the check is not vacuous


# ------------------------------------------------------------------------------ training


def _short_documents(folder):
    """A folder of 400 short documents (one or two verses each), so that a 64-token training
    row holds several of them."""
    from swax.data.sources import kjv_documents

    folder.mkdir()
    verses = [v for d in kjv_documents()[:20] for v in d.split("\n") if v.strip()]
    for i in range(400):
        (folder / f"{i:04d}.txt").write_text(" ".join(verses[i : i + 1 + i % 2]))
    return folder


def _run(tmp_path, source, name, *extra):
    from swax.train import train
    from tests.train.test_train import losses, small_cfg

    cfg = small_cfg(tmp_path, f"data.source={source}", "data.val_fraction=0.05", *extra, name=name)
    train(cfg)
    return losses(tmp_path / name)


def _weights(run_dir):
    return SwaxLM.from_pretrained(run_dir / "model").state_dict()


def _masked_run_resumes_exactly(tmp_path, src, tag):
    """A doc-masked run killed after step 3 (its later checkpoints and export removed) and
    resumed: the same losses and bit-identical weights as the uninterrupted run. Returns the
    uninterrupted run's losses."""
    import shutil

    from swax.train.checkpoint import list_checkpoints

    args = ("data.doc_mask=true", "steps=6", "checkpoint.every=3")
    full = _run(tmp_path, src, f"{tag}-full", *args)
    cut = tmp_path / f"{tag}-cut"
    shutil.copytree(tmp_path / f"{tag}-full", cut)  # the run as if killed after step 3
    shutil.rmtree(cut / "model")
    for ck in list_checkpoints(cut):
        if ck.name != "step_000003":
            shutil.rmtree(ck)
    resumed = _run(tmp_path, src, f"{tag}-cut", *args, "resume=true")
    assert {s: resumed[s] for s in (4, 5, 6)} == {s: full[s] for s in (4, 5, 6)}
    a, b = _weights(tmp_path / f"{tag}-full"), _weights(cut)
    assert all(torch.equal(a[n], b[n]) for n in a)
    return full


def test_train_with_doc_mask_on_text_resumes_exactly(tmp_path):
    src = _short_documents(tmp_path / "docs")
    full = _masked_run_resumes_exactly(tmp_path, src, "text")
    unmasked = _run(tmp_path, src, "off", "steps=6", "checkpoint.every=3")
    assert unmasked[1] != full[1]  # the mask changes what the model sees


def test_train_with_doc_mask_on_a_shard_set_resumes_exactly(tmp_path):
    from swax.data.prepare import prepare_shards

    src = _short_documents(tmp_path / "docs")
    prepare_shards(str(src), tmp_path / "set", shard_tokens=4000, val_fraction=0.05, progress=False)
    full = _masked_run_resumes_exactly(tmp_path, tmp_path / "set", "shards")
    plain = _run(tmp_path, tmp_path / "set", "p", "steps=6", "checkpoint.every=3")
    assert plain[1] != full[1]


# ------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "pattern,dtype,kernel",
    [
        ("SX", torch.float32, ("mlstm", "triton")),
        ("SD", torch.bfloat16, ("gated_delta", "fla")),
        pytest.param("SA", torch.float32, None, marks=pytest.mark.cuda_only),
    ],
    ids=["SX-triton", "SD-fla", "SA"],
)
def test_model_packed_equals_documents_alone_on_gpu(pattern, dtype, kernel):
    """The GPU's own kernels on packed documents (on CUDA, or the CPU under Triton's
    interpreter): mLSTM head dims of 16 (the Triton kernel's least), SD under bfloat16 autocast
    (fla takes bfloat16); flash and flex have no document masks, so attention runs blockwise.
    The packed batch against each document alone in float64 on the CPU; tolerance from the
    same path's result for the document alone. The kernel named is checked to have run (on the
    documents of 16 steps or more; shorter ones take the native kernel)."""
    from swax.ops.registry import backend_report, record_backends
    from tests.helpers import DEV

    model = _model(pattern, d_model=64, n_heads=2, n_layers=len(pattern))
    model64 = copy.deepcopy(model).double()
    dev = copy.deepcopy(model).to(DEV)
    ids = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(6))
    autocast = torch.autocast(DEV, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with torch.no_grad(), autocast, record_backends() as calls:
        logits = dev(ids.to(DEV), doc_ids=packed_ids().to(DEV)).float().cpu()
        for b, s in docs_of():
            ref = model64(ids[b : b + 1, s])
            tol = floor_and_tol(dev(ids[b : b + 1, s].to(DEV)).float().cpu(), ref)
            assert max_err(logits[b : b + 1, s], ref) <= tol
    env = {(r["op"], r["name"]): r["reason"] for r in backend_report(DEV)}
    if kernel is not None and env[kernel] is None:
        assert (kernel[0], kernel[1]) in calls, sorted(set(calls))

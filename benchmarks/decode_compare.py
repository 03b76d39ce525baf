"""Decode speed against its references (issue 34), run by ``benchmarks/decode.py --compare``.

For the tiny and small presets (layer pattern SX, random weights, float32), at contexts 1k and
32k, batch 1 and 16, one table of the time per decode step (``B`` new tokens, one per row):

- ``eager``: ``swax.generate.generate(..., compile=False)``, the eager reference step;
- ``compiled``: ``generate(..., compile=True)``: the fixed-shape step of ``swax.decode``,
  compiled by torch.compile (inductor) once per (preset, batch); its compile time is reported
  in a table of its own and kept out of the step times;
- ``llama``: Hugging Face ``LlamaForCausalLM.generate`` (greedy, its default dynamic cache) for
  a Llama of the same width, depth, heads, SwiGLU width and vocabulary (tied embeddings);
- ``bound``: the compute bound, FLOPs of one step (2 per multiply-add of every weight matrix and
  the head, attention over min(W, context) keys, 4·Dqk·Dv per recurrent head) ÷ the machine's
  best float32 matmul rate on this thread count (``swax.train.peak``); and ``mem``: the bytes a
  step must read (float32 weights and head, the decode state of every row) ÷ the measured copy
  bandwidth, the bound that binds at batch 1.

Each time is ``(t(n + 8) - t(8)) / n`` for ``n`` = ``--steps`` new tokens (``--long-steps`` where
a step of the reference takes long), the median over up to ``--repeats`` rounds: generation
set-up and the prefill cancel. Every call continues from a state made once: swax prefills one
row of the context and repeats it over the batch (a row's decode cost does not depend on its
values); the Llama continues from a dynamic cache of ``context - 1`` random keys and values per
layer (the same cost as a real cache; its quadratic prefill of 16 x 32k tokens would take longer
than this whole run). Llama cells whose cache exceeds ``--max-kv-gib`` are skipped (the dynamic
cache is copied by every step's concatenation: twice that much memory).

Decode weights (issue 45, ``--weights``): at batch 1 the step reads every weight once for one
multiply-add, so its floor is the memory bound, not the compute bound. For each preset and
context, the compiled step with the weights of :func:`swax.quant.decode_weights` (weight-only
int8, bfloat16) is timed in rounds interleaved with the float32 step (the same machine load for
all), against two memory bounds: ``mem f32``, the bytes of the float32 step (the ``mem`` above),
and ``mem``, the bytes the step reads at that precision (its weights as stored, the decode
state). The copy bandwidth is the best of copies before and after the cells; a copy of
:data:`CACHE_MIB` (which stays in the last-level cache, as these presets' weights do between
steps) gives a second, higher rate, and the targets are given against it too. With
``--agreement-model DIR`` (a trained checkpoint) the greedy tokens of each format are compared
with float32's (:func:`swax.quant.greedy_agreement`) over :data:`PROMPTS`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from swax import SwaxConfig, SwaxLM
from swax.decode import compile_seconds
from swax.generate import generate, prefill
from swax.layers import swiglu_hidden_dim
from swax.model import resolve_model_dir
from swax.quant import decode_weight_bytes, decode_weights, greedy_agreement
from swax.train.peak import peak_flops

WARM = 8  # the tokens of the subtracted run


def step_flops(model: SwaxLM, context: int) -> float:
    """FLOPs of one decode step of one row at position ``context`` (see the module docstring)."""
    cfg = model.config
    flops = 2.0 * (
        model.num_parameters(exclude_embeddings=True)
        + cfg.vocab_size * cfg.d_model * (1 if model.head is None else 0)
    )
    rh = cfg.recurrent_heads or cfg.n_heads
    dqk, dv = cfg.d_model * cfg.qk_dim_factor / rh, cfg.d_model * cfg.v_dim_factor / rh
    for kind in cfg.layer_types:
        if kind == "S":
            flops += 4.0 * cfg.n_heads * cfg.attn_head_dim * min(cfg.window, context)
        elif kind == "A":
            flops += 4.0 * cfg.n_heads * cfg.attn_head_dim * context
        else:
            flops += rh * 4.0 * dqk * dv
    return flops


CACHE_MIB = 16
"""The size of the second copy: the order of the small preset's weights (19.6 MB float32)."""


def copy_bandwidth(mib: int = 256) -> float:
    """Bytes per second of a large tensor copy (read + write), the best of 5."""
    a = torch.empty(mib * 2**18)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best


CLOCK = time.thread_time
"""Step times are CPU seconds of this (only) thread: on a shared machine the wall clock also
counts the time other processes hold the core (2-4x here under a load of 3-4), this does not.
Everything runs on one thread (``--threads 1``): torch's intra-op pool, MKL and the compiled
kernels alike."""


def per_step(run, n: int, repeats: int, budget_s: float = 60.0) -> dict:
    """Seconds per step of ``run(k)`` (a generation of k tokens), from t(n + WARM) - t(WARM),
    over up to ``repeats`` rounds (fewer once ``budget_s`` of wall time is spent): the best
    and the median CPU time, and the median wall time. The best is the table's figure: on a
    shared machine the noise only ever adds time."""
    cpu, wall, start = [], [], time.perf_counter()
    for _ in range(repeats):
        marks = []
        for k in (WARM, n + WARM):
            c0, w0 = CLOCK(), time.perf_counter()
            run(k)
            marks.append((CLOCK() - c0, time.perf_counter() - w0))
        cpu.append(max(marks[1][0] - marks[0][0], 0.0) / n)
        wall.append(max(marks[1][1] - marks[0][1], 0.0) / n)
        if time.perf_counter() - start > budget_s:
            break
    return {"best": min(cpu), "median": statistics.median(cpu), "wall": statistics.median(wall)}


@torch.no_grad()
def swax_cells(preset: str, contexts, batches, steps: int, repeats: int) -> list[dict]:
    """Eager and compiled step times of one preset over contexts x batches."""
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig.preset(preset, layer_pattern="SX")).eval()
    rows = []
    for T in contexts:
        ids = torch.randint(0, model.config.vocab_size, (1, T))
        logits, one = prefill(model, ids)
        for B in batches:
            state = one.select_rows(torch.zeros(B, dtype=torch.long))
            last = logits.argmax(-1).repeat(B)[:, None]

            def run(k, compile, state=state, last=last):
                return generate(model, last, k, state=state, compile=compile)

            before = compile_seconds(model)
            run(WARM, True)  # compiles (B, preset) once; later contexts reuse it
            compile_s = compile_seconds(model) - before
            e = per_step(lambda k, r=run: r(k, False), steps, repeats)
            c = per_step(lambda k, r=run: r(k, True), steps, repeats)
            eager, comp = e["best"], c["best"]
            rows.append(
                dict(
                    preset=preset,
                    context=T,
                    batch=B,
                    eager=eager,
                    compiled=comp,
                    eager_median=e["median"],
                    compiled_median=c["median"],
                    eager_wall=e["wall"],
                    compiled_wall=c["wall"],
                    compile_s=compile_s,
                    flops=step_flops(model, T) * B,
                    bytes=_step_bytes(model, state),
                )
            )
            print(
                f"  swax {preset} {T:,} x{B}: eager {eager * 1e3:.2f} ms, compiled "
                f"{comp * 1e3:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    return rows


def _step_bytes(model: SwaxLM, state) -> float:
    """Bytes one step reads at least: the weights (the tied embedding once, as the head) and
    the decode state of every row."""
    return 4.0 * model.num_parameters() + state.nbytes()


@torch.no_grad()
def weights_cells(preset: str, contexts, formats, steps: int, repeats: int) -> list[dict]:
    """Compiled step times at batch 1 of the float32 model and of its ``formats`` (decode
    weights), in interleaved rounds per context: {preset, context, weights, compiled, ...}."""
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig.preset(preset, layer_pattern="SX")).eval()
    models = {"float32": model} | {f: decode_weights(model, f) for f in formats}
    rows = []
    for T in contexts:
        ids = torch.randint(0, model.config.vocab_size, (1, T))
        logits, state = prefill(model, ids)
        last = logits.argmax(-1)[:, None]
        runs = {}
        for f, m in models.items():

            def run(k, m=m, last=last, state=state):
                return generate(m, last, k, state=state, compile=True)

            before = compile_seconds(m)
            run(WARM)  # compiles once per format; later contexts reuse it
            runs[f] = (run, compile_seconds(m) - before)
        times = {f: [] for f in models}
        for _ in range(repeats):
            for f, (run, _) in runs.items():
                times[f].append(per_step(run, steps, 1)["best"])
        f32_bytes = _step_bytes(model, state)
        for f, m in models.items():
            best = min(times[f])
            rows.append(
                dict(
                    preset=preset,
                    context=T,
                    weights=f,
                    compiled=best,
                    compiled_median=statistics.median(times[f]),
                    float32=min(times["float32"]),
                    compile_s=runs[f][1],
                    weight_bytes=decode_weight_bytes(m),
                    f32_bytes=f32_bytes,
                    bytes=decode_weight_bytes(m) + state.nbytes(),
                )
            )
            print(
                f"  swax {preset} {T:,} x1 {f} weights: compiled {best * 1e3:.3f} ms",
                file=sys.stderr,
                flush=True,
            )
    return rows


PROMPTS = [
    "In the beginning God created",
    "And the LORD spake unto Moses, saying,",
    "Blessed are the poor in spirit:",
    "The LORD is my shepherd;",
    "Now the serpent was more subtil than any beast",
    "And it came to pass after these things,",
    "Vanity of vanities, saith the Preacher,",
    "For God so loved the world,",
]
"""The agreement prompts: the King James Bible's (what the demo models are trained on)."""


def agreement(model_dir: str, formats, new_tokens: int) -> list[dict]:
    """:func:`swax.quant.greedy_agreement` of each format against the float32 checkpoint
    ``model_dir`` over :data:`PROMPTS` (compiled steps)."""
    from swax.data import load_model_tokenizer

    model = SwaxLM.from_pretrained(model_dir)
    tok = load_model_tokenizer(resolve_model_dir(model_dir))
    prompts = [torch.tensor(tok.encode(p)) for p in PROMPTS]
    rows = []
    for f in formats:
        a = greedy_agreement(model, decode_weights(model, f), prompts, new_tokens, compile=True)
        rows.append({"weights": f, **a})
        print(f"  agreement {f}: {a}", file=sys.stderr, flush=True)
    return rows


def weights_table(rows: list[dict], bandwidth: float) -> list[dict]:
    out = []
    for r in rows:
        mem32, mem = r["f32_bytes"] / bandwidth, r["bytes"] / bandwidth
        out.append(
            {
                "preset": r["preset"],
                "context": f"{r['context']:,}",
                "weights": r["weights"],
                "compiled ms": f"{r['compiled'] * 1e3:.3f}",
                "x float32": f"{r['float32'] / r['compiled']:.2f}",
                "weight MB": f"{r['weight_bytes'] / 1e6:.2f}",
                "mem f32 ms": f"{mem32 * 1e3:.3f}",
                "x mem f32": f"{r['compiled'] / mem32:.2f}",
                "mem ms": f"{mem * 1e3:.3f}",
                "x mem": f"{r['compiled'] / mem:.2f}",
            }
        )
    return out


def weights_targets(rows: list[dict], bandwidth: float, rate: str = "") -> list[str]:
    """Issue 45's target: the small preset at batch 1 within 2x of the memory bound, against
    the float32 bytes and against the bytes at each precision (``rate``: a note on the copy
    rate, when not the table's)."""
    lines = []
    for r in rows:
        if r["preset"] != "small":
            continue
        for name, b in (("float32 bytes", r["f32_bytes"]), ("its own bytes", r["bytes"])):
            x = r["compiled"] / (b / bandwidth)
            ok = "yes" if x <= 2 else "NO"
            lines.append(
                f"small {r['context']:,} x1 {r['weights']} compiled / memory bound "
                f"({name}{rate}): {x:.2f} (need <= 2: {ok})"
            )
    return lines


def llama_for(preset: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    sc = SwaxConfig.preset(preset)
    cfg = LlamaConfig(
        vocab_size=sc.vocab_size,
        hidden_size=sc.d_model,
        intermediate_size=swiglu_hidden_dim(
            sc.d_model, sc.mlp_ratio, sc.mlp_multiple_of, sc.mlp_rounding
        ),
        num_hidden_layers=sc.n_layers,
        num_attention_heads=sc.n_heads,
        num_key_value_heads=sc.n_heads,
        tie_word_embeddings=True,
        max_position_embeddings=2**17,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def kv_gib(llama, batch: int, context: int) -> float:
    c = llama.config
    hd = c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * batch * c.num_key_value_heads * context * hd * 4 / 2**30


@torch.no_grad()
def llama_cell(llama, context: int, batch: int, steps: int, repeats: int) -> dict:
    """:func:`per_step` of LlamaForCausalLM.generate continuing from a random cache."""
    from transformers import DynamicCache

    c = llama.config
    hd = c.hidden_size // c.num_attention_heads
    shape = (batch, c.num_key_value_heads, context - 1, hd)
    keys = [(torch.randn(shape), torch.randn(shape)) for _ in range(c.num_hidden_layers)]
    ids = torch.randint(0, c.vocab_size, (batch, context))
    mask = torch.ones_like(ids)

    def run(k):
        cache = DynamicCache(config=c)
        for layer, (kk, vv) in enumerate(keys):
            cache.update(kk, vv, layer)  # each step concatenates into new tensors: these stay
        llama.generate(
            ids,
            attention_mask=mask,
            cache=cache,
            max_new_tokens=k,
            min_new_tokens=k,
            do_sample=False,
            pad_token_id=0,
        )

    run(2)  # warm-up
    return per_step(run, steps, repeats)


def measure(presets, contexts, batches, steps, long_steps, repeats, max_kv_gib, formats=()) -> dict:
    """All cells: {"rows": [...], "weights": [...], "peak": Peak, "bandwidth": bytes/s (the
    best copy), "copies": [bytes/s before, after], "cache_bandwidth": the best CACHE_MIB copy,
    "skipped": [...]}."""
    peak = peak_flops(torch.device("cpu"))
    copies, cache = [copy_bandwidth()], [copy_bandwidth(CACHE_MIB)]
    rows, wrows, skipped = [], [], []
    for preset in presets:
        rows += swax_cells(preset, contexts, batches, steps, repeats)
        if formats:
            wrows += weights_cells(preset, contexts, formats, steps, repeats)
        llama = llama_for(preset)
        for r in (r for r in rows if r["preset"] == preset):
            gib = kv_gib(llama, r["batch"], r["context"])
            if gib > max_kv_gib:
                skipped.append(
                    f"llama {preset} {r['context']:,} x{r['batch']}: its cache "
                    f"would be {gib:.1f} GiB (> --max-kv-gib {max_kv_gib})"
                )
                continue
            n = long_steps if r["context"] * r["batch"] > 8192 else steps
            t = llama_cell(llama, r["context"], r["batch"], n, repeats)
            r["llama"], r["llama_median"], r["llama_wall"] = t["best"], t["median"], t["wall"]
            print(
                f"  llama {preset} {r['context']:,} x{r['batch']}: {r['llama'] * 1e3:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    copies.append(copy_bandwidth())
    cache.append(copy_bandwidth(CACHE_MIB))
    bandwidth = max(copies)
    for r in rows:
        r["bound"] = r["flops"] / peak.flops
        r["mem"] = r["bytes"] / bandwidth
    return {
        "rows": rows,
        "weights": wrows,
        "peak": peak,
        "bandwidth": bandwidth,
        "copies": copies,
        "cache_bandwidth": max(cache),
        "skipped": skipped,
    }


def table_rows(rows: list[dict]) -> list[dict]:
    def ms(x):
        return "" if x is None else f"{x * 1e3:.3f}" if x < 0.01 else f"{x * 1e3:.2f}"

    out = []
    for r in rows:
        llama = r.get("llama")
        out.append(
            {
                "preset": r["preset"],
                "context": f"{r['context']:,}",
                "batch": r["batch"],
                "eager ms": ms(r["eager"]),
                "compiled ms": ms(r["compiled"]),
                "x eager": f"{r['eager'] / r['compiled']:.2f}",
                "tok/s": f"{r['batch'] / r['compiled']:,.0f}",
                "llama ms": ms(llama),
                "x llama": "" if llama is None else f"{llama / r['compiled']:.2f}",
                "bound ms": ms(r["bound"]),
                "x bound": f"{r['compiled'] / r['bound']:.1f}",
                "mem ms": ms(r["mem"]),
                "x mem": f"{r['compiled'] / r['mem']:.1f}",
            }
        )
    return out


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, met or missed, and by how much."""
    lines = []

    def verdict(name, value, need, more=True):
        ok = value >= need if more else value <= need
        lines.append(
            f"{name}: {value:.2f} (need {'>=' if more else '<='} {need}: {'yes' if ok else 'NO'})"
        )

    find = {(r["preset"], r["context"], r["batch"]): r for r in rows}
    for (p, T, B), r in sorted(find.items()):
        if p == "tiny" and B == 1:
            verdict(f"tiny {T:,} x1 compiled vs eager", r["eager"] / r["compiled"], 5)
        if r.get("llama") is not None and T in (1024, 32768):
            need = 2 if T == 1024 else 10
            verdict(f"{p} {T:,} x{B} compiled vs llama", r["llama"] / r["compiled"], need)
        if B > 1 and (p, T, 1) in find:
            one = find[p, T, 1]
            gain = (B / r["compiled"]) / (1 / one["compiled"])
            verdict(f"{p} {T:,} tok/s x{B} / x1", gain, 8 if B == 16 else B / 2)
        if p == "small":
            verdict(
                f"small {T:,} x{B} compiled / compute bound",
                r["compiled"] / r["bound"],
                5,
                more=False,
            )
    return lines


def header(args) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"load average {load} (1, 5, 15 min); {args}"

"""Scoring a model on task requests, as lm-evaluation-harness scores a causal LM.

- :func:`encode_pair`: the token ids of a (context, continuation) request. Tokenisation follows
  the harness: trailing spaces of a context move to the continuation, the continuation's tokens
  are those of ``encode(context + continuation)`` after ``encode(context)``, and an empty
  context becomes the end-of-text token;
- :func:`score_continuations`: the summed log-likelihood of each continuation given its context
  and whether greedy decoding reproduces it (multiple choice, LAMBADA);
- :func:`rolling_loglikelihood`: the log-likelihood of whole documents, in chunks that carry
  the state forward;
- :func:`generate_texts`: completions cut at stop strings (code tasks);
- :func:`add_mean`: a metric's mean and its standard error over the items.

The task metrics built on them (acc, acc_norm, perplexity, pass@1): :mod:`swax.eval.tasks`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from swax.core.errors import SwaxError
from swax.core.progress import progress_bar as _bar
from swax.generate import generate_batch, truncate_at_stop
from swax.state import DEFAULT_WINDOW

__all__ = [
    "encode_pair",
    "score_continuations",
    "rolling_loglikelihood",
    "generate_texts",
    "progress_bar",
    "mean_stderr",
    "add_mean",
]


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation token ids as lm-evaluation-harness makes them for a causal LM:
    trailing spaces of the context move to the continuation; the continuation's ids are
    ``encode(context + continuation)`` after ``encode(context)``; an empty context is the
    end-of-text token."""
    if context == "":
        cont = tokenizer.encode(continuation)
        if cont and cont[0] == tokenizer.eot_id:
            return cont[:1], cont[1:]
        return [tokenizer.eot_id], cont
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    cont = whole[len(ctx) :]
    return (ctx or [tokenizer.eot_id]), cont


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def _token_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor):
    """Log-probabilities of ``targets`` (N,) and whether each is the argmax, from final hidden
    states (N, d), in slices so that no more than ~64M logits exist at once."""
    V = model.config.vocab_size
    step = max(1, (1 << 26) // V)
    lps, greedy = [], []
    for s in range(0, hidden.shape[0], step):
        logits = model.logits(hidden[s : s + step]).float()
        lp = logits.log_softmax(-1)
        t = targets[s : s + step]
        lps.append(lp.gather(-1, t[:, None])[:, 0])
        greedy.append(logits.argmax(-1) == t)
    if not lps:
        return hidden.new_zeros(0, dtype=torch.float32), torch.zeros(0, dtype=torch.bool)
    return torch.cat(lps), torch.cat(greedy)


def progress_bar(total: int, desc: str, progress: bool, unit: str = "seq"):
    """A bar on a terminal that leaves no line behind, plain periodic lines elsewhere (hidden
    unless ``progress``); see :mod:`swax.core.progress`."""
    return _bar(total, desc, unit, enabled=progress, leave=False)


@torch.no_grad()
def score_continuations(
    model,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    window=DEFAULT_WINDOW,
    batch_size: int = 8,
    pad_id: int = 0,
    progress: bool = False,
    desc: str = "loglikelihood",
) -> list[tuple[float, bool]]:
    """For each (context ids, continuation ids): the summed log-probability of the continuation
    given the context, and whether greedy decoding would produce it.

    Sequences (context + continuation minus its last token) are sorted by length, batched
    ``batch_size`` at a time and right-padded; only the hidden states at continuation positions
    go through the output head. Contexts must be non-empty (see :func:`encode_pair`)."""
    if batch_size < 1:
        raise SwaxError(f"batch size must be >= 1, got {batch_size}")
    device = _model_device(model)
    if window is DEFAULT_WINDOW:
        window = model.config.window
    out: list[tuple[float, bool] | None] = [None] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    bar = progress_bar(len(requests), desc, progress)
    try:
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            rows = []
            for i in idx:
                ctx, cont = list(requests[i][0]), list(requests[i][1])
                if not ctx:
                    raise ValueError("score_continuations needs a non-empty context")
                if not cont:
                    out[i] = (0.0, True)
                rows.append((ctx + cont)[:-1] if cont else ctx)
            L = max(len(r) for r in rows)
            ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
            for b, r in enumerate(rows):
                ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            hidden = model(ids.to(device), window=window, return_hidden=True)
            sel_b, sel_t, targets, spans = [], [], [], []
            for b, i in enumerate(idx):
                ctx, cont = requests[i]
                start = len(ctx) - 1
                sel_b += [b] * len(cont)
                sel_t += list(range(start, start + len(cont)))
                targets += list(cont)
                spans.append(len(cont))
            h = hidden[torch.tensor(sel_b, device=device), torch.tensor(sel_t, device=device)]
            lp, greedy = _token_logprobs(model, h, torch.tensor(targets, device=device))
            lp, greedy = lp.double().cpu(), greedy.cpu()
            pos = 0
            for i, n in zip(idx, spans):
                if n:
                    out[i] = (float(lp[pos : pos + n].sum()), bool(greedy[pos : pos + n].all()))
                pos += n
            bar.update(len(idx))
    finally:
        bar.close()
    return out  # type: ignore[return-value]


@torch.no_grad()
def rolling_loglikelihood(
    model,
    token_lists: Sequence[Sequence[int]],
    *,
    prefix_id: int,
    window=DEFAULT_WINDOW,
    chunk_size: int = 2048,
    batch_size: int = 8,
    pad_id: int = 0,
    progress: bool = False,
    desc: str = "loglikelihood_rolling",
) -> list[float]:
    """Log-likelihood of every token of each document given all the tokens before it (the first
    given ``prefix_id``), computed in chunks of ``chunk_size`` tokens that carry the recurrent
    and sliding-window state forward: exact full-context scores in bounded memory, whatever the
    document length. Documents are batched ``batch_size`` at a time (right-padded)."""
    if chunk_size < 1:
        raise SwaxError(f"chunk size must be >= 1, got {chunk_size}")
    device = _model_device(model)
    if window is DEFAULT_WINDOW:
        window = model.config.window
    out = [0.0] * len(token_lists)
    order = sorted(range(len(token_lists)), key=lambda i: -len(token_lists[i]))
    bar = progress_bar(len(token_lists), desc, progress, unit="doc")
    try:
        for s in range(0, len(order), batch_size):
            idx = [i for i in order[s : s + batch_size] if len(token_lists[i])]
            bar.update(len(order[s : s + batch_size]) - len(idx))
            if not idx:
                continue
            L = max(len(token_lists[i]) for i in idx)
            inp = torch.full((len(idx), L), pad_id, dtype=torch.long)
            tgt = torch.full((len(idx), L), -1, dtype=torch.long)
            for b, i in enumerate(idx):
                toks = list(token_lists[i])
                inp[b, : len(toks)] = torch.tensor([prefix_id] + toks[:-1])
                tgt[b, : len(toks)] = torch.tensor(toks)
            inp, tgt = inp.to(device), tgt.to(device)
            totals = torch.zeros(len(idx), dtype=torch.float64, device=device)
            state = None
            for c in range(0, L, chunk_size):
                hidden, state = model(
                    inp[:, c : c + chunk_size],
                    window=window,
                    state=state,
                    return_state=True,
                    return_hidden=True,
                )
                t = tgt[:, c : c + chunk_size]
                mask = t >= 0
                if not bool(mask.any()):
                    break
                lp, _ = _token_logprobs(model, hidden[mask], t[mask])
                rows = torch.nonzero(mask)[:, 0]
                totals.index_add_(0, rows, lp.double())
            for b, i in enumerate(idx):
                out[i] = float(totals[b])
            bar.update(len(idx))
    finally:
        bar.close()
    return out


@torch.no_grad()
def generate_texts(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    stop: Sequence[str] = (),
    max_new_tokens: int = 256,
    window=DEFAULT_WINDOW,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "generate",
    prefill_chunk_size: int = 2048,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    compile: bool | None = None,
) -> list[str]:
    """Completions of ``prompts`` (greedy unless ``temperature`` > 0), each cut before the
    first stop string (and at the end-of-text token). Prompts of any lengths are decoded
    together, ``batch_size`` at a time (:func:`swax.generate.generate_batch`: each prompt's
    tokens are those it gets alone, greedy); prefill is chunked. ``compile`` as in
    :func:`swax.generate.generate`."""
    if window is DEFAULT_WINDOW:
        window = model.config.window
    encoded = [tokenizer.encode(p) or [tokenizer.eot_id] for p in prompts]
    if not encoded:
        return []
    bar = progress_bar(len(prompts), desc, progress, unit="prompt")
    try:
        new_ids = generate_batch(
            model,
            encoded,
            max_new_tokens=max_new_tokens,
            window=window,
            stop_strings=list(stop),
            detokenize=tokenizer.decode,
            eos_token_id=tokenizer.eot_id,
            prefill_chunk_size=prefill_chunk_size,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            batch_size=batch_size,
            compile=compile,
            on_batch=bar.update,
        )
    finally:
        bar.close()
    out = []
    for new in new_ids:
        if tokenizer.eot_id in new:
            new = new[: new.index(tokenizer.eot_id)]
        out.append(truncate_at_stop(tokenizer.decode(new), stop))
    return out


def mean_stderr(xs: Sequence[float]) -> float | None:
    """The standard error of the mean of ``xs`` (None for fewer than two values)."""
    n = len(xs)
    if n < 2:
        return None
    mu = sum(xs) / n
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


def add_mean(name: str, xs: Sequence[float], out: dict) -> None:
    """Set ``out[name]`` to the mean of ``xs`` (nan if empty) and ``out[name_stderr]``."""
    out[name] = sum(xs) / len(xs) if xs else float("nan")
    out[f"{name}_stderr"] = mean_stderr(xs)

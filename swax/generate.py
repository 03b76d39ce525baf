"""Generation: chunked prefill of a prompt of any length, then step-by-step decode.

Prefill feeds the prompt in chunks of ``prefill_chunk_size`` tokens, carrying the per-layer
state and computing logits for the last position only, so a 131k-token prompt never makes a
T×T or T×vocab tensor. Decode then feeds one token at a time. For a model of S/X/D layers the
state (ring buffers of W keys/values, fixed-size recurrent states) does not grow with the
context, so memory and time per token are constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from .state import DEFAULT_WINDOW, SwaxState

if TYPE_CHECKING:
    from .model import SwaxLM

PREFILL_CHUNK = 2048
"""Prompt tokens per forward pass of a prefill, unless a caller says otherwise: long enough to
keep the matrix products efficient, short enough that activations stay small."""


@torch.no_grad()
def prefill(
    model: SwaxLM,
    input_ids: torch.Tensor,
    window=DEFAULT_WINDOW,
    state: SwaxState | None = None,
    chunk_size: int = PREFILL_CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[torch.Tensor, SwaxState]:
    """Run ``input_ids`` (B, T) through the model in chunks; return the last position's logits
    (B, vocab) in float32 and the state after the prompt. ``progress(done, total)`` is called
    after every chunk."""
    if chunk_size < 1:
        raise ValueError(f"prefill chunk size must be >= 1, got {chunk_size}")
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    T = input_ids.shape[1]
    if T == 0:
        raise ValueError("the prompt is empty: generation needs at least one token")
    logits = None
    for s in range(0, T, chunk_size):
        logits, state = model(
            input_ids[:, s : s + chunk_size],
            window=window,
            state=state,
            return_state=True,
            logits_to_keep=1,
        )
        if progress is not None:
            progress(min(T, s + chunk_size), T)
    return logits[:, -1].float(), state


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (B,) from logits (B, vocab): greedy when temperature == 0, else sampling
    from softmax(logits / temperature) restricted to the top-k and to the nucleus of mass top_p."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass of the tokens before it already reaches top_p
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def check_generation_options(max_new_tokens, temperature, top_k, top_p) -> None:
    """Raise ValueError naming the first invalid sampling option."""
    n = max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}"
        )
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


@torch.no_grad()
def generate(
    model: SwaxLM,
    input_ids: torch.Tensor,
    max_new_tokens: int = 32,
    window=DEFAULT_WINDOW,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | None = None,
    stop_sequences: Sequence[Sequence[int]] = (),
    stop_strings: Sequence[str] = (),
    decode: Callable[[list[int]], str] | None = None,
    pad_token_id: int | None = None,
    prefill_chunk_size: int = PREFILL_CHUNK,
    state: SwaxState | None = None,
    return_state: bool = False,
    on_token: Callable[[torch.Tensor], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
):
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (B, T).

    A row stops at ``eos_token_id`` (kept), when its generated ids end with one of
    ``stop_sequences``, or when ``decode(generated ids)`` contains one of ``stop_strings``
    (``decode`` is required for stop strings; cut the text with :func:`truncate_at_stop`;
    empty stop sequences and strings are ignored).
    Stopped rows are padded with ``pad_token_id`` (default: eos, else 0) until all rows stop.
    ``seed`` makes sampling reproducible. ``state`` continues from an earlier call (the prompt
    then holds only the new tokens). ``on_token(ids (B,))`` is called after every step.

    Returns the prompt followed by the generated ids, (B, T + n) with n <= max_new_tokens
    [and the SwaxState when ``return_state``]. As with Hugging Face's cache, that state has
    consumed every returned id *except the last generated one* (which was sampled but never fed
    back), so ``state.pos == T + n - 1`` when n >= 1 (``T`` with no new token). To continue,
    pass that last id first: ``generate(model, out[:, -1:], state=state)``.
    """
    check_generation_options(max_new_tokens, temperature, top_k, top_p)
    stop_strings = [s for s in stop_strings if s]  # "" would stop every row at once
    if stop_strings and decode is None:
        raise ValueError("stop_strings need a decode function (token ids -> text)")
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    device = model.embed.weight.device
    input_ids = input_ids.to(device)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)

    logits, state = prefill(model, input_ids, window, state, prefill_chunk_size, progress)
    B = input_ids.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    out: list[torch.Tensor] = []
    stops = [list(s) for s in stop_sequences if len(s)]
    for step in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, top_p, gen)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        out.append(nxt)
        if on_token is not None:
            on_token(nxt)
        if eos_token_id is not None:
            done |= nxt == eos_token_id
        if stops or stop_strings:
            gen_ids = torch.stack(out, 1).tolist()
            for b in range(B):
                if done[b]:
                    continue
                ids = gen_ids[b]
                if any(ids[-len(s) :] == s for s in stops) or (
                    stop_strings and any(s in decode(ids) for s in stop_strings)
                ):
                    done[b] = True
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        logits, state = model(nxt[:, None], window=window, state=state, return_state=True)
        logits = logits[:, -1].float()
    ids = torch.cat([input_ids, torch.stack(out, 1)], 1) if out else input_ids
    return (ids, state) if return_state else ids


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` cut before the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stop_strings:
        i = text.find(s)
        if s and i != -1:
            cut = min(cut, i)
    return text[:cut]

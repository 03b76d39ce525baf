"""Generation: chunked prefill of a prompt of any length, then step-by-step decode.

Prefill feeds the prompt in chunks of ``prefill_chunk_size`` tokens, carrying the per-layer
state and computing logits for the last position only, so a 131k-token prompt never makes a
T×T or T×vocab tensor. Decode then feeds one token at a time. For a model of S/X/D layers the
state (ring buffers of W keys/values, fixed-size recurrent states) does not grow with the
context, so memory and time per token are constant.
The model is annotated ``nn.Module``: it is a :class:`swax.model.SwaxLM`, whose ``generate``
method calls this module, so this module does not import it back (no import circle).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from swax.core.errors import InputError
from swax.decode import Decoder
from swax.sampling import Sampling, check_sampling, sample_next
from swax.state import DEFAULT_WINDOW, SwaxState

PREFILL_CHUNK = 2048
"""Prompt tokens per forward pass of a prefill, unless a caller says otherwise: long enough to
keep the matrix products efficient, short enough that activations stay small."""


@torch.no_grad()
def prefill(
    model: nn.Module,
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
        raise InputError("the prompt is empty: generation needs at least one token")
    model.check_token_ids(input_ids)  # once for the prompt, not per chunk
    logits = None
    for s in range(0, T, chunk_size):
        logits, state = model(
            input_ids[:, s : s + chunk_size],
            window=window,
            state=state,
            return_state=True,
            logits_to_keep=1,
            check_ids=False,
        )
        if progress is not None:
            progress(min(T, s + chunk_size), T)
    return logits[:, -1].float(), state


def check_generation_options(max_new_tokens, temperature, top_k, top_p) -> None:
    """Raise ValueError naming the first invalid generation option."""
    n = max_new_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, top_p)


@dataclass
class _Stopping:
    """What ends a row, and the padding of rows that ended."""

    eos: int | None
    pad: int
    stops: list[list[int]]
    stop_strings: list[str]
    detokenize: Callable[[list[int]], str] | None

    def can_end(self) -> bool:
        """Whether anything but the token budget can end a row."""
        return self.eos is not None or bool(self.stops) or bool(self.stop_strings)


CHECK_EVERY = 8
"""Decode steps between two checks of whether every row has stopped, on a GPU: each check
reads a value back to the host (a sync), so it is not made per token. The check only decides
when the loop ends: the ids, their padding and the ``on_token`` calls are those of a check per
step (see :class:`_Rows`). On the CPU, where reading back costs nothing, it checks every step
(no step is computed in vain); with ``return_state`` too (the state must stop where the output
does)."""

NEVER = 1 << 62


def _check_every(device: torch.device, return_state: bool) -> int:
    return CHECK_EVERY if device.type != "cpu" and not return_state else 1


MAX_TAIL_IDS = 1024
"""The most ids a row's stop-string tail keeps, however little text they decode to."""


class _Rows:
    """The rows of one generation and what ends them, kept on the device: an eos or a stop
    sequence ends a row inside the step's own tensors (the stop sequences are matched on a
    tail of the last ids, never on the whole output); stop strings need text, so they are
    checked at :meth:`flush` from each row's last few ids (as few as hold the longest stop
    string's bytes with room to spare: incremental, not a decode of the whole output per
    step). A row that ends is
    padded from the next step on; ``end[b]`` is the number of ids row ``b`` kept (its stop
    included), NEVER while it runs."""

    def __init__(self, stopping: _Stopping, done: torch.Tensor, on_token):
        self.s, self.done, self.on_token = stopping, done, on_token
        device = done.device
        self.end = torch.where(done, 0, NEVER)
        longest = max((len(q) for q in stopping.stops), default=0)
        self.tail = torch.full((done.shape[0], longest), -1, dtype=torch.long, device=device)
        self.seqs = [torch.tensor(q, dtype=torch.long, device=device) for q in stopping.stops]
        # each row's last ids, as few as decode to at least the longest stop string's bytes +
        # 16 (room for a character split at the tail's start, decoded as up to 3 U+FFFD): a
        # stop string that ends at the newest id lies within that text, whatever number of
        # ids it took (some tokenizers have ids that decode to nothing)
        self.keep = max((len(t.encode("utf-8")) for t in stopping.stop_strings), default=0) + 16
        self.recent: list[deque] = [deque() for _ in range(done.shape[0])]
        self.flushed = 0  # steps handed to on_token and checked for stop strings

    def mark(self, nxt: torch.Tensor, step: int) -> None:
        """Rows that ``nxt`` (the ids of ``step``) ends by eos or a stop sequence: on the
        device, no sync."""
        hit = torch.zeros_like(self.done)
        if self.s.eos is not None:
            hit |= nxt == self.s.eos
        if self.seqs:
            self.tail = torch.cat([self.tail[:, 1:], nxt[:, None]], 1)
            n = self.tail.shape[1]
            for q in self.seqs:
                hit |= (self.tail[:, n - len(q) :] == q).all(-1)
        new = hit & ~self.done
        self.end = torch.where(new, step + 1, self.end)
        self.done |= new

    def flush(self, out: list[torch.Tensor]) -> int | None:
        """Check the steps since the last flush for stop strings (one read-back of their ids),
        pad what follows a stop so found, hand the steps to ``on_token``; return the output's
        length when every row has ended (None while one runs)."""
        if self.s.stop_strings:
            self._stop_strings(out)
        end = self.end.tolist()
        n = max(max(end), 1) if max(end) < NEVER else None
        last = len(out) if n is None else n
        if self.on_token is not None:
            for t in range(self.flushed, last):
                self.on_token(out[t])
        self.flushed = last
        return n

    def _stop_strings(self, out: list[torch.Tensor]) -> None:
        new = torch.stack(out[self.flushed :], 1).tolist()  # (B, steps) in one read-back
        end = self.end.tolist()
        for b, ids in enumerate(new):
            for j, tok in enumerate(ids):
                t = self.flushed + j
                if t >= end[b]:
                    break
                recent = self.recent[b]
                recent.append(tok)
                if any(q in self.s.detokenize(list(recent)) for q in self.s.stop_strings):
                    self._end_at(b, t, out)
                    break
                self._trim(recent)

    def _trim(self, recent: deque) -> None:
        """Drop the oldest ids while the rest still decode to ``keep`` bytes or more (and
        beyond MAX_TAIL_IDS ids whatever they decode to: ids that decode to nothing must not
        make every step's decode longer)."""
        while len(recent) > MAX_TAIL_IDS:
            recent.popleft()
        while len(recent) > 1:
            rest = self.s.detokenize(list(recent)[1:])
            if len(rest.encode("utf-8", "replace")) < self.keep:
                return
            recent.popleft()

    def _end_at(self, b: int, t: int, out: list[torch.Tensor]) -> None:
        """Row ``b`` stopped at step ``t``, found after later steps ran: pad those."""
        for later in out[t + 1 :]:
            later[b] = self.s.pad
        self.end[b] = t + 1
        self.done[b] = True


def _stopping(eos_token_id, pad_token_id, stop_sequences, stop_strings, detokenize) -> _Stopping:
    stop_strings = [s for s in stop_strings if s]  # "" would stop every row at once
    if stop_strings and detokenize is None:
        raise ValueError("stop_strings need a detokenize function (token ids -> text)")
    pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
    stops = [list(s) for s in stop_sequences if len(s)]
    return _Stopping(eos_token_id, pad, stops, stop_strings, detokenize)


def _detokenizer(detokenize, decode):
    """``detokenize``, or what the former keyword ``decode`` gave (one DeprecationWarning)."""
    if decode is None:
        return detokenize
    if detokenize is not None and detokenize is not decode:
        raise ValueError("pass detokenize= only: decode= is its former name")
    warnings.warn(
        "the decode= keyword of generate and generate_batch is now detokenize= (the function "
        "from token ids to text); decode= goes in the next release",
        DeprecationWarning,
        stacklevel=4,  # the caller of generate (through torch.no_grad's wrapper)
    )
    return decode


def _decode_loop(nxt, advance, max_new_tokens, stopping, on_token, done, every=1):
    """The generated ids, one (B,) tensor per step, and {row: ids it kept} for the rows that
    stopped: ``nxt`` first (sampled from the prefill's logits), then ``advance(previous
    ids)`` until every row has stopped (rows ``done`` at the start only ever produce padding)
    or ``max_new_tokens`` ids are out. Whether every row has stopped is read back every
    ``every`` steps; the result does not depend on it."""
    out: list[torch.Tensor] = []
    if not (stopping.can_end() or bool(done.any())):  # nothing to check, nothing to sync
        for step in range(max_new_tokens):
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
            if step == max_new_tokens - 1:
                break
            nxt = advance(nxt)
        return out, {}
    rows, checks = _Rows(stopping, done, on_token), stopping.can_end()
    for step in range(max_new_tokens):
        nxt = torch.where(rows.done, torch.full_like(nxt, stopping.pad), nxt)
        out.append(nxt)
        last = step == max_new_tokens - 1
        rows.mark(nxt, step)
        if last or (checks and (step + 1) % every == 0):  # only rows done from the start: none
            n = rows.flush(out)
            if n is not None:
                del out[n:]
                break
        if last:
            break
        nxt = advance(nxt)
    return out, {b: e for b, e in enumerate(rows.end.tolist()) if e < NEVER}


@torch.no_grad()
def generate(
    model: nn.Module,
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
    detokenize: Callable[[list[int]], str] | None = None,
    pad_token_id: int | None = None,
    prefill_chunk_size: int = PREFILL_CHUNK,
    state: SwaxState | None = None,
    return_state: bool = False,
    on_token: Callable[[torch.Tensor], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    compile: bool | None = None,
    decode: Callable[[list[int]], str] | None = None,
):
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (B, T).

    A row stops at ``eos_token_id`` (kept), when its generated ids end with one of
    ``stop_sequences``, or when ``detokenize(generated ids)`` (the tokenizer's ids-to-text
    function) contains one of ``stop_strings`` (``detokenize`` is required for stop strings;
    cut the text with :func:`truncate_at_stop`; empty stop sequences and strings are ignored).
    ``decode`` is the former name of ``detokenize``, kept for one release with a
    DeprecationWarning.
    Stopped rows are padded with ``pad_token_id`` (default: eos, else 0) until all rows stop.
    ``seed`` makes sampling reproducible. ``state`` continues from an earlier call (the prompt
    then holds only the new tokens). ``on_token(ids (B,))`` is called with every step's ids, in
    order (on a GPU with stops in play, at the all-stopped checks: up to 8 steps late).

    ``compile``: decode through the compiled fixed-shape step of :mod:`swax.decode` (True),
    the eager step (False, the reference), or automatically (None, the default: for at least
    :data:`swax.decode.COMPILE_MIN_TOKENS` new tokens or a configuration compiled before;
    :func:`swax.decode.choose_step` decides). The prefill is eager and chunked either way; the
    tokens are the same (up to float32 rounding at near-ties).

    Returns the prompt followed by the generated ids, (B, T + n) with n <= max_new_tokens
    [and the SwaxState when ``return_state``]. As with Hugging Face's cache, that state has
    consumed every returned id *except the last generated one* (which was sampled but never fed
    back), so ``state.pos == T + n - 1`` when n >= 1 (``T`` with no new token). To continue,
    pass that last id first: ``generate(model, out[:, -1:], state=state)``.
    """
    check_generation_options(max_new_tokens, temperature, top_k, top_p)
    _check_compile(compile)
    detokenize = _detokenizer(detokenize, decode)
    stopping = _stopping(eos_token_id, pad_token_id, stop_sequences, stop_strings, detokenize)
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    device = model.embed.weight.device
    input_ids = input_ids.to(device)
    gen = _generator(seed, device)
    logits, state = prefill(model, input_ids, window, state, prefill_chunk_size, progress)
    B = input_ids.shape[0]
    nxt = sample_next(logits, temperature, top_k, top_p, gen)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    decoder, advance = None, None
    if max_new_tokens > 1:  # else no step: the one id comes from the prefill's logits
        sampling = Sampling(temperature, top_k, top_p)
        decoder = Decoder.start(
            model, [(state, range(B))], nxt, sampling, compile, max_new_tokens, gen
        )
        state, advance = None, decoder.advance  # the buffers hold the state now
    every = _check_every(device, return_state)
    out, _ = _decode_loop(nxt, advance, max_new_tokens, stopping, on_token, done, every)
    ids = torch.cat([input_ids, torch.stack(out, 1)], 1) if out else input_ids
    if not return_state:
        return ids
    return ids, (state if decoder is None else decoder.swax_state(model))


def _check_compile(compile) -> None:
    if compile is not None and not isinstance(compile, bool):
        raise ValueError(f"compile must be True, False or None (automatic), got {compile!r}")


def _generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` cut before the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stop_strings:
        i = text.find(s)
        if s and i != -1:
            cut = min(cut, i)
    return text[:cut]


# ------------------------------------------------------------------------------ batches


@dataclass
class _BatchOptions:
    max_new: int
    window: object
    temperature: float
    top_k: int | None
    top_p: float | None
    gen: torch.Generator | None
    chunk: int
    compile: bool | None


def _check_prompts(prompts, vocab_size: int) -> list[torch.Tensor]:
    """``prompts`` as 1-D LongTensors on the CPU; ValueError naming the first bad one."""
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of token id lists or 1-D tensors")
    out = []
    for i, p in enumerate(prompts):
        try:
            t = p if isinstance(p, torch.Tensor) else torch.as_tensor(list(p))
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"prompt {i} must be a non-empty 1-D sequence of token ids") from None
        if t.ndim != 1 or t.numel() == 0 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"prompt {i} must be a non-empty 1-D sequence of token ids")
        if int(t.min()) < 0 or int(t.max()) >= vocab_size:
            raise InputError(f"prompt {i} has a token id outside 0 … {vocab_size - 1}")
        out.append(t.long().cpu())
    return out


@torch.no_grad()
def generate_batch(
    model: nn.Module,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    max_new_tokens: int = 32,
    window=DEFAULT_WINDOW,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | None = None,
    stop_sequences: Sequence[Sequence[int]] = (),
    stop_strings: Sequence[str] = (),
    detokenize: Callable[[list[int]], str] | None = None,
    prefill_chunk_size: int = PREFILL_CHUNK,
    batch_size: int = 16,
    compile: bool | None = None,
    on_batch: Callable[[int], None] | None = None,
    decode: Callable[[list[int]], str] | None = None,
) -> list[list[int]]:
    """The new token ids of each of ``prompts`` (token id lists or 1-D tensors, of any
    lengths), decoded together in batches of up to ``batch_size`` rows.

    No padding ever enters the model: the prompts of a batch are prefilled in groups of equal
    length (a recurrent layer would consume a pad token), then the groups' states are stacked
    into one static batch with a position per row (:class:`swax.decode.StaticState`) and
    decoded together by one step (compiled, or eager: ``compile`` as in :func:`generate`); a row
    that stops (``eos_token_id``, kept; a stop sequence or string, as in :func:`generate`) is
    masked until the batch ends. So with greedy decoding each prompt gets the tokens
    :func:`generate` gives it alone. With sampling one generator (``seed``) serves the whole
    batch: reproducible, but not the draws of a prompt alone. A compiled batch is padded to
    ``batch_size`` rows (done from the start) so that few batch sizes compile; an eager one is
    not. ``on_batch(n)`` is called after each batch with its number of prompts. ``decode``: the
    former name of ``detokenize``, as in :func:`generate`.
    """
    check_generation_options(max_new_tokens, temperature, top_k, top_p)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    _check_compile(compile)
    detokenize = _detokenizer(detokenize, decode)
    ids = _check_prompts(prompts, model.config.vocab_size)
    stopping = _stopping(eos_token_id, None, stop_sequences, stop_strings, detokenize)
    gen = _generator(seed, model.embed.weight.device)
    opts = _BatchOptions(
        max_new_tokens, window, temperature, top_k, top_p, gen, prefill_chunk_size, compile
    )
    out: list[list[int]] = [[] for _ in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # equal lengths together
    for s in range(0, len(order), batch_size):
        rows = order[s : s + batch_size]
        pad_to = batch_size if len(ids) > batch_size else 1 << (len(rows) - 1).bit_length()
        new = _batch_rows(model, [ids[i] for i in rows], pad_to, stopping, opts)
        for i, tokens in zip(rows, new):
            out[i] = tokens
        if on_batch is not None:
            on_batch(len(rows))
    return out


def _prefill_groups(model, prompts, o: _BatchOptions):
    """Prefill each group of equal-length prompts: ([(state, rows)], first ids (B,))."""
    device = model.embed.weight.device
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    parts, first = [], torch.zeros(len(prompts), dtype=torch.long, device=device)
    for members in groups.values():
        x = torch.stack([prompts[i] for i in members]).to(device)
        logits, state = prefill(model, x, o.window, None, o.chunk)
        parts.append((state, members))
        nxt = sample_next(logits, o.temperature, o.top_k, o.top_p, o.gen)
        first[torch.tensor(members, device=device)] = nxt
    return parts, first


def _cut(rows: list[list[int]], ended: dict[int, int]) -> list[list[int]]:
    """Each row's ids up to where it stopped (all of them if it never did)."""
    return [ids[: ended.get(b, len(ids))] for b, ids in enumerate(rows)]


def _batch_rows(model, prompts, pad_to, stopping, o: _BatchOptions) -> list[list[int]]:
    """The new ids of one batch of prompts. A compiled batch is padded to ``pad_to`` rows
    (copies of row 0, done from the start), so that few batch sizes compile; when the step runs
    eagerly the padding is dropped (it would only cost)."""
    B = len(prompts)
    parts, first = _prefill_groups(model, prompts, o)
    if o.max_new <= 1:  # the one id of each row comes from its prefill
        return [[t] for t in first.tolist()] if o.max_new == 1 else [[] for _ in range(B)]
    sampling = Sampling(o.temperature, o.top_k, o.top_p)
    decoder = Decoder.start(model, parts, first, sampling, o.compile, o.max_new, o.gen, pad_to)
    nxt, advance = decoder.first, decoder.advance
    done = torch.arange(len(nxt), device=nxt.device) >= B
    every = _check_every(nxt.device, False)
    out, ended = _decode_loop(nxt, advance, o.max_new, stopping, None, done, every)
    return _cut(torch.stack(out, 1)[:B].tolist(), ended)

"""Packed documents: per-token document ids and running a sequence op on each document alone.

A packed row holds several documents one after the other. ``doc_ids`` (B, T) integer gives each
token the index of its document; it must not decrease along a row (a row's documents are
contiguous), and a new value starts a new document (the first token of a row starts one). With
document ids, every layer sees only the tokens of its own document: attention masks keys of
other documents, the recurrent states and the short convolutions restart from zero at each
document start, RoPE positions count from the document's start. The logits of a packed row are
those of each document run alone. (This is the per-token form of flash-attn's and fla's
``cu_seqlens``: ``cu_seqlens`` of a row are the positions where its id changes, plus 0 and T.)

:func:`by_document` runs a causal sequence op (mLSTM, Gated DeltaNet) on each document alone
with any of its backends: documents are cut into pieces of P tokens (P a multiple of the op's
chunk) and processed in rounds, round r holding piece r of every document long enough, the
state carried from one round to the next. Padding at the end of a document's last piece uses
inputs that leave the state unchanged, so the final state is the document's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["check_doc_ids", "doc_positions", "document_spans", "by_document", "doc_conv1d"]


def check_doc_ids(doc_ids: torch.Tensor, B: int, T: int, fn: str) -> None:
    """ValueError unless ``doc_ids`` is an integer (B, T) tensor not decreasing along rows."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dtype.is_floating_point:
        raise ValueError(f"{fn}: doc_ids must be an integer tensor (batch, time)")
    if tuple(doc_ids.shape) != (B, T):
        raise ValueError(f"{fn}: doc_ids has shape {tuple(doc_ids.shape)}, expected {(B, T)}")
    if T > 1 and bool((doc_ids[:, 1:] < doc_ids[:, :-1]).any()):
        raise ValueError(f"{fn}: doc_ids must not decrease along a row (documents are contiguous)")


def doc_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True where a document starts (every row's first token included)."""
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return start


def doc_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: each token's position inside its document (0 at a document start)."""
    T = doc_ids.shape[1]
    t = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)
    start_at = torch.where(doc_starts(doc_ids), t, torch.zeros_like(t))
    return t - start_at.cummax(dim=1).values


def document_spans(doc_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document, row by row, in order."""
    B, T = doc_ids.shape
    starts = doc_starts(doc_ids).cpu()
    spans = []
    for b in range(B):
        s = starts[b].nonzero().flatten().tolist() + [T]
        spans += [(b, s[j], s[j + 1]) for j in range(len(s) - 1)]
    return spans


def _piece_size(lengths: list[int], chunk: int) -> int:
    """The piece length P (a multiple of ``chunk``) with the least padded tokens plus a cost
    per round (a round is one call of the op)."""
    longest = max(lengths)
    best, best_cost = chunk, None
    p = chunk
    while True:
        rounds = -(-longest // p)
        cost = sum(-(-n // p) * p for n in lengths) + rounds * 4 * chunk * len(lengths) ** 0.5
        if best_cost is None or cost < best_cost:
            best, best_cost = p, cost
        if p >= longest:
            return best
        p *= 2


@dataclass
class _Round:
    docs: list[int]  # indices into the span list
    rows: torch.Tensor  # (n, P) row of each gathered token
    times: torch.Tensor  # (n, P) time of each gathered token (clamped inside the row)
    valid: torch.Tensor  # (n, P) bool: a real token, not padding


def _rounds(spans, P: int, device) -> list[_Round]:
    out = []
    r = 0
    while True:
        docs = [j for j, (_, s, e) in enumerate(spans) if e - s > r * P]
        if not docs:
            return out
        off = torch.arange(P)
        starts = torch.tensor([spans[j][1] + r * P for j in docs])
        ends = torch.tensor([spans[j][2] for j in docs])
        t = starts[:, None] + off[None, :]
        valid = t < ends[:, None]
        rows = torch.tensor([spans[j][0] for j in docs])[:, None].expand(-1, P)
        times = torch.minimum(t, ends[:, None] - 1)
        out.append(_Round(docs, rows.to(device), times.to(device), valid.to(device)))
        r += 1


def _map(fn, state):
    if state is None:
        return None
    if isinstance(state, tuple):
        return tuple(fn(s) for s in state)
    return fn(state)


def by_document(op, inputs, neutral, doc_ids: torch.Tensor, chunk: int, want_state: bool):
    """Run ``op(*pieces, initial_state, output_final_state)`` on each document of the rows.

    ``inputs``: tensors (B, H, T, ...) (time on dim 2); ``neutral``: for each, the value that
    pads a document's last piece without changing the state. ``op`` returns (out (n, H, P, ...),
    final state or None). Returns (out (B, H, T, ...), the state after each row's last document
    or None)."""
    spans = document_spans(doc_ids)
    P = _piece_size([e - s for _, s, e in spans], chunk)
    rounds = _rounds(spans, P, doc_ids.device)
    by_time = [x.transpose(1, 2) for x in inputs]  # (B, T, H, ...)
    states: dict[int, object] = {}
    idx_r, idx_t, vals = [], [], []
    for r, rd in enumerate(rounds):
        pieces = []
        for x, fill in zip(by_time, neutral):
            g = x[rd.rows, rd.times]  # (n, P, H, ...)
            mask = rd.valid.view(*rd.valid.shape, *([1] * (g.ndim - 2)))
            pieces.append(torch.where(mask, g, torch.full_like(g, fill)).transpose(1, 2))
        init = None
        if r > 0:
            prev = rounds[r - 1].docs
            pick = torch.tensor([prev.index(j) for j in rd.docs], device=doc_ids.device)
            init = _map(lambda s, pick=pick: s.index_select(0, pick), states["last"])
        more = r + 1 < len(rounds)
        o, final = op(*pieces, init, more or want_state)
        states["last"] = final
        if want_state:
            for n, j in enumerate(rd.docs):
                states[j] = _map(lambda s, n=n: s[n : n + 1], final)
        o = o.transpose(1, 2)  # (n, P, H, ...)
        idx_r.append(rd.rows[rd.valid])
        idx_t.append(rd.times[rd.valid])
        vals.append(o[rd.valid])
    first = by_time[0]
    shape = (*first.shape[:2], *vals[0].shape[1:])
    out = vals[0].new_zeros(shape).index_put((torch.cat(idx_r), torch.cat(idx_t)), torch.cat(vals))
    final_state = None
    if want_state:
        last = {}
        for j, (b, _, _) in enumerate(spans):
            last[b] = j  # spans are in order: the last one of each row wins
        per_row = [states[last[b]] for b in range(doc_ids.shape[0])]
        if isinstance(per_row[0], tuple):
            final_state = tuple(torch.cat(parts, 0) for parts in zip(*per_row))
        else:
            final_state = torch.cat(per_row, 0)
    return out.transpose(1, 2), final_state


def doc_conv1d(u: torch.Tensor, weight: torch.Tensor, doc_ids: torch.Tensor):
    """The short causal convolution of :func:`swax.ops.conv.causal_conv1d` restarted at each
    document: output t sums weight[:, K - 1 - s] · u[t - s] over the s < K with t - s in t's
    document. u (B, C, T), weight (C, K). Returns (y (B, C, T), the decode state (B, C, K - 1):
    the last K - 1 inputs of each row's last document, zeros before its start)."""
    B, C, T = u.shape
    K = weight.shape[1]
    pos = doc_positions(doc_ids)  # (B, T)
    w = weight.to(u.dtype)
    y = u * w[:, K - 1][None, :, None]
    for s in range(1, K):
        shifted = torch.nn.functional.pad(u, (s, 0))[:, :, :T]
        keep = (pos >= s)[:, None, :]
        y = (
            y
            + torch.where(keep, shifted, torch.zeros_like(shifted)) * w[:, K - 1 - s][None, :, None]
        )
    state = u.new_zeros(B, C, K - 1)
    if K > 1:
        n = min(K - 1, T)
        tail = u[:, :, T - n :]
        same = (doc_ids[:, T - n :] == doc_ids[:, -1:])[:, None, :]
        state[:, :, K - 1 - n :] = torch.where(same, tail, torch.zeros_like(tail))
    return y, state

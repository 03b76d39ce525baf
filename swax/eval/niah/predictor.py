"""The model side of ``swax eval niah``: :class:`SwaxPredictor` (greedy continuation of a
prompt with chunked prefill and step decode) and the :class:`Timing` of its work."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from swax.generate import PREFILL_CHUNK, generate
from swax.state import DEFAULT_WINDOW


@dataclass
class Timing:
    """One prediction's work: prompt tokens and the seconds of their (chunked) prefill; decode
    steps (each feeds one generated token back: the first generated token comes from the
    prefill's logits, the last is not fed) and the seconds from the prefill's end to the last
    token."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0

    def __iadd__(self, other: Timing) -> Timing:
        self.prefill_tokens += other.prefill_tokens
        self.prefill_s += other.prefill_s
        self.decode_tokens += other.decode_tokens
        self.decode_s += other.decode_s
        return self

    def as_dict(self) -> dict:
        rate = lambda n, s: n / s if s > 0 else None  # noqa: E731
        return {
            "prefill_tokens": self.prefill_tokens,
            "prefill_s": self.prefill_s,
            "prefill_tokens_per_s": rate(self.prefill_tokens, self.prefill_s),
            "decode_tokens": self.decode_tokens,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": rate(self.decode_tokens, self.decode_s),
        }


class SwaxPredictor:
    """Greedy continuation of a prompt with a SwaxLM: chunked prefill, then step decode.
    After each call ``last_timing`` holds that call's :class:`Timing`."""

    def __init__(
        self,
        model,
        tokenizer,
        window=DEFAULT_WINDOW,
        prefill_chunk: int = PREFILL_CHUNK,
        compile: bool | None = None,
    ):
        """``window``: keys each query sees, None for full attention, DEFAULT_WINDOW (the
        default) for ``model.config.window``. ``compile``: as :func:`swax.generate.generate`
        takes it (``swax eval niah`` passes True: the step compiles in the untimed warm-up)."""
        self.model, self.tok = model, tokenizer
        self.window = model.config.window if window is DEFAULT_WINDOW else window
        self.prefill_chunk, self.compile = prefill_chunk, compile
        self.last_timing: Timing | None = None
        self._warm = False

    def __call__(self, prompt: str, max_new_tokens: int) -> str:
        ids = torch.tensor([self.tok.encode(prompt)], dtype=torch.long)
        if not self._warm:
            # one-time costs stay out of the timing: allocations, lazy set-up, and kernels that
            # compile on first use (CPU flex attention compiles for a first chunk and for a
            # chunk with a cache: two chunks and a decode step meet both)
            self._warm = True
            n = 2 * self.prefill_chunk  # the prompt's ids, repeated: only the shapes matter
            warm = ids.repeat(1, -(-n // ids.shape[1]))[:, :n]
            generate(
                self.model,
                warm,
                max_new_tokens=2,
                window=self.window,
                prefill_chunk_size=self.prefill_chunk,
                compile=self.compile,
            )
        marks: dict[str, float] = {}

        def prefilled(done: int, total: int) -> None:
            if done >= total:
                marks["prefilled"] = time.perf_counter()

        t0 = time.perf_counter()
        out = generate(
            self.model,
            ids,
            max_new_tokens=max_new_tokens,
            window=self.window,
            eos_token_id=self.tok.eot_id,
            prefill_chunk_size=self.prefill_chunk,
            progress=prefilled,
            compile=self.compile,
        )
        t1 = time.perf_counter()
        t_pre = marks.get("prefilled", t1)
        # the first new token comes from the prefill's logits: the decode steps feed the rest
        self.last_timing = Timing(
            ids.shape[1], t_pre - t0, out.shape[1] - ids.shape[1] - 1, t1 - t_pre
        )
        return self.tok.decode(out[0, ids.shape[1] :].tolist())

"""`swax generate`: text from a prompt with constant-memory decoding."""

from __future__ import annotations

import contextlib
import sys
import time

import torch

from swax.cli import options as C
from swax.cli.common import load_for, preset_name
from swax.core.errors import SwaxError
from swax.core.progress import fmt_seconds
from swax.core.settings import resolve_window
from swax.core.threads import threads_note
from swax.decode import compile_seconds
from swax.generate import generate
from swax.ops import cpu_flex
from swax.quant import decode_weights

LONG_GENERATION = 100_000
"""New tokens from which `swax generate` says up front, and again once it knows its rate, how
long the whole generation would take."""


class _Streamer:
    """The generated tokens as they come: printed as text when streaming (any tokenizer: the
    ids since the last printed point are decoded, and an incomplete UTF-8 character is held
    back), else kept and a progress line written to stderr every ``every`` seconds. What was
    generated is here when a generation is interrupted."""

    def __init__(self, tok, enabled: bool, total: int = 0, every: float = 10.0):
        self.tok, self.enabled, self.total, self.every = tok, enabled, total, every
        self.ids: list = []  # ints when streaming, else the step's tensors (no sync per token)
        self.mark = 0  # ids before it are printed
        self.t0 = self.last = time.perf_counter()
        self.estimated = total < LONG_GENERATION  # a long one says once how long it will take

    def _estimate(self) -> None:
        """Once, after ``every`` seconds of a long generation: how long all of it would take."""
        elapsed = time.perf_counter() - self.t0
        if elapsed < self.every or not self.ids:
            return
        self.estimated = True
        rate = len(self.ids) / elapsed
        print(
            f"[{rate:,.1f} tok/s: {self.total:,} new tokens would take about "
            f"{fmt_seconds(self.total / rate)}; Ctrl-C stops and keeps the text]",
            file=sys.stderr,
            flush=True,
        )

    def __call__(self, t) -> None:
        if not self.estimated:
            self._estimate()
        if not self.enabled:
            self.ids.append(t[0])
            now = time.perf_counter()
            if now - self.last >= self.every:
                self.last = now
                n = len(self.ids)
                print(
                    f"generating: {n:,} of {self.total:,} new tokens, "
                    f"{n / (now - self.t0):,.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
            return
        self.ids.append(int(t[0]))
        text = self.tok.decode(self.ids[self.mark :])
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text)
        sys.stdout.flush()
        self.mark = len(self.ids)

    def generated(self) -> list[int]:
        return [int(i) for i in self.ids]

    def finish(self) -> None:
        sys.stdout.write(self.tok.decode(self.ids[self.mark :]) + "\n")


@contextlib.contextmanager
def _interrupted(streamer: _Streamer, tok, stream: bool):
    """Ctrl-C during a generation: what was generated is printed (the rest of it, when
    streaming), with a line saying so, and the command exits with 130."""
    try:
        yield
    except KeyboardInterrupt:
        if stream:
            streamer.finish()
        else:
            print(tok.decode(streamer.generated()))
        print(f"[interrupted after {len(streamer.ids):,} new tokens]", file=sys.stderr)
        raise Interrupted from None


class Interrupted(KeyboardInterrupt):
    """A generation stopped by Ctrl-C after printing what it had (exit 130)."""

    exit_code = 130
    reported = True


def _read_prompt(cfg: C.GenerateConfig) -> str:
    if cfg.prompt_file is None:
        return cfg.prompt
    try:
        with open(cfg.prompt_file, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise SwaxError(f"prompt file {cfg.prompt_file} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SwaxError(f"cannot read prompt file {cfg.prompt_file}: {e}") from None


def cmd_generate(cfg: C.GenerateConfig) -> int:

    prompt = _read_prompt(cfg)
    if not prompt:
        raise SwaxError("the prompt is empty; pass --prompt TEXT or --prompt-file PATH")
    model, tok, random_init = load_for(cfg)
    if random_init:
        print(
            f"note: --preset {preset_name(cfg)} has random weights (no --model given); "
            f"the text will be noise",
            file=sys.stderr,
        )
    model = decode_weights(model, cfg.weights)
    ids = torch.tensor([tok.encode(prompt)], dtype=torch.long)
    window = resolve_window(cfg.window, model.config.window)
    stream = cfg.stream and not cfg.stop
    on_token = _Streamer(tok, stream, cfg.max_new_tokens)
    if cfg.max_new_tokens >= LONG_GENERATION:
        print(
            f"note: up to {cfg.max_new_tokens:,} new tokens; an estimate of how long that "
            "takes follows once the rate is known (Ctrl-C stops and keeps the text)",
            file=sys.stderr,
            flush=True,
        )
    t0 = time.perf_counter()
    prefill_done = []  # seconds at the end of the prefill
    compiled_before = compile_seconds(model)

    # one prompt: a flex compile on the CPU (3-9 s) would cost more than it saves
    with cpu_flex(False), _interrupted(on_token, tok, stream):
        out = generate(
            model,
            ids,
            max_new_tokens=cfg.max_new_tokens,
            window=window,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            seed=cfg.seed,
            eos_token_id=tok.eot_id,
            stop_strings=cfg.stop,
            detokenize=tok.decode,
            prefill_chunk_size=cfg.prefill_chunk,
            on_token=on_token,
            progress=lambda done, total: prefill_done.append(time.perf_counter() - t0),
            compile=cfg.compile,
        )
    elapsed = time.perf_counter() - t0
    new = out[0, ids.shape[1] :].tolist()
    if stream:
        on_token.finish()
    else:
        print(tok.decode(new))  # a stop string is kept, as an eos is
    pre = prefill_done[-1] if prefill_done else elapsed
    compiled = compile_seconds(model) - compiled_before  # inside the decode, not of it
    dec = max(elapsed - pre - compiled, 1e-9)
    note = f", decode step compiled in {compiled:.1f}s" if compiled else ""
    if cfg.weights != "float32":
        note += f", {cfg.weights} weights"
    print(
        f"[{ids.shape[1]} prompt tokens read in {pre:.2f}s (with the one-off set-up of the first "
        f"forward), {len(new)} new tokens at {len(new) / dec:.1f} tok/s{note}, window {window}, "
        f"{threads_note()}]",
        file=sys.stderr,
    )
    return 0

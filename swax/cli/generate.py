"""`swax generate`: text from a prompt with constant-memory decoding."""

from __future__ import annotations

import sys
import time

import torch

from swax.cli import options as C
from swax.cli.common import load_for, preset_name
from swax.core.configs import resolve_window
from swax.core.errors import SwaxError
from swax.core.threads import threads_note
from swax.decode import compile_seconds
from swax.generate import generate, truncate_at_stop
from swax.ops import cpu_flex


class _Streamer:
    """Prints generated text as it comes, for any tokenizer (decodes the ids so far and prints
    what is new, holding back an incomplete UTF-8 character)."""

    def __init__(self, tok, enabled: bool):
        self.tok, self.enabled, self.ids, self.printed = tok, enabled, [], 0

    def __call__(self, t) -> None:
        if not self.enabled:
            return
        self.ids.append(int(t[0]))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[self.printed :])
        sys.stdout.flush()
        self.printed = len(text)

    def finish(self) -> None:
        text = self.tok.decode(self.ids)
        sys.stdout.write(text[self.printed :] + "\n")


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
    ids = torch.tensor([tok.encode(prompt)], dtype=torch.long)
    window = resolve_window(cfg.window, model.config.window)
    stream = cfg.stream and not cfg.stop
    on_token = _Streamer(tok, stream)
    t0 = time.perf_counter()
    prefill_done = []  # seconds at the end of the prefill
    compiled_before = compile_seconds(model)

    # one prompt: a flex compile on the CPU (3-9 s) would cost more than it saves
    with cpu_flex(False):
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
            decode=tok.decode,
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
        print(truncate_at_stop(tok.decode(new), cfg.stop))
    pre = prefill_done[-1] if prefill_done else elapsed
    compiled = compile_seconds(model) - compiled_before  # inside the decode, not of it
    dec = max(elapsed - pre - compiled, 1e-9)
    note = f", decode step compiled in {compiled:.1f}s" if compiled else ""
    print(
        f"[{ids.shape[1]} prompt tokens in {pre:.2f}s, {len(new)} new tokens at "
        f"{len(new) / dec:.1f} tok/s{note}, window {window}, {threads_note()}]",
        file=sys.stderr,
    )
    return 0

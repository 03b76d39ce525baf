"""The ``swax`` command.

    swax info --preset tiny                 # parameters, layers, FLOPs per token
    swax generate --model DIR --prompt "In the beginning" --max-new-tokens 64
    swax demo                               # the default job (see README)

User errors (a missing file, a bad value) print one line ``swax: error: …`` and exit with
status 2; set SWAX_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
import time

from .errors import SwaxError


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _window(text: str):
    if text == "default":
        return text
    if text.lower() in ("none", "full"):
        return None
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"window must be a positive integer or 'full', got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"window must be >= 1, got {v}")
    return v


def _device(name: str):
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise SwaxError(f"unknown device {name!r}; expected cpu, cuda, cuda:N or auto")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SwaxError(f"device {name!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SwaxError(f"device {name!r} requested but only "
                            f"{torch.cuda.device_count()} CUDA device(s) are visible")
    return name


def _load_model(args):
    """The model named by --model (a checkpoint directory) or --preset (random weights)."""
    import torch

    from . import SwaxConfig, SwaxLM

    device = _device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.model:
        return SwaxLM.from_pretrained(args.model, device=device, dtype=dtype), False
    torch.manual_seed(args.seed)
    model = SwaxLM(SwaxConfig.preset(args.preset)).to(device=device, dtype=dtype).eval()
    return model, True


def _tokenizer_for(model):
    from .data import ByteTokenizer

    return ByteTokenizer()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def cmd_info(args) -> int:
    from . import SwaxConfig, SwaxLM

    if args.model:
        model = SwaxLM.from_pretrained(args.model)
    else:
        import torch

        with torch.device("meta"):
            model = SwaxLM(SwaxConfig.preset(args.preset))
    cfg = model.config
    print(f"layers        {cfg.n_layers}  pattern {cfg.layer_types}")
    print(f"d_model       {cfg.d_model}  heads {cfg.n_heads}  window {cfg.window}")
    print(f"parameters    {model.num_parameters():,} "
          f"({model.num_parameters(exclude_embeddings=True):,} without embeddings)")
    for T in args.seq_len:
        f = model.flops_per_token(T)
        print(f"train FLOPs/token at T={T}: {f / 1e9:.3f} GFLOP")
    return 0


def cmd_generate(args) -> int:
    import torch

    from .generate import check_generation_options, generate, truncate_at_stop

    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as fh:
                prompt = fh.read()
        except FileNotFoundError:
            raise SwaxError(f"prompt file {args.prompt_file} does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise SwaxError(f"cannot read prompt file {args.prompt_file}: {e}") from None
    else:
        prompt = args.prompt
    if not prompt:
        raise SwaxError("the prompt is empty; pass --prompt TEXT or --prompt-file PATH")
    # check the sampling options before loading anything or printing the random-weights note,
    # so a bad value is the only line on stderr
    check_generation_options(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    model, random_init = _load_model(args)
    if random_init:
        print(f"note: --preset {args.preset} has random weights (no --model given); "
              f"the text will be noise", file=sys.stderr)
    tok = _tokenizer_for(model)
    ids = torch.tensor([tok.encode(prompt)], dtype=torch.long)
    window = model.config.window if args.window == "default" else args.window

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stream = args.stream and not args.stop

    def on_token(t):
        if stream and int(t[0]) < 256:
            sys.stdout.write(decoder.decode(bytes([int(t[0])])))
            sys.stdout.flush()

    t0 = time.perf_counter()
    marks = {}

    def progress(done, total):
        marks["prefill"] = time.perf_counter() - t0

    out = generate(
        model, ids, max_new_tokens=args.max_new_tokens, window=window,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        eos_token_id=tok.eot_id, stop_strings=args.stop or (), decode=tok.decode,
        prefill_chunk_size=args.prefill_chunk, on_token=on_token, progress=progress,
    )
    elapsed = time.perf_counter() - t0
    new = out[0, ids.shape[1]:].tolist()
    text = truncate_at_stop(tok.decode(new), args.stop or ())
    if stream:
        sys.stdout.write(decoder.decode(b"", final=True) + "\n")
    else:
        print(text)
    pre = marks.get("prefill", elapsed)
    dec = max(elapsed - pre, 1e-9)
    print(f"[{ids.shape[1]} prompt tokens in {pre:.2f}s, {len(new)} new tokens at "
          f"{len(new) / dec:.1f} tok/s, window {window}]", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    """Build the tiny SWAX model, prefill a long prompt in constant memory, generate."""
    import torch

    from . import SwaxConfig, SwaxLM
    from .data import ByteTokenizer
    from .generate import generate, prefill

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = SwaxConfig.preset("tiny")
    model = SwaxLM(cfg).eval()
    tok = ByteTokenizer()
    print(f"swax demo: tiny SWAX model, pattern {cfg.layer_types}, "
          f"{model.num_parameters():,} parameters, window {cfg.window}")
    print("note: the weights are randomly initialised (training lands with `swax train`), "
          "so the generated text is noise; the demo shows the constant-memory state.")
    text = "In the beginning God created the heaven and the earth. "
    for n in (1024, args.context):
        ids = torch.tensor([(tok.encode(text) * (n // len(text) + 1))[:n]])
        t0 = time.perf_counter()
        _, state = prefill(model, ids, chunk_size=2048)
        dt = time.perf_counter() - t0
        print(f"  prefill {n:>7,} tokens: {dt:6.2f}s ({n / dt:,.0f} tok/s), "
              f"decode state {_fmt_bytes(state.nbytes())}")
    prompt = torch.tensor([tok.encode(text)])
    out = generate(model, prompt, max_new_tokens=48, temperature=0.8, top_k=40, seed=0)
    print("  sample:", repr(tok.decode(out[0, prompt.shape[1]:].tolist())))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``swax: error: … (see swax generate --help)``."""

    def error(self, message: str):
        self.exit(2, f"swax: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import PRESETS, __version__

    p = _Parser(prog="swax", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"swax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def model_args(sp):
        g = sp.add_mutually_exclusive_group()
        g.add_argument("--model", metavar="DIR", help="checkpoint directory (save_pretrained)")
        g.add_argument("--preset", default="tiny", choices=list(PRESETS),
                       help="random-weight preset when no --model is given (default: tiny)")

    sp = sub.add_parser("info", help="parameters and FLOPs of a preset or checkpoint")
    model_args(sp)
    sp.add_argument("--seq-len", type=_positive_int, nargs="+", default=[2048])
    sp.set_defaults(fn=cmd_info)

    sp = sub.add_parser("generate", help="generate text with constant-memory decoding")
    model_args(sp)
    g = sp.add_mutually_exclusive_group()
    g.add_argument("--prompt", default="In the beginning")
    g.add_argument("--prompt-file", metavar="PATH")
    sp.add_argument("--max-new-tokens", type=int, default=64)
    sp.add_argument("--window", type=_window, default="default",
                    help="attention window (default: the model's; 'full' = no window)")
    sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    sp.add_argument("--top-k", type=_positive_int, default=None)
    sp.add_argument("--top-p", type=float, default=None)
    sp.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--prefill-chunk", type=_positive_int, default=2048)
    sp.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    sp.add_argument("--no-stream", dest="stream", action="store_false",
                    help="print the text at the end instead of token by token")
    sp.set_defaults(fn=cmd_generate)

    sp = sub.add_parser("demo", help="the default job: tiny model, long prefill, generation")
    sp.add_argument("--context", type=_positive_int, default=32768,
                    help="long prompt length for the constant-memory demonstration")
    sp.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("swax: interrupted", file=sys.stderr)
        return 130
    except (SwaxError, ValueError, FileNotFoundError) as e:
        if os.environ.get("SWAX_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"swax: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``swax`` command.

    swax info --preset tiny                 # parameters, layers, FLOPs per token
    swax generate --model DIR --prompt "In the beginning" --max-new-tokens 64
    swax demo                               # the default job (see README)

User errors (a missing file, a bad value) print one line ``swax: error: …`` and exit with
status 2; set SWAX_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import argparse
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
            f"window must be a positive integer or 'full', got {text!r}"
        ) from None
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
            raise SwaxError(
                f"device {name!r} requested but only "
                f"{torch.cuda.device_count()} CUDA device(s) are visible"
            )
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


def _tokenizer_for(args):
    """The tokenizer saved next to --model (byte-level when there is none or for presets)."""
    from .data import ByteTokenizer, load_model_tokenizer

    return load_model_tokenizer(args.model) if args.model else ByteTokenizer()


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
    print(
        f"parameters    {model.num_parameters():,} "
        f"({model.num_parameters(exclude_embeddings=True):,} without embeddings)"
    )
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
        print(
            f"note: --preset {args.preset} has random weights (no --model given); "
            f"the text will be noise",
            file=sys.stderr,
        )
    tok = _tokenizer_for(args)
    ids = torch.tensor([tok.encode(prompt)], dtype=torch.long)
    window = model.config.window if args.window == "default" else args.window
    stream = args.stream and not args.stop
    on_token = _Streamer(tok, stream)

    t0 = time.perf_counter()
    marks = {}

    def progress(done, total):
        marks["prefill"] = time.perf_counter() - t0

    out = generate(
        model,
        ids,
        max_new_tokens=args.max_new_tokens,
        window=window,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        eos_token_id=tok.eot_id,
        stop_strings=args.stop or (),
        decode=tok.decode,
        prefill_chunk_size=args.prefill_chunk,
        on_token=on_token,
        progress=progress,
    )
    elapsed = time.perf_counter() - t0
    new = out[0, ids.shape[1] :].tolist()
    text = truncate_at_stop(tok.decode(new), args.stop or ())
    if stream:
        on_token.finish()
    else:
        print(text)
    pre = marks.get("prefill", elapsed)
    dec = max(elapsed - pre, 1e-9)
    print(
        f"[{ids.shape[1]} prompt tokens in {pre:.2f}s, {len(new)} new tokens at "
        f"{len(new) / dec:.1f} tok/s, window {window}]",
        file=sys.stderr,
    )
    return 0


def _split_train_args(items: list[str]) -> tuple[str | None, list[str]]:
    config, overrides = None, []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif config is None:
            config = item
        else:
            raise SwaxError(
                f"unexpected argument {item!r}: give one config file, then key=value overrides"
            )
    return config, overrides


def cmd_train(args) -> int:
    from .train import load_train_config, train

    config, overrides = _split_train_args(args.args)
    cfg = load_train_config(config, overrides)
    summary = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"validation loss: {summary.get('initial_val_loss', float('nan')):.4f} (untrained) "
            f"-> {summary['final_val_loss']:.4f} (trained)"
        )
        print(f"throughput: {summary['tok_s']:,.0f} tokens/s | model: {summary['model_dir']}")
    return 0


def cmd_plot_run(args) -> int:
    from .train.plot import plot_run

    print(plot_run(args.run, args.out))
    return 0


def cmd_sweep(args) -> int:
    from .sweep import aggregate, load_sweep, run_sweep

    cfg = load_sweep(args.config, quick=args.quick)
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    agg = aggregate(run_sweep(cfg, only))
    lengths = sorted({n for a in agg.values() for n in a.get("episodes_long", {})})
    head = f"{'run':<22} {'val loss':>15}  " + "  ".join(f"{n:>11}" for n in lengths)
    print(f"\nretrieval accuracy (%) with the long window, mean ± spread over seeds\n{head}")
    for name, a in agg.items():
        m, sp = a["val_loss"]
        cells = "  ".join(
            f"{a['episodes_long'][n][0]:6.1f}±{a['episodes_long'][n][1]:<4.1f}" for n in lengths
        )
        print(f"{name:<22} {m:8.4f}±{sp:<6.4f}  {cells}")
    return 0


def cmd_demo(args) -> int:
    """Train the tiny SWAX model on the embedded corpus (or reuse a finished demo run), show the
    loss it reached, generate a sample, and show that its decode state does not grow."""
    import json
    from pathlib import Path

    import torch

    from . import SwaxLM
    from .data import load_model_tokenizer
    from .data.sources import kjv_documents
    from .generate import generate, prefill
    from .train import load_train_config, train
    from .train.checkpoint import latest_checkpoint

    run_dir = Path(args.run_dir)
    overrides = [f"run_dir={run_dir}", *args.overrides]
    summary_file = run_dir / "summary.json"
    if summary_file.is_file() and (run_dir / "model").is_dir():
        summary = json.loads(summary_file.read_text())
        print(f"swax demo: reusing the finished run in {run_dir} (delete it to train again)")
    else:
        resume = latest_checkpoint(run_dir) is not None
        print(
            f"swax demo: training the tiny SWAX model on the King James Bible "
            f"({'resuming' if resume else 'a few minutes on a CPU'}) into {run_dir}"
        )
        summary = train(load_train_config(None, overrides + (["resume=true"] if resume else [])))
    print(
        f"\nvalidation loss (nats/byte): untrained {summary['initial_val_loss']:.3f} -> "
        f"trained {summary['final_val_loss']:.3f}"
    )
    model = SwaxLM.from_pretrained(run_dir / "model")
    tok = load_model_tokenizer(run_dir / "model")
    prompt = "And God said unto Moses,"
    ids = torch.tensor([tok.encode(prompt)])
    out = generate(model, ids, max_new_tokens=200, temperature=0.7, top_k=40, seed=0)
    print(
        f"\nsample (temperature 0.7, window {model.config.window}):\n{prompt}"
        f"{tok.decode(out[0, ids.shape[1] :].tolist())}\n"
    )
    text = "\n".join(kjv_documents()[-40:])  # Revelation and its neighbours: ~100k bytes
    ctx_ids = tok.encode(text)
    for n in (1024, args.context):
        ctx = torch.tensor([(ctx_ids * (n // len(ctx_ids) + 1))[:n]])
        _, state = prefill(model, ctx, chunk_size=2048)
        print(f"decode state after {n:>6,} tokens of context: {_fmt_bytes(state.nbytes())}")
    return 0


def _eval_model(args):
    """(model, tokenizer, label) for --model DIR or a random-weight --preset."""
    from pathlib import Path

    model, random_init = _load_model(args)
    tok = _tokenizer_for(args)
    if random_init:
        print(
            f"note: --preset {args.preset} has random weights (no --model given)", file=sys.stderr
        )
    label = args.label or (Path(args.model).resolve().name if args.model else args.preset)
    if args.model and label == "model":  # runs/NAME/model -> NAME
        label = Path(args.model).resolve().parent.name
    return model, tok, label


def _haystack(path):
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise SwaxError(f"haystack file {path} does not exist") from None


def cmd_eval_niah(args) -> int:
    from pathlib import Path

    from .eval.niah import (
        SwaxPredictor,
        dump_records,
        format_table,
        parse_lengths,
        peak_rss_gib,
        run_niah,
    )
    from .eval.ruler import TASKS

    lengths = parse_lengths(args.lengths)
    tasks = list(TASKS) if args.tasks == "all" else [t.strip() for t in args.tasks.split(",")]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SwaxError(
            f"unknown NIAH task {unknown[0]!r}; expected 'all' or some of {', '.join(TASKS)}"
        )
    key_split = "eval" if args.synthetic_keys else None
    haystack = _haystack(args.haystack)
    if args.dump:
        from .data import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
        paths = dump_records(
            args.dump, tok, tasks, lengths, args.samples, args.seed, haystack, key_split
        )
        print(f"wrote {len(paths)} files to {args.dump} ({tok.name} tokenizer)")
        return 0
    if not args.model and not args.preset_given:
        raise SwaxError("pass --model DIR (or --preset NAME for random weights, or --dump DIR)")
    model, tok, label = _eval_model(args)
    window = model.config.window if args.window == "default" else args.window
    out = Path(args.out or f"results/niah-{label}")
    predict = SwaxPredictor(model, tok, window, args.prefill_chunk)
    result = run_niah(
        predict,
        tok,
        tasks,
        lengths,
        args.samples,
        args.seed,
        out,
        haystack,
        key_split,
        args.records,
        settings={
            "label": label,
            "model": args.model or f"preset:{args.preset}",
            "window": window,
            "tokenizer": tok.name,
        },
    )
    print(f"NIAH accuracy (%), {label}, window {window}, {args.samples} samples per cell")
    print(format_table(result, tasks, lengths))
    print(f"peak memory: {peak_rss_gib():.2f} GiB | results: {out}")
    return 0


def cmd_eval_tasks(args) -> int:
    from pathlib import Path

    from .eval.tasks import evaluate_tasks, format_table, parse_tasks, write_results

    parse_tasks(args.tasks)  # an unknown task name fails before the model loads
    if not args.model and not args.preset_given:
        raise SwaxError("pass --model DIR (or --preset NAME for random weights)")
    model, tok, label = _eval_model(args)
    window = model.config.window if args.window == "default" else args.window
    results = evaluate_tasks(
        model,
        tok,
        args.tasks,
        args.data_dir,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        batch_size=args.batch_size,
        window=window,
        code_timeout=args.code_timeout,
    )
    out = Path(args.out or f"results/tasks-{label}")
    write_results(
        out,
        results,
        {
            "label": label,
            "model": args.model or f"preset:{args.preset}",
            "window": window,
            "data_dir": args.data_dir,
        },
    )
    print(f"short-context tasks, {label}, window {window}")
    print(format_table(results))
    print(f"results: {out}")
    return 0


def cmd_eval_ppl(args) -> int:
    from pathlib import Path

    import numpy as np

    from .eval.niah import parse_lengths
    from .eval.ppl import bucketize, position_losses, write_ppl

    edges = sorted(set(parse_lengths(args.lengths)))
    model, tok, label = _eval_model(args)
    window = model.config.window if args.window == "default" else args.window
    if args.data:
        from .data.loader import tokenize_documents
        from .data.sources import iter_documents

        tokens = tokenize_documents(list(iter_documents(args.data, field=args.field)), tok)
        source = args.data
    else:
        from .data import DataConfig, build_datasets

        _, val = build_datasets(
            DataConfig(tokenizer="byte" if tok.name == "byte" else "gpt2"), tok, seq_len=1, seed=0
        )
        tokens, source = np.asarray(val.tokens), "kjv (validation split)"
    losses = position_losses(model, tokens, edges[-1], args.samples, window, args.chunk)
    rows = bucketize(losses, edges)
    train_len = args.train_len
    if train_len is None and args.model:
        cfg_file = Path(args.model).resolve().parent / "config.yaml"
        if cfg_file.is_file():
            import yaml

            train_len = (yaml.safe_load(cfg_file.read_text()) or {}).get("seq_len")
    out = Path(args.out or f"results/ppl-{label}")
    write_ppl(
        out,
        rows,
        {
            "label": label,
            "model": args.model or f"preset:{args.preset}",
            "window": window,
            "data": source,
            "samples": args.samples,
            "train_len": train_len,
        },
        train_len,
    )
    print(f"loss by position, {label}, window {window}, {args.samples} samples of {source}")
    print(f"{'positions':>18}  {'loss':>7}  {'ppl':>9}")
    for r in rows:
        print(
            f"{r['bucket_start'] + 1:>8,}-{r['bucket_end']:<9,}  {r['loss']:7.4f}  {r['ppl']:9.3f}"
        )
    print(f"results: {out}")
    return 0


def cmd_eval_compare(args) -> int:
    from .eval.compare import compare

    table = compare(args.results, args.out)
    print(table)
    print(f"written to {args.out}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``swax: error: … (see swax generate --help)``."""

    def error(self, message: str):
        self.exit(2, f"swax: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import PRESETS, __version__

    p = _Parser(
        prog="swax",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"swax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def model_args(sp):
        g = sp.add_mutually_exclusive_group()
        g.add_argument("--model", metavar="DIR", help="checkpoint directory (save_pretrained)")
        g.add_argument(
            "--preset",
            default="tiny",
            choices=list(PRESETS),
            help="random-weight preset when no --model is given (default: tiny)",
        )

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
    sp.add_argument(
        "--window",
        type=_window,
        default="default",
        help="attention window (default: the model's; 'full' = no window)",
    )
    sp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    sp.add_argument("--top-k", type=_positive_int, default=None)
    sp.add_argument("--top-p", type=float, default=None)
    sp.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--prefill-chunk", type=_positive_int, default=2048)
    sp.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    sp.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="print the text at the end instead of token by token",
    )
    sp.set_defaults(fn=cmd_generate)

    sp = sub.add_parser(
        "train",
        help="train a model (default: the tiny preset on the KJV)",
        description="swax train [CONFIG.yaml] [key=value ...]; e.g. "
        "swax train configs/tiny.yaml optim.lr=3e-4 window.p_short=0.75",
    )
    sp.add_argument(
        "args",
        nargs="*",
        metavar="CONFIG | key=value",
        help="an optional YAML config, then overrides of its keys",
    )
    sp.set_defaults(fn=cmd_train)

    sp = sub.add_parser("plot-run", help="draw a run's loss curves to a PNG")
    sp.add_argument("run", metavar="RUN", help="the run folder (holding metrics.jsonl)")
    sp.add_argument("--out", default=None, help="PNG path (default: RUN/loss.png)")
    sp.set_defaults(fn=cmd_plot_run)

    ev = sub.add_parser("eval", help="evaluate: niah, tasks, ppl, compare")
    esub = ev.add_subparsers(dest="eval_command", metavar="EVAL")

    def eval_model_args(sp):
        g = sp.add_mutually_exclusive_group()
        g.add_argument("--model", metavar="DIR", help="checkpoint directory (save_pretrained)")
        g.add_argument(
            "--preset",
            choices=list(PRESETS),
            default=None,
            help="random-weight preset instead of --model",
        )
        sp.add_argument(
            "--window",
            type=_window,
            default="default",
            help="attention window (default: the model's, i.e. the long window)",
        )
        sp.add_argument("--label", default=None, help="name of the model in reports")
        sp.add_argument("--device", default="cpu")
        sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
        sp.add_argument("--seed", type=int, default=42)
        sp.add_argument("--out", default=None, help="results folder")

    sp = esub.add_parser("niah", help="RULER needle-in-a-haystack at long lengths")
    eval_model_args(sp)
    sp.add_argument("--lengths", default="4k,8k,16k,32k,65k,131k")
    sp.add_argument("--tasks", default="all", help="'all' or a comma list of RULER NIAH tasks")
    sp.add_argument("--samples", type=_positive_int, default=10)
    sp.add_argument(
        "--synthetic-keys",
        action="store_true",
        help="keys from the evaluation key set (disjoint from training episodes)",
    )
    sp.add_argument(
        "--haystack",
        metavar="PATH",
        default=None,
        help="text for the essay haystack (default: the embedded KJV)",
    )
    sp.add_argument(
        "--records",
        metavar="DIR",
        default=None,
        help="read TASK-LENGTH.jsonl records written by --dump instead of generating",
    )
    sp.add_argument(
        "--dump",
        metavar="DIR",
        default=None,
        help="only write the records (RULER's JSONL format) and exit; no model",
    )
    sp.add_argument("--tokenizer", default="byte", help="with --dump: byte, gpt2 or a path")
    sp.add_argument("--prefill-chunk", type=_positive_int, default=2048)
    sp.set_defaults(fn=cmd_eval_niah)

    sp = esub.add_parser(
        "tasks", help="short-context tasks: ARC, HellaSwag, PIQA, LAMBADA, HumanEval, MBPP"
    )
    eval_model_args(sp)
    sp.add_argument(
        "--tasks",
        default="arc_easy,arc_challenge,hellaswag,piqa,lambada",
        help="comma list or 'all': arc_easy, arc_challenge, hellaswag, piqa, lambada, "
        "humaneval, mbpp",
    )
    sp.add_argument(
        "--data-dir",
        default="data/tasks",
        help="folder of {task}.jsonl files in the upstream schemas (see README)",
    )
    sp.add_argument("--num-fewshot", type=int, default=None)
    sp.add_argument("--limit", type=_positive_int, default=None, help="first N items per task")
    sp.add_argument("--batch-size", type=_positive_int, default=8)
    sp.add_argument(
        "--code-timeout", type=float, default=10.0, help="seconds per program of the code tasks"
    )
    sp.set_defaults(fn=cmd_eval_tasks)

    sp = esub.add_parser("ppl", help="loss by position beyond the training length")
    eval_model_args(sp)
    sp.add_argument("--data", default=None, help="held-out text (default: KJV validation)")
    sp.add_argument("--field", default="text", help="JSONL/Parquet field of --data")
    sp.add_argument("--lengths", default="512,1k,2k,4k,8k,16k")
    sp.add_argument("--samples", type=_positive_int, default=4)
    sp.add_argument("--chunk", type=_positive_int, default=2048)
    sp.add_argument(
        "--train-len",
        type=_positive_int,
        default=None,
        help="training length to mark (default: read from the run's config.yaml)",
    )
    sp.set_defaults(fn=cmd_eval_ppl)

    sp = esub.add_parser("compare", help="merge results folders into one table and figure")
    sp.add_argument("results", nargs="+", metavar="RESULTS")
    sp.add_argument("--out", default="results/compare")
    sp.set_defaults(fn=cmd_eval_compare)

    sp = sub.add_parser("sweep", help="train and evaluate a family of runs (resumable)")
    sp.add_argument("config", metavar="SWEEP.yaml")
    sp.add_argument("--quick", action="store_true", help="the reduced version of the sweep")
    sp.add_argument("--only", default=None, help="comma list of run names")
    sp.set_defaults(fn=cmd_sweep)

    sp = sub.add_parser("demo", help="the default job: train the tiny model, then generate")
    sp.add_argument("--run-dir", default="runs/demo")
    sp.add_argument(
        "--context",
        type=_positive_int,
        default=32768,
        help="long context for the constant-memory demonstration",
    )
    sp.add_argument(
        "overrides", nargs="*", metavar="key=value", help="training overrides, e.g. steps=100"
    )
    sp.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        if getattr(args, "command", None) == "eval":
            parser.parse_args(["eval", "--help"])
        parser.print_help()
        return 0
    if getattr(args, "command", None) == "eval" and hasattr(args, "preset"):
        args.preset_given = args.preset is not None
        args.preset = args.preset or "tiny"
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

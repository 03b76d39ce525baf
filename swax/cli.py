"""swax: train, evaluate and generate with hybrid sliding-window attention + recurrent models.

    swax info --preset tiny                 # parameters, layers, FLOPs per token
    swax generate --model DIR --prompt "In the beginning" --max-new-tokens 64
    swax demo                               # the default job (see README)

Every command reads a dataclass config (:mod:`swax.cliconfig`; train and sweep: YAML files
with key=value overrides); its options are made from the config's fields. User errors (a
missing file, a bad value) print one line ``swax: error: …`` and exit with status 2; set
SWAX_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from swax import cliconfig as C
from swax import recall_demo
from swax.config import SwaxConfig
from swax.configutil import add_arguments, config_keys, from_args, resolve_window
from swax.data import (
    DataConfig,
    SyntheticConfig,
    build_datasets,
    load_model_tokenizer,
    load_tokenizer,
    tokenize_documents,
)
from swax.data.prepare import prepare_shards
from swax.data.shards import no_validation_reason, verify_shards
from swax.data.sources import iter_documents, kjv_documents
from swax.decode import compile_seconds
from swax.errors import ConfigError, SwaxError, is_disk_full
from swax.eval.buckets import bucket_table, distance_buckets, recall_by_bucket, verdict
from swax.eval.compare import RESULT_FILES as COMPARE_RESULT_FILES
from swax.eval.compare import compare
from swax.eval.niah import (
    DEFAULT_LENGTHS,
    SwaxPredictor,
    dump_files,
    dump_records,
    parse_lengths,
    peak_rss_gib,
    records_grid,
    results_files,
    run_niah,
)
from swax.eval.niah import format_table as niah_table
from swax.eval.ppl import RESULT_FILES as PPL_RESULT_FILES
from swax.eval.ppl import bucketize, position_losses, write_ppl
from swax.eval.recall import (
    RECALL_FILES,
    recall_by_window,
    recall_table,
    run_bucket_edges,
    training_setup,
    write_recall,
)
from swax.eval.ruler import TASKS
from swax.eval.tasks import RESULT_FILES as TASK_RESULT_FILES
from swax.eval.tasks import TaskEvalSettings, evaluate_tasks, write_results
from swax.eval.tasks import format_table as tasks_table
from swax.eval.tasks import reading_note as tasks_reading_note
from swax.eval.taskspecs import SAMPLES_DIR, convert_task_data, parse_tasks, sample_counts
from swax.export import export_hf, export_onnx
from swax.generate import generate, prefill, truncate_at_stop
from swax.loading import load_model_and_tokenizer
from swax.model import SwaxLM, run_config_file
from swax.ops import cpu_flex
from swax.paths import check_output_dir, check_writable_dir
from swax.runplot import plot_run
from swax.signals import Stopped, StopSignals
from swax.sweep import aggregate, load_sweep, run_sweep
from swax.threads import ACCEPTED as THREADS_ACCEPTED
from swax.threads import AUTO, parse_threads, set_threads, threads_note, threads_setting
from swax.threads import ENV as THREADS_ENV
from swax.train import load_train_config, train
from swax.train.checkpoint import latest_checkpoint
from swax.train.config import TrainConfig
from swax.version import __version__


def _load(cfg: C.LoadConfig):
    """(model, tokenizer, random weights?) for a config's --model or --preset."""

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    model, tok = load_model_and_tokenizer(
        cfg.model, cfg.device, dtype, preset=cfg.preset, seed=cfg.seed
    )
    return model, tok, cfg.model is None


def _preset_name(cfg: C.ModelChoice) -> str:
    return cfg.preset or "tiny"


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


def cmd_info(cfg: C.InfoConfig) -> int:

    if cfg.model:
        model = SwaxLM.from_pretrained(cfg.model)
    else:
        with torch.device("meta"):  # shapes only: no memory
            model = SwaxLM(SwaxConfig.preset(_preset_name(cfg)))
    mc = model.config
    print(f"layers        {mc.n_layers}  pattern {mc.layer_types}")
    print(f"d_model       {mc.d_model}  heads {mc.n_heads}  window {mc.window}")
    print(
        f"parameters    {model.num_parameters():,} "
        f"({model.num_parameters(exclude_embeddings=True):,} without embeddings)"
    )
    for T in cfg.seq_len:
        f = model.flops_per_token(T)
        print(f"train FLOPs/token at T={T}: {f / 1e9:.3f} GFLOP")
    _print_backends()
    return 0


def _print_backends() -> None:
    """Each op's backends on this machine's device: usable or why not, with the versions of
    the packages each one uses (a kernel may still turn some inputs away: head dims, dtypes)."""
    from swax.ops.registry import backend_report
    from swax.ops.triton_env import INTERPRET_ENV, interpreting

    device = "cuda" if torch.cuda.is_available() else "cpu"
    note = f", Triton's interpreter on ({INTERPRET_ENV})" if interpreting() else ""
    print(f"backends on {device}{note} (most preferred first):")
    for row in backend_report(device):
        pk = ", ".join(f"{p} {v or 'not installed'}" for p, v in row["packages"].items())
        state = "usable" if row["reason"] is None else f"unusable: {row['reason']}"
        print(f"  {row['op']:<13}{row['name']:<14}{state}" + (f" [{pk}]" if pk else ""))


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
    model, tok, random_init = _load(cfg)
    if random_init:
        print(
            f"note: --preset {_preset_name(cfg)} has random weights (no --model given); "
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


def cmd_train(cfg: C.TrainArgs) -> int:

    config, overrides = _split_train_args(cfg.args)
    cfg = load_train_config(config, overrides)
    # keep=True: every rank of a distributed run checks; none may remove what another made
    check_writable_dir(cfg.run_dir, "run_dir", keep=True)
    summary = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        final = summary["final_val_loss"]
        if final == final:  # not NaN: the run had validation data
            print(
                f"validation loss: {summary.get('initial_val_loss', float('nan')):.4f} "
                f"(untrained) -> {final:.4f} (trained)"
            )
        else:
            print("validation loss: none (the run has no validation data; see above)")
        if summary.get("steps_run", 1):
            speed = f"{summary['tok_s']:,.0f} tokens/s"
        else:
            speed = f"no steps to train (the run had already finished its {summary['steps']})"
        print(f"throughput: {speed} | model: {summary['model_dir']}")
    return 0


def cmd_plot_run(cfg: C.PlotRunConfig) -> int:

    if cfg.out:
        check_writable_dir(Path(cfg.out).parent, "--out folder")
    elif Path(cfg.run).is_dir():  # (a missing run is plot_run's error)
        check_writable_dir(cfg.run, "run folder")
    print(plot_run(cfg.run, cfg.out))
    return 0


def cmd_sweep(args: C.SweepArgs) -> int:

    cfg = load_sweep(args.config, quick=args.quick)
    if args.jobs is not None:
        if args.jobs < 1:
            raise SwaxError(f"--jobs must be >= 1, got {args.jobs}")
        cfg.jobs = args.jobs
    check_writable_dir(cfg.out_dir, f"sweep {args.config}: out_dir")
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    agg = aggregate(run_sweep(cfg, only))
    lengths = sorted({n for a in agg.values() for n in a.get("episodes_deploy", {})})
    head = f"{'run':<22} {'window':>6}  " + "  ".join(f"{n:>11}" for n in lengths)
    print(
        "\nrecall (%) at each length with each run's own window (its fixed window, or the long "
        f"one after a stochastic schedule), mean ± spread over seeds\n{head}"
    )
    for name, a in agg.items():
        w = a["windows"]["train" if a["deploy"] == "train" else "long"]
        cells = "  ".join(
            f"{a['episodes_deploy'][n][0]:6.1f}±{a['episodes_deploy'][n][1]:<4.1f}" for n in lengths
        )
        print(f"{name:<22} {w:>6}  {cells}")
    return 0


def cmd_eval_recall(cfg: C.RecallConfig) -> int:
    """Recall of key-value episodes at each length, with the model's window and the run's
    training window (the window study's metric) -> OUT/recall.json and a table."""

    trained, run_windows, seq_len = training_setup(cfg.model) if cfg.model else (None, {}, None)
    edges = _bucket_edges(cfg)
    lengths = []
    for item in [x.strip() for x in cfg.lengths.split(",") if x.strip()]:
        if item.lower().endswith("x"):
            if seq_len is None:
                raise SwaxError(
                    f"--lengths {item}: a multiple of the training length needs a swax train "
                    "run folder around --model (its config.yaml); give lengths in tokens"
                )
            lengths.append(int(float(item[:-1]) * seq_len))
        else:
            lengths += parse_lengths(item, "--lengths")
    if not lengths:
        raise SwaxError(f"--lengths: no length given in {cfg.lengths!r}")
    task = cfg.task if cfg.task != "auto" else (trained.task if trained else "mqar")
    base = trained if trained is not None and trained.task == task else None
    episodes = dataclasses.replace(
        base or SyntheticConfig(task=task, fraction=1.0, compact=True, min_distance=8),
        far_share=None,  # evaluation distances are uniform
        **{k: v for k, v in (("num_needles", cfg.pairs), ("num_queries", cfg.queries),
                             ("min_distance", cfg.min_distance)) if v is not None},
    )  # fmt: skip
    out = _eval_out(cfg, "recall", RECALL_FILES)
    model, tok, label, window = _eval_model(cfg)
    explicit = str(cfg.window) != "default"
    windows = {"own": window} if explicit else {"long": window, **run_windows}
    _, val = build_datasets(DataConfig(), tok, seq_len=1, seed=0)
    results = recall_by_window(
        model, tok, val.tokens, episodes, lengths, cfg.samples, windows, seed=cfg.seed,
        batch_size=cfg.batch_size, progress=True,
    )  # fmt: skip
    meta = {"model": _model_name(cfg), "label": label, "windows": windows, "seq_len": seq_len,
            "episodes": dataclasses.asdict(episodes), "samples": cfg.samples}  # fmt: skip
    path = write_recall(out, results, meta)
    chance = 100 / (episodes.mqar_values if episodes.task == "mqar" else 10**episodes.digits)
    named = ", ".join(f"{k} {v}" for k, v in windows.items())
    print(f"recall (%) of {label}, {episodes.num_needles} pair(s), {cfg.samples} episodes per "
          f"length; windows: {named}")  # fmt: skip
    print(recall_table(results, lengths, seq_len))
    print(f"how to read: % of episodes whose answer the model produced (chance {chance:.2g}%); "
          "long = the model's own window, train = its run's training window, own = --window"
          f"{_not_trained_on_retrieval(cfg)}")  # fmt: skip
    if edges and cfg.bucket_samples:
        short, long, T = edges
        buckets = distance_buckets(short, long, T)
        print(
            f"recall by distance: {len(buckets)} buckets × {cfg.bucket_samples} episodes × 3 "
            "(own window, window cut, recurrent reset) ...",
            file=sys.stderr,
            flush=True,
        )
        rows = recall_by_bucket(
            model, tok, val.tokens, episodes, buckets, cfg.bucket_samples, window,
            probe_window=short, seed=cfg.seed, batch_size=cfg.batch_size,
        )  # fmt: skip
        lazy = verdict(rows, chance, T)
        results = {**results, "buckets": rows, "laziness": lazy,
                   "bucket_windows": {"short": short, "long": long, "seq_len": T}}  # fmt: skip
        path = write_recall(out, results, meta)
        print(f"\nrecall by distance (reach: the window the answer needs; W_short {short}, "
              f"W_long {long}, T {T}; window_cut: window {short}; reset: recurrent state "
              "emptied before the question):")  # fmt: skip
        print(bucket_table(rows))
        print(
            f"inside W_long {lazy['inside_long']:.1f}%, beyond it within T "
            f"{lazy['beyond_long']:.1f}%, beyond T {lazy['beyond_T']:.1f}%: {lazy['kind']}"
        )
    print(_footer(path))
    return 0


def _bucket_edges(cfg: C.RecallConfig) -> tuple[int, int, int] | None:
    """(W_short, W_long, T) of the distance buckets: --buckets, else the run's own."""
    if cfg.buckets:
        try:
            edges = tuple(int(x) for x in cfg.buckets.split(","))
        except ValueError:
            edges = ()
        if len(edges) != 3 or not 1 <= edges[0] <= edges[1] <= edges[2]:
            raise SwaxError(
                f"--buckets: expected SHORT,LONG,T with 1 <= SHORT <= LONG <= T, got "
                f"{cfg.buckets!r}"
            )
        return edges
    return run_bucket_edges(cfg.model) if cfg.model else None


def cmd_demo(args: C.DemoConfig) -> int:
    """Train the tiny SWAX model on the embedded corpus (or reuse a finished demo run), show the
    loss it reached, generate a sample, and show that its decode state does not grow."""

    if args.overrides[:1] == ["recall"]:  # swax demo recall [--run-dir DIR] [key=value ...]
        run_dir = args.run_dir if args.run_dir != C.DemoConfig.run_dir else "runs/demo-recall"
        check_writable_dir(run_dir, "--run-dir", keep=True)
        recall_demo.run(run_dir, args.overrides[1:])
        return 0
    run_dir = Path(args.run_dir)
    overrides = [f"run_dir={run_dir}", *args.overrides]
    summary_file = run_dir / "summary.json"
    if summary_file.is_file() and (run_dir / "model").is_dir():
        summary = json.loads(summary_file.read_text())
        print(f"swax demo: reusing the finished run in {run_dir} (delete it to train again)")
    else:
        check_writable_dir(run_dir, "--run-dir", keep=True)
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
        _, state = prefill(model, ctx)
        print(f"decode state after {n:>6,} tokens of context: {_fmt_bytes(state.nbytes())}")
    return 0


def _eval_label(cfg: C.EvalConfig) -> str:
    """The model's name in reports: --label, else the run's folder name, else the preset."""

    label = cfg.label or (Path(cfg.model).resolve().name if cfg.model else _preset_name(cfg))
    if cfg.model and label == "model":  # runs/NAME/model -> NAME
        label = Path(cfg.model).resolve().parent.name
    return label


def _eval_out(cfg: C.EvalConfig, kind: str, outputs):
    """The results folder (--out, else results/KIND-LABEL), checked before the work: writable,
    and new or empty, or (with --overwrite) emptied of the files ``outputs`` of an earlier run."""
    out = cfg.out or f"results/{kind}-{_eval_label(cfg)}"
    return check_output_dir(out, "--out", outputs, f"swax eval {kind}", cfg.overwrite)


def _eval_model(cfg: C.EvalConfig):
    """(model, tokenizer, label, window) for --model DIR or a random-weight --preset."""
    model, tok, random_init = _load(cfg)
    if random_init:
        print(
            f"note: --preset {_preset_name(cfg)} has random weights (no --model given)",
            file=sys.stderr,
        )
    return model, tok, _eval_label(cfg), resolve_window(cfg.window, model.config.window)


def _not_trained_on_retrieval(cfg: C.EvalConfig) -> str:
    """A reading line's clause when the model's training run had no retrieval episodes (its
    config.yaml says data.synthetic.fraction = 0); empty otherwise or when unknown."""
    if not cfg.model:
        return "; random weights: expect chance"
    trained, _, seq_len = training_setup(cfg.model)
    if seq_len is None or trained is not None:
        return ""
    return ("; this model was not trained on retrieval (its run's data.synthetic.fraction is 0), "
            "so scores near chance are expected")  # fmt: skip


def _footer(out) -> str:
    """The last line of an evaluation: where the results are, and the threads it ran on."""
    return f"results: {out} | {threads_note()}"


def _model_name(cfg: C.EvalConfig) -> str:
    return cfg.model or f"preset:{_preset_name(cfg)}"


def _haystack(path):
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise SwaxError(f"haystack file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise SwaxError(
            f"haystack file {path} is not UTF-8 text (byte {e.start}: {e.reason})"
        ) from None
    except OSError as e:
        raise SwaxError(f"cannot read haystack file {path}: {e.strerror or e}") from None


def cmd_eval_niah(cfg: C.NiahConfig) -> int:

    lengths = None if cfg.lengths is None else parse_lengths(cfg.lengths, "--lengths")
    tasks = None
    if cfg.tasks is not None:
        tasks = list(TASKS) if cfg.tasks == "all" else [t.strip() for t in cfg.tasks.split(",")]
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise SwaxError(
                f"unknown NIAH task {unknown[0]!r}; expected 'all' or some of {', '.join(TASKS)}"
            )
    if cfg.records and not cfg.dump:  # the records' own tasks and lengths, unless narrowed
        tasks, lengths = records_grid(cfg.records, tasks, lengths)
    tasks = list(TASKS) if tasks is None else tasks
    lengths = parse_lengths(DEFAULT_LENGTHS) if lengths is None else lengths
    key_split = "eval" if cfg.synthetic_keys else None
    haystack = _haystack(cfg.haystack)
    if cfg.dump:
        tok = load_tokenizer(cfg.tokenizer)
        check_output_dir(
            cfg.dump, "--dump", dump_files(), "swax eval niah --dump", cfg.overwrite, "records"
        )
        paths = dump_records(
            cfg.dump, tok, tasks, lengths, cfg.samples, cfg.seed, haystack, key_split
        )
        print(f"wrote {len(paths)} files to {cfg.dump} ({tok.name} tokenizer)")
        return 0
    if not cfg.model and not cfg.preset:
        raise SwaxError("pass --model DIR (or --preset NAME for random weights, or --dump DIR)")
    out = _eval_out(cfg, "niah", results_files())
    model, tok, label, window = _eval_model(cfg)
    predict = SwaxPredictor(model, tok, window, cfg.prefill_chunk, compile=cfg.compile)
    result = run_niah(
        predict,
        tok,
        tasks,
        lengths,
        cfg.samples,
        cfg.seed,
        out,
        haystack,
        key_split,
        cfg.records,
        settings={
            "label": label,
            "model": _model_name(cfg),
            "window": window,
            "tokenizer": tok.name,
        },
    )
    print(f"NIAH accuracy (%), {label}, window {window}, {result.samples} samples per cell")
    print(niah_table(result, tasks, lengths))
    print(
        "how to read: a sample counts when the answer holds every needle's value (RULER's "
        f"string match), so guessing scores about 0%{_not_trained_on_retrieval(cfg)}"
    )
    print(f"peak memory: {peak_rss_gib():.2f} GiB | {_footer(out)}")
    return 0


def cmd_eval_tasks(cfg: C.TasksConfig) -> int:

    parse_tasks(cfg.tasks)  # an unknown task name fails before the model loads
    if not cfg.model and not cfg.preset:
        raise SwaxError("pass --model DIR (or --preset NAME for random weights)")
    out = _eval_out(cfg, "tasks", TASK_RESULT_FILES)
    data_dir = cfg.data_dir
    if data_dir is None:
        data_dir = str(SAMPLES_DIR)
        counts = sorted(set(sample_counts(cfg.tasks).values()))
        if counts:
            n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
            print(
                f"note: using the bundled sample files ({n} records each); pass --data-dir "
                "for real data",
                file=sys.stderr,
            )
    model, tok, label, window = _eval_model(cfg)
    evaluation = TaskEvalSettings(
        num_fewshot=cfg.num_fewshot,
        limit=cfg.limit,
        batch_size=cfg.batch_size,
        window=window,
        code_timeout=cfg.code_timeout,
        compile=cfg.compile,
    )
    results = evaluate_tasks(model, tok, cfg.tasks, data_dir, evaluation)
    settings = {
        "label": label,
        "model": _model_name(cfg),
        "window": window,
        "data_dir": data_dir,
    }
    write_results(out, results, settings)
    print(f"short-context tasks, {label}, window {window}")
    print(tasks_table(results))
    print(tasks_reading_note(results, bundled=cfg.data_dir is None))
    print(_footer(out))
    return 0


def _ppl_tokens(cfg: C.PplConfig, tok):
    """(token ids, description) of the held-out text of ``swax eval ppl``."""

    if cfg.data:
        docs = list(iter_documents(cfg.data, field=cfg.field))
        return tokenize_documents(docs, tok), cfg.data

    data = DataConfig(tokenizer="byte" if tok.name == "byte" else "gpt2")
    _, val = build_datasets(data, tok, seq_len=1, seed=0)
    return np.asarray(val.tokens), "kjv (validation split)"


def _train_len(cfg: C.PplConfig) -> int | None:
    """--train-len, else the seq_len of the run the model comes from (its config.yaml)."""

    if cfg.train_len is not None or not cfg.model:
        return cfg.train_len
    cfg_file = run_config_file(cfg.model)
    if cfg_file is None:
        return None

    return (yaml.safe_load(cfg_file.read_text()) or {}).get("seq_len")


def cmd_eval_ppl(cfg: C.PplConfig) -> int:

    edges = sorted(set(parse_lengths(cfg.lengths, "--lengths")))
    out = _eval_out(cfg, "ppl", PPL_RESULT_FILES)
    model, tok, label, window = _eval_model(cfg)
    tokens, source = _ppl_tokens(cfg, tok)
    losses = position_losses(model, tokens, edges[-1], cfg.samples, window, cfg.chunk)
    rows = bucketize(losses, edges)
    train_len = _train_len(cfg)
    settings = {
        "label": label,
        "model": _model_name(cfg),
        "window": window,
        "data": source,
        "samples": cfg.samples,
        "train_len": train_len,
    }
    write_ppl(out, rows, settings, train_len)
    print(f"loss by position, {label}, window {window}, {cfg.samples} samples of {source}")
    print(f"{'positions':>18}  {'loss':>7}  {'ppl':>9}")
    for r in rows:
        print(
            f"{r['bucket_start'] + 1:>8,}-{r['bucket_end']:<9,}  {r['loss']:7.4f}  {r['ppl']:9.3f}"
        )
    trained = f"; it was trained on sequences of {train_len:,}" if train_len else ""
    print(f"how to read: the mean loss (nats per token, {tok.name} tokenizer) of the tokens at "
          f"those positions, ppl = exp(loss){trained}: a loss that stays flat or falls at later "
          "positions means the model keeps using its context there")  # fmt: skip
    print(_footer(out))
    return 0


def cmd_eval_compare(cfg: C.CompareConfig) -> int:

    check_output_dir(cfg.out, "--out", COMPARE_RESULT_FILES, "swax eval compare", cfg.overwrite)
    table = compare(cfg.results, cfg.out)
    print(table)
    print(f"written to {cfg.out}")
    return 0


def cmd_eval_convert_tasks(cfg: C.ConvertTasksConfig) -> int:

    if not cfg.task:
        raise SwaxError("swax eval convert-tasks needs --task NAME, the task SOURCE holds")
    task = parse_tasks([cfg.task])[0]
    check_writable_dir(cfg.out, "--out")
    path, n = convert_task_data(cfg.source, task, cfg.out, cfg.split, cfg.overwrite)
    print(f"wrote {n:,} {task} records to {path} (swax eval tasks --data-dir {cfg.out})")
    return 0


# ---------------------------------------------------------------- swax export (hf, onnx)
def cmd_export_hf(cfg: C.ExportHFConfig) -> int:

    out = export_hf(cfg.model_dir, cfg.out_dir)
    print(
        f"wrote {out}: AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)"
    )
    return 0


def cmd_export_onnx(cfg: C.ExportOnnxConfig) -> int:

    out = export_onnx(cfg.model_dir, cfg.out, cfg.seq_len, cfg.window, cfg.batch_size)
    print(f"wrote {out}: input_ids int64 ({cfg.batch_size}, {cfg.seq_len}) -> logits")
    return 0


EXPORT_COMMANDS: dict = {
    "hf": (C.ExportHFConfig, cmd_export_hf, "a Hugging Face folder (transformers, lm-eval)"),
    "onnx": (C.ExportOnnxConfig, cmd_export_onnx, "an ONNX graph of the forward (fixed shape)"),
}


# ---- swax data prepare (pre-tokenized shards; see swax.data.shards) ----


def _prepare(cfg: C.DataPrepareConfig, stop):

    return prepare_shards(
        cfg.source,
        cfg.out,
        tokenizer=cfg.tokenizer,
        shard_tokens=cfg.shard_tokens,
        workers=cfg.workers,
        val_fraction=cfg.val_fraction,
        split_seed=cfg.split_seed,
        fmt=cfg.format,
        field=cfg.field,
        overwrite=cfg.overwrite,
        progress=cfg.progress,
        stop=stop,
    )


def cmd_data_prepare(cfg: C.DataPrepareConfig) -> int:

    if not cfg.out:
        raise SwaxError("swax data prepare needs --out DIR, the folder of the shard set")
    try:
        with StopSignals("swax data prepare", action="stopping after the current batch") as stop:
            index = _prepare(cfg, stop)
    except KeyboardInterrupt:
        raise Stopped(
            f"interrupted; the finished shards in {cfg.out} are kept: run the same command "
            "again to resume",
            stop.signum or signal.SIGINT,
        ) from None

    tr, va = index["train"], index["val"]
    print(
        f"{index['documents']:,} documents -> {tr['tokens']:,} training tokens in "
        f"{len(tr['shards'])} shards, {va['tokens']:,} validation tokens in "
        f"{len(va['shards'])} shards ({index['dtype']}, tokenizer {index['tokenizer']['name']})"
    )
    reason = no_validation_reason(index)
    if reason:
        print(f"warning: no validation data: {reason}", file=sys.stderr)
    print(f"shard set: {cfg.out} (train with data.source={cfg.out})")
    return 0


def cmd_data_verify(cfg: C.DataVerifyConfig) -> int:

    n = verify_shards(cfg.folder, progress=cfg.progress)
    print(f"{cfg.folder}: {n['shards']} shards, {n['tokens']:,} tokens: every SHA-256 matches")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: ``swax: error: … (see swax generate --help)``.
    A value that starts with a minus and a digit (``--lengths -1k``) is read as the option's
    value, as plain negative numbers are, so that its own check names it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        self.exit(2, f"swax: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (line breaks kept); wider option column."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32)


COMMANDS: dict = {
    "info": (C.InfoConfig, cmd_info, "parameters and FLOPs of a preset or checkpoint"),
    "generate": (C.GenerateConfig, cmd_generate, "generate text with constant-memory decoding"),
    "train": (C.TrainArgs, cmd_train, "train a model (default: the tiny preset on the KJV)"),
    "plot-run": (C.PlotRunConfig, cmd_plot_run, "draw a run's loss curves (per window) to a PNG"),
    "eval": {
        "niah": (C.NiahConfig, cmd_eval_niah, "RULER needle-in-a-haystack at long lengths"),
        "tasks": (C.TasksConfig, cmd_eval_tasks, "short-context tasks: ARC, HellaSwag, PIQA, …"),
        "ppl": (C.PplConfig, cmd_eval_ppl, "loss by position beyond the training length"),
        "compare": (C.CompareConfig, cmd_eval_compare, "merge results folders into one table"),
        "convert-tasks": (
            C.ConvertTasksConfig,
            cmd_eval_convert_tasks,
            "write a task's data file from a Parquet or saved Hugging Face dataset",
        ),
        "recall": (C.RecallConfig, cmd_eval_recall, "key-value recall against length and window"),
    },
    "export": EXPORT_COMMANDS,
    "sweep": (C.SweepArgs, cmd_sweep, "train and evaluate a family of runs (resumable)"),
    "demo": (
        C.DemoConfig,
        cmd_demo,
        "the default job: train the tiny model, then generate; `swax demo recall`: the "
        "window effect on recall (two small models, about 4 minutes)",
    ),
    "data": {
        "prepare": (
            C.DataPrepareConfig,
            cmd_data_prepare,
            "tokenize a corpus into memory-mapped shards",
        ),
        "verify": (C.DataVerifyConfig, cmd_data_verify, "check a shard set's SHA-256 sums"),
    },
}
"""command -> (config dataclass, function, one-line help); "eval" holds its subcommands."""


def train_config_keys() -> list[tuple[str, str, str]]:
    """(key, default, doc) of every key ``swax train`` takes, the model's included: ``model``
    is a preset plus any SwaxConfig field, listed here as ``model.FIELD`` with the default run's
    value (the tiny preset's)."""
    from swax.config import PRESETS

    rows = [r for r in config_keys(TrainConfig) if r[0] != "model"]
    default = TrainConfig().model
    preset = default.get("preset", "tiny")
    model_rows = [("model.preset", preset, f"Named preset, one of {', '.join(PRESETS)}")]
    values = SwaxConfig.preset(preset, **{k: v for k, v in default.items() if k != "preset"})
    for key, _, doc in config_keys(SwaxConfig, "model."):
        model_rows.append((key, repr(getattr(values, key.split(".", 1)[1])), doc))
    i = next((j for j, r in enumerate(rows) if r[0].startswith("data.")), len(rows))
    return rows[:i] + model_rows + rows[i:]


def _train_keys() -> str:
    """The keys ``swax train`` accepts, for its --help."""

    rows = train_config_keys()
    width = max(len(k) for k, _, _ in rows)
    lines = [f"  {k:<{width}}  {doc}" + (f" [{d}]" if d else "") for k, d, doc in rows]
    return "config keys (YAML or key=value; [default]):\n" + "\n".join(lines)


def _add_command(sub, name: str, entry: tuple) -> None:
    cls, fn, help_text = entry
    epilog = _train_keys() if cls is C.TrainArgs else None
    sp = sub.add_parser(
        name,
        help=help_text,
        description=inspect.cleandoc(cls.__doc__ or ""),
        epilog=epilog,
        formatter_class=_HelpFormatter,
    )
    add_arguments(sp, cls)
    sp.add_argument(
        "--threads",
        type=_threads_arg,
        metavar="N",
        default=argparse.SUPPRESS,
        help=f"CPU threads of torch: auto (the usable CPUs less what other processes use now), "
        f"0 (one per usable CPU) or N; default ${THREADS_ENV}, else auto",
    )
    sp.set_defaults(fn=fn, config_cls=cls)


def _threads_arg(text: str) -> int | str:
    try:
        return parse_threads(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected {THREADS_ACCEPTED}, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The ``swax`` parser: one subcommand per entry of :data:`COMMANDS`, its options made
    from the entry's config dataclass."""

    p = _Parser(prog="swax", description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter)
    p.add_argument("--version", action="version", version=f"swax {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, entry in COMMANDS.items():
        if isinstance(entry, dict):
            what = {"eval": "evaluate", "export": "export for other tools"}.get(name, name)
            group = sub.add_parser(name, help=f"{what}: {', '.join(entry)}")
            esub = group.add_subparsers(dest=f"{name}_command", metavar=name.upper())
            for sub_name, sub_entry in entry.items():
                _add_command(esub, sub_name, sub_entry)
        else:
            _add_command(sub, name, entry)
    return p


COMPUTE_COMMANDS = ("train", "eval", "generate", "demo", "sweep", "export")
"""Commands whose speed depends on the thread count: ``auto`` watches the load before they run,
and they say what it chose (:func:`swax.threads.threads_note`)."""


def _subcommand(args) -> list[str]:
    """The subcommand of a command group (eval, export, data), if one was given."""
    name = getattr(args, "command", None)
    return [getattr(args, f"{name}_command", None) or ""] if name else []


CONFIG_COMMANDS = ("train", "demo")
"""Commands that take config keys as key=value (``--key=value`` and ``--key value`` too)."""


def _dashed_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``swax train --steps=10 --optim.lr 3e-4`` -> ``swax train steps=10 optim.lr=3e-4``: the
    spellings people bring from other tools, for the config keys of train and demo. The
    command's own options (``--threads``, ``--help``) are left to argparse; ``--seq-len`` is
    seq_len; any other ``--name`` is taken for a key, so that a misspelled one gets the config's
    "did you mean"."""
    if not argv or argv[0] not in CONFIG_COMMANDS:
        return argv
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = set(sub.choices[argv[0]]._option_string_actions)

    def key_of(token: str) -> str | None:
        name = token.split("=", 1)[0]
        if name in options or not re.fullmatch(r"--[A-Za-z_][\w.-]*", name):
            return None
        return name[2:].replace("-", "_")

    out, i = [argv[0]], 1
    while i < len(argv):
        tok = argv[i]
        key = key_of(tok) if tok.startswith("--") and len(tok) > 2 else None
        if key is None:
            out.append(tok)
        elif "=" in tok:
            out.append(f"{key}={tok.split('=', 1)[1]}")
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(f"{key}={argv[i + 1]}")
            i += 1
        else:
            out.append(tok)  # --key without a value: argparse names it
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = _dashed_overrides(parser, list(sys.argv[1:] if argv is None else argv))
    args, extra = parser.parse_known_args(argv)
    # key=value overrides after an option (swax train steps=9 --threads 1 seq_len=64): argparse
    # ends a positional list at the first option; the rest join it
    dest = {C.TrainArgs: "args", C.DemoConfig: "overrides"}.get(getattr(args, "config_cls", None))
    if extra and dest and not any(x.startswith("-") for x in extra):
        setattr(args, dest, [*getattr(args, dest, []), *extra])
    elif extra:
        where = " ".join(x for x in (args.command, *_subcommand(args)) if x)
        prog = f"swax {where}" if where else "swax"
        parser.exit(2, f"swax: error: unrecognized arguments: {' '.join(extra)} "
                       f"(see {prog} --help)\n")  # fmt: skip
    if not getattr(args, "fn", None):
        if isinstance(COMMANDS.get(getattr(args, "command", None)), dict):
            parser.parse_args([args.command, "--help"])
        parser.print_help()
        return 0
    try:
        threads = threads_setting(getattr(args, "threads", None))
        if threads == AUTO and args.command not in COMPUTE_COMMANDS:
            threads = 0  # nothing heavy to run: no need to watch the load first
        set_threads(threads)
        return args.fn(from_args(args.config_cls, args))
    except KeyboardInterrupt as e:  # TrainingStopped (a signal, checkpoint saved) or Ctrl-C
        print(f"swax: {str(e) or 'interrupted'}", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    except (SwaxError, ValueError, FileNotFoundError) as e:
        if os.environ.get("SWAX_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"swax: error: {msg}", file=sys.stderr)
        return 2
    except OSError as e:
        if not is_disk_full(e) or os.environ.get("SWAX_DEBUG"):
            raise
        where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
        print(f"swax: error: no space left on the device{where}; free some space and run "
              "again (what was saved before is intact)", file=sys.stderr)  # fmt: skip
        return 2


if __name__ == "__main__":
    sys.exit(main())

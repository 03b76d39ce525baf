"""`swax eval {recall,niah,tasks,ppl,compare,convert-tasks}`: each a thin adapter from its
parsed config to the library call in :mod:`swax.eval`, plus the table it prints."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import yaml

from swax.cli import options as C
from swax.cli.common import load_for, preset_name
from swax.core.errors import SwaxError
from swax.core.paths import check_output_dir, check_writable_dir
from swax.core.settings import resolve_window
from swax.core.threads import threads_note
from swax.data import (
    DataConfig,
    SyntheticConfig,
    build_datasets,
    load_tokenizer,
    tokenize_documents,
)
from swax.data.sources import iter_documents
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
from swax.eval.tasks.specs import SAMPLES_DIR, convert_task_data, parse_tasks, sample_counts
from swax.model import run_config_file
from swax.probes.buckets import bucket_table, distance_buckets, recall_by_bucket, verdict


def cmd_eval_recall(cfg: C.RecallConfig) -> int:
    """Recall of key-value episodes at each length, with the model's window and the run's
    training window (the window study's metric) -> OUT/recall.json and a table."""

    trained, run_windows, seq_len = training_setup(cfg.model) if cfg.model else (None, {}, None)
    edges = _bucket_edges(cfg)
    lengths = _recall_lengths(cfg, seq_len)
    episodes = _recall_episodes(cfg, trained)
    out = _eval_out(cfg, "recall", RECALL_FILES)
    model, tok, label, window = _eval_model(cfg)
    explicit = str(cfg.window) != "default"
    windows = {"own": window} if explicit else {"long": window, **run_windows}
    _, val = build_datasets(DataConfig(), tok, seq_len=1, seed=0)
    results = recall_by_window(
        model,
        tok,
        val.tokens,
        episodes,
        lengths,
        cfg.samples,
        windows,
        seed=cfg.seed,
        batch_size=cfg.batch_size,
        progress=True,
    )
    meta = {
        "model": _model_name(cfg),
        "label": label,
        "windows": windows,
        "seq_len": seq_len,
        "episodes": dataclasses.asdict(episodes),
        "samples": cfg.samples,
    }
    path = write_recall(out, results, meta)
    chance = 100 / (episodes.mqar_values if episodes.task == "mqar" else 10**episodes.digits)
    named = ", ".join(f"{k} {v}" for k, v in windows.items())
    print(
        f"recall (%) of {label}, {episodes.num_needles} pair(s), {cfg.samples} episodes per "
        f"length; windows: {named}"
    )
    print(recall_table(results, lengths, seq_len))
    print(
        f"how to read: % of episodes whose answer the model produced (chance {chance:.2g}%); "
        "long = the model's own window, train = its run's training window, own = --window"
        f"{_not_trained_on_retrieval(cfg)}"
    )
    if edges and cfg.bucket_samples:
        short, long, T = edges
        rows = _recall_by_distance(cfg, edges, model, tok, val.tokens, episodes, window)
        lazy = verdict(rows, chance, T)
        results = {
            **results,
            "buckets": rows,
            "laziness": lazy,
            "bucket_windows": {"short": short, "long": long, "seq_len": T},
        }
        path = write_recall(out, results, meta)
        _print_buckets(rows, lazy, edges)
    print(_footer(path))
    return 0


def _recall_lengths(cfg: C.RecallConfig, seq_len: int | None) -> list[int]:
    """--lengths in tokens: each item a length (4k, 2000) or a multiple (``4x``) of the run's
    training length ``seq_len``."""
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
    return lengths


def _recall_episodes(cfg: C.RecallConfig, trained: SyntheticConfig | None) -> SyntheticConfig:
    """The episodes to score: the run's own task settings when --task matches them, else the
    task's defaults, with --pairs, --queries and --min-distance where given."""
    task = cfg.task if cfg.task != "auto" else (trained.task if trained else "mqar")
    base = trained if trained is not None and trained.task == task else None
    given = {"num_needles": cfg.pairs, "num_queries": cfg.queries, "min_distance": cfg.min_distance}
    return dataclasses.replace(
        base or SyntheticConfig(task=task, fraction=1.0, compact=True, min_distance=8),
        far_share=None,  # evaluation distances are uniform
        **{k: v for k, v in given.items() if v is not None},
    )


def _recall_by_distance(
    cfg: C.RecallConfig, edges: tuple[int, int, int], model, tok, tokens, episodes, window
) -> list[dict]:
    """Recall per distance bucket of ``edges`` (W_short, W_long, T): the model's own window,
    the window cut to W_short, and the recurrent state reset."""
    short, long, T = edges
    buckets = distance_buckets(short, long, T)
    print(
        f"recall by distance: {len(buckets)} buckets × {cfg.bucket_samples} episodes × 3 "
        "(own window, window cut, recurrent reset) ...",
        file=sys.stderr,
        flush=True,
    )
    return recall_by_bucket(
        model,
        tok,
        tokens,
        episodes,
        buckets,
        cfg.bucket_samples,
        window,
        probe_window=short,
        seed=cfg.seed,
        batch_size=cfg.batch_size,
    )


def _print_buckets(rows: list[dict], lazy: dict, edges: tuple[int, int, int]) -> None:
    """The recall-by-distance table and its verdict line."""
    short, long, T = edges
    print(
        f"\nrecall by distance (reach: the window the answer needs; W_short {short}, "
        f"W_long {long}, T {T}; window_cut: window {short}; reset: recurrent state "
        "emptied before the question):"
    )
    print(bucket_table(rows))
    print(
        f"inside W_long {lazy['inside_long']:.1f}%, beyond it within T "
        f"{lazy['beyond_long']:.1f}%, beyond T {lazy['beyond_T']:.1f}%: {lazy['kind']}"
    )


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


def _eval_label(cfg: C.EvalConfig) -> str:
    """The model's name in reports: --label, else the run's folder name, else the preset."""

    label = cfg.label or (Path(cfg.model).resolve().name if cfg.model else preset_name(cfg))
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
    model, tok, random_init = load_for(cfg)
    if random_init:
        print(
            f"note: --preset {preset_name(cfg)} has random weights (no --model given)",
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
    return (
        "; this model was not trained on retrieval (its run's data.synthetic.fraction is 0), "
        "so scores near chance are expected"
    )


def _footer(out) -> str:
    """The last line of an evaluation: where the results are, and the threads it ran on."""
    return f"results: {out} | {threads_note()}"


def _model_name(cfg: C.EvalConfig) -> str:
    return cfg.model or f"preset:{preset_name(cfg)}"


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
    print(
        f"how to read: the mean loss (nats per token, {tok.name} tokenizer) of the tokens at "
        f"those positions, ppl = exp(loss){trained}: a loss that stays flat or falls at later "
        "positions means the model keeps using its context there"
    )
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

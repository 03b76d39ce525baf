"""The configs of the ``swax`` commands: one dataclass per command, a docstring per field.

The command line is made from them (:func:`swax.core.configs.add_arguments`: ``--field-name``
per field, the docstring and default as help), and the same objects can be built in Python::

    from swax.cli.generate import cmd_generate
    from swax.cli.options import GenerateConfig
    cmd_generate(GenerateConfig(model="runs/tiny/model", prompt="In the beginning"))

``swax train`` and ``swax sweep`` read their own dataclass configs from YAML files with
``key=value`` overrides (:mod:`swax.train.config`, :mod:`swax.sweep`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from swax.cli.args import option
from swax.config import PRESETS
from swax.core.configs import bounded, check_fields
from swax.core.settings import WindowSetting, parse_window
from swax.eval.tasks import TaskEvalSettings
from swax.generate import PREFILL_CHUNK


class Command:
    """The base of every command's config: on construction its fields are checked against
    their declared bounds (:func:`swax.core.configs.check_fields`) and a window setting is
    parsed, so a config built in Python is checked as the command line's is."""

    def __post_init__(self) -> None:
        check_fields(self)
        for f in dataclasses.fields(self):  # window settings given as text or a number
            if f.metadata.get("cli", {}).get("parse") is parse_window:
                setattr(self, f.name, parse_window(getattr(self, f.name)))


@dataclass
class ModelChoice(Command):
    """The model a command runs: a checkpoint folder, or a preset with random weights."""

    model: str | None = option(None, group="model", metavar="DIR")
    """Checkpoint folder (written by save_pretrained or swax train), with its tokenizer; a
    training run's folder stands for its model/."""
    preset: str | None = option(None, group="model", choices=list(PRESETS))
    """Random-weight preset used when no --model is given (default: tiny)."""


@dataclass
class LoadConfig(ModelChoice):
    """A model loaded for inference."""

    device: str = "auto"
    """auto (cuda when available, else cpu), cpu, cuda or cuda:N."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the weights and activations."""
    seed: int = bounded(0, "(-inf, inf)")
    """Seed of the random weights of a preset and of sampling."""


@dataclass
class InfoConfig(ModelChoice):
    """Parameters, layers and training FLOPs per token of a preset or a checkpoint."""

    seq_len: list[int] = option(default_factory=lambda: [2048], bounds="[1, inf)")
    """Sequence lengths to give the FLOPs per token at."""


@dataclass
class GenerateConfig(LoadConfig):
    """Generate text: chunked prefill of the prompt, then constant-memory step decode."""

    prompt: str = option("In the beginning", group="prompt")
    """The prompt text."""
    prompt_file: str | None = option(None, group="prompt", metavar="PATH")
    """Read the prompt from this UTF-8 file instead."""
    max_new_tokens: int = bounded(64, "[0, inf)")
    """Tokens to generate."""
    window: WindowSetting = option("default", parse=parse_window)
    """Attention window: default (the model's), full (no window) or a number of tokens."""
    temperature: float = bounded(0.0, "[0, inf)")
    """Sampling temperature; 0 = greedy (default)."""
    top_k: int | None = option(None, bounds="[1, inf)")
    """Sample among the k most likely tokens only."""
    top_p: float | None = bounded(None, "(0, 1]")
    """Sample among the most likely tokens of total probability p only (nucleus)."""
    stop: list[str] = option(default_factory=list, repeat=True, metavar="TEXT")
    """Stop after this string (may be given several times); like the end-of-text token, it is
    kept in the output and counted in its new tokens, as Python's generate(stop_strings=...)
    keeps it (swax.generate.truncate_at_stop cuts it off)."""
    prefill_chunk: int = option(PREFILL_CHUNK, bounds="[1, inf)")
    """Prompt tokens per forward pass of the prefill."""
    stream: bool = True
    """Print the text token by token (--no-stream: at the end)."""
    compile: bool | None = None
    """Decode through the compiled step (torch.compile on the CPU, a CUDA graph on a GPU):
    --compile always, --no-compile never (the eager step); default: from 1024 new tokens, on a
    CPU and a GPU alike, or when the same configuration was compiled before in this process
    (a compile costs seconds)."""
    weights: Literal["float32", "bf16", "int8"] = "float32"
    """Weight matrices for the generation: as loaded (float32), or bf16 or int8 (weight-only,
    per output channel) with activations as loaded: fewer bytes read per token, a faster
    compiled decode step on the CPU (the eager one, --no-compile, is slower); greedy tokens may
    differ from float32's (swax.quant.decode_weights)."""


@dataclass
class EvalConfig(LoadConfig):
    """What every ``swax eval`` command over a model shares."""

    window: WindowSetting = option("default", parse=parse_window)
    """Attention window: default (the model's, i.e. the long window), full, or a number."""
    label: str | None = None
    """Name of the model in reports (default: the run's folder name or the preset)."""
    seed: int = bounded(42, "(-inf, inf)")
    """Seed of the random weights of a preset and of the evaluation data."""
    out: str | None = None
    """Results folder (default: results/KIND-LABEL); must be new or empty."""
    overwrite: bool = False
    """Replace the results of an earlier run of the same command in --out (a folder holding
    other files is refused even so)."""


@dataclass
class NiahConfig(EvalConfig):
    """RULER needle-in-a-haystack at long context lengths."""

    lengths: str | None = None
    """Comma list of context lengths in tokens (4k = 4096); default 4k,8k,16k,32k,65k,131k, or
    with --records the lengths of the records."""
    tasks: str | None = None
    """'all' or a comma list of RULER NIAH tasks; default all, or with --records the tasks of
    the records."""
    samples: int = option(10, bounds="[1, inf)")
    """Samples per task and length."""
    synthetic_keys: bool = False
    """Draw keys from the evaluation key set (disjoint from the training episodes' keys)."""
    haystack: str | None = option(None, metavar="PATH")
    """Text for the essay haystack (default: the embedded King James Bible)."""
    records: str | None = option(None, metavar="DIR")
    """Read TASK-LENGTH.jsonl records written by --dump instead of generating them (all of
    the folder's, unless --tasks and --lengths narrow them)."""
    dump: str | None = option(None, metavar="DIR")
    """Only write the records (RULER's JSONL format) to this folder and exit; no model. The
    folder must be new or empty (or hold an earlier dump, with --overwrite)."""
    tokenizer: str = "byte"
    """With --dump: byte, gpt2 or a tokenizer path."""
    prefill_chunk: int = option(PREFILL_CHUNK, bounds="[1, inf)")
    """Prompt tokens per forward pass of the prefill."""
    compile: bool = True
    """Decode through the compiled step (compiled once, in the untimed warm-up);
    --no-compile: the eager step."""


@dataclass
class TasksConfig(EvalConfig):
    """Short-context tasks: ARC, HellaSwag, PIQA, LAMBADA, HumanEval, MBPP."""

    tasks: str = "arc_easy,arc_challenge,hellaswag,piqa,lambada"
    """Comma list or 'all': arc_easy, arc_challenge, hellaswag, piqa, lambada, humaneval,
    mbpp."""
    data_dir: str | None = option(None, metavar="DIR")
    """Folder of {task}.jsonl files in the upstream schemas (see docs/evaluation.md; swax eval
    convert-tasks writes them); default: the few sample records shipped with swax."""
    num_fewshot: int | None = option(TaskEvalSettings.num_fewshot, bounds="[0, inf)")
    """Few-shot examples per prompt (default: each task's own)."""
    limit: int | None = option(TaskEvalSettings.limit, bounds="[1, inf)")
    """Evaluate the first N items of each task only."""
    batch_size: int = option(TaskEvalSettings.batch_size, bounds="[1, inf)")
    """Sequences per forward pass."""
    code_timeout: float = option(TaskEvalSettings.code_timeout, bounds="[0.1, inf)")
    """Seconds per program of the code tasks (at least 0.1)."""
    compile: bool = True
    """Generate (code tasks) through the compiled decode step; --no-compile: the eager step."""


@dataclass
class PplConfig(EvalConfig):
    """Loss by position, beyond the training length."""

    data: str | None = None
    """Held-out text: a file or folder (default: the KJV validation split)."""
    field: str = "text"
    """JSONL/Parquet field of --data."""
    lengths: str = "512,1k,2k,4k,8k,16k"
    """Comma list of bucket edges (positions); the last is the sequence length."""
    samples: int = option(4, bounds="[1, inf)")
    """Sequences to average over."""
    chunk: int = option(PREFILL_CHUNK, bounds="[1, inf)")
    """Tokens per forward pass."""
    train_len: int | None = option(None, bounds="[1, inf)")
    """Training length to mark (default: read from the run's config.yaml)."""


@dataclass
class CompareConfig(Command):
    """Merge results folders (NIAH, tasks, ppl) into one table and figure."""

    results: list[str] = option(positional=True, metavar="RESULTS")
    """Results folders written by swax eval niah, tasks or ppl (kinds may be mixed)."""
    out: str = "results/compare"
    """Output folder; must be new or empty."""
    overwrite: bool = False
    """Replace the files of an earlier swax eval compare in --out (a folder holding other
    files is refused even so)."""


@dataclass
class ConvertTasksConfig(Command):
    """Write the {task}.jsonl file of swax eval tasks from an upstream dataset: a Parquet file,
    an Arrow file or a Hugging Face dataset folder written by save_to_disk (read with pyarrow;
    the datasets package is not needed), e.g.
    swax eval convert-tasks ai2_arc_easy/ --task arc_easy --out data/tasks"""

    source: str = option(positional=True, metavar="SOURCE")
    """The dataset: a .parquet or .arrow file, or a save_to_disk folder (Dataset or
    DatasetDict)."""
    task: str = option(metavar="NAME")
    """The task it holds: arc_easy, arc_challenge, hellaswag, piqa, lambada,
    humaneval or mbpp."""
    out: str = option("data/tasks", metavar="DIR")
    """Folder to write {task}.jsonl into (the --data-dir of swax eval tasks)."""
    split: str | None = None
    """Split to read from a DatasetDict folder; default: the one lm-evaluation-harness
    evaluates (test; validation for hellaswag and piqa). train writes {task}_train.jsonl, the
    few-shot examples."""
    overwrite: bool = False
    """Replace the file if it exists."""


@dataclass
class PlotRunConfig(Command):
    """Draw a run's loss curves to a PNG: the training loss per attention window (one series
    per window of a stochastic or scheduled run), the validation loss and the learning rate."""

    run: str = option(positional=True, metavar="RUN")
    """The run folder (holding metrics.jsonl)."""
    out: str | None = None
    """PNG path (default: RUN/loss.png)."""


@dataclass
class TrainArgs(Command):
    """Train a model: swax train [CONFIG.yaml] [key=value ...], e.g.
    swax train configs/tiny.yaml optim.lr=3e-4 window.p_short=0.75"""

    args: list[str] = option(
        default_factory=list, positional=True, nargs="*", metavar="CONFIG | key=value"
    )
    """An optional YAML config, then overrides of its keys (listed below)."""


@dataclass
class SweepArgs(Command):
    """Train and evaluate a family of runs (resumable)."""

    config: str = option(positional=True, metavar="SWEEP.yaml")
    """The sweep's YAML file."""
    quick: bool = False
    """Run the reduced version of the sweep."""
    only: str | None = None
    """Comma list of run names to run."""
    jobs: int | None = bounded(None, "[1, inf)")
    """Runs at a time, each in its own process (default: the sweep's `jobs`)."""


@dataclass
class DemoConfig(Command):
    """The default job: train the tiny model (or reuse a finished demo run), then generate.
    ``swax demo recall`` instead trains a short- and a long-window model on associative recall
    and prints their recall against context length (the paper's window effect)."""

    run_dir: str = "runs/demo"
    """Folder of the demo's training run (swax demo recall: runs/demo-recall)."""
    context: int = option(32768, bounds="[1, inf)")
    """Long context for the constant-memory demonstration, in tokens."""
    overrides: list[str] = option(
        default_factory=list, positional=True, nargs="*", metavar="key=value"
    )
    """Training overrides, e.g. steps=100 (after the word recall for swax demo recall)."""


@dataclass
class RecallConfig(EvalConfig):
    """Recall of key-value episodes (MQAR or needles) at chosen lengths, with the model's own
    window and its training window: the window study's metric for one model."""

    lengths: str = "1x,2x,4x,8x,16x,32x"
    """Comma list of lengths: tokens (512, 4k) or multiples of the run's training length
    (8x; needs a swax train run folder around --model)."""
    samples: int = option(64, bounds="[1, inf)")
    """Episodes per length."""
    task: Literal["auto", "mqar", "needle"] = "auto"
    """Episodes: auto (those the run trained on, else one-pair MQAR), mqar or needle."""
    pairs: int | None = option(None, bounds="[1, inf)")
    """Key-value pairs (needles) per episode (default: the run's, else 1)."""
    queries: int | None = option(None, bounds="[1, inf)")
    """Keys asked per episode (default: the run's, else 1)."""
    min_distance: int | None = option(None, bounds="[0, inf)")
    """Fewest tokens between the pairs and the first question (default: the run's, else 8)."""
    batch_size: int = option(16, bounds="[1, inf)")
    """Episodes evaluated at once."""
    bucket_samples: int = option(64, bounds="[0, inf)")
    """Episodes per distance bucket (<= W_short, (W_short, W_long], (W_long, T], (T, 4T],
    (4T, 16T]), each also with the window cut to W_short and the recurrent state reset;
    needs the run's windows and training length (a swax train run folder, or --buckets);
    0 = no buckets."""
    buckets: str | None = None
    """The bucket edges SHORT,LONG,T (e.g. 8,32,256) for a model without a run folder, or to
    read a run by other windows than its own."""


# ---------------------------------------------------------------- swax export (hf, onnx)
@dataclass
class ExportHFConfig(Command):
    """Write a Hugging Face folder of a swax checkpoint: AutoModelForCausalLM.from_pretrained(
    OUT_DIR, trust_remote_code=True) and lm_eval --model hf load it (both need swax installed)."""

    model_dir: str = option(positional=True, metavar="MODEL_DIR")
    """The swax checkpoint folder (save_pretrained or swax train), with its tokenizer."""
    out_dir: str = option(positional=True, metavar="OUT_DIR")
    """The folder to write; must not exist or be empty."""
    overwrite: bool = False
    """Replace an earlier export in OUT_DIR (a folder holding other files is refused even so)."""


@dataclass
class ExportOnnxConfig(Command):
    """Write the forward of a swax checkpoint as an ONNX graph of fixed shape: input_ids int64
    (batch, seq-len) -> logits (batch, seq-len, vocab), at a fixed attention window."""

    model_dir: str = option(positional=True, metavar="MODEL_DIR")
    """The swax checkpoint folder."""
    out: str = option(positional=True, metavar="OUT.onnx")
    """The ONNX file to write; must not exist."""
    seq_len: int = option(128, bounds="[1, inf)")
    """Tokens per sequence (fixed in the graph)."""
    batch_size: int = option(1, bounds="[1, inf)")
    """Sequences per call (fixed in the graph)."""
    window: int | None = option(None, bounds="[1, inf)")
    """Attention window of the S layers (default: the model's config.window)."""
    overwrite: bool = False
    """Replace OUT.onnx if it exists (once the new graph is complete)."""


@dataclass
class ExportXLSTMConfig(Command):
    """Write a pure-mLSTM swax model (pattern X, logit and gate caps, no mLSTM convolution) as a
    transformers xLSTM folder: AutoModelForCausalLM.from_pretrained(OUT) loads it without
    remote code (and without swax)."""

    model_dir: str = option(positional=True, metavar="MODEL")
    """The swax model folder (save_pretrained, swax train or swax import), with its tokenizer."""
    out: str = option(positional=True, metavar="OUT")
    """The folder to write; must not exist or be empty."""
    overwrite: bool = False
    """Replace an earlier export in OUT (a folder holding other files is refused even so)."""


@dataclass
class ImportXLSTMConfig(Command):
    """Write a swax model folder computing what a transformers xLSTM folder (xLSTMForCausalLM:
    config.json + safetensors, single or fused weights, sharded or not) computes, its
    tokenizer files carried along; tensors are converted one at a time. --add-swa inserts a
    sliding-window attention block after each mLSTM block, its output projection and MLP down
    projection zero, so the model starts as the source's function (train it on with
    swax train init_from=OUT)."""

    src: str = option(positional=True, metavar="SRC")
    """The transformers xLSTM folder."""
    out: str = option(positional=True, metavar="OUT")
    """The swax model folder to write; must not exist or be empty."""
    add_swa: bool = False
    """Insert a sliding-window attention block after each mLSTM block (pattern XS)."""
    window: int | None = option(None, bounds="[1, inf)")
    """The model's default attention window (config.window; default 2048): swax train
    init_from=OUT trains at it unless the run sets window.long."""
    heads: int | None = option(None, bounds="[1, inf)")
    """Attention heads of the inserted blocks (default d_model / 128)."""
    dtype: Literal["keep", "float32", "bfloat16", "float16"] = "keep"
    """Dtype of the written weights: keep each tensor's own, or one for all."""
    seed: int = bounded(0, "(-inf, inf)")
    """Seed of the inserted blocks' initial weights (block j draws from seed + j)."""
    ignore_field: list[str] = option(default_factory=list, repeat=True, metavar="KEY")
    """A config.json key swax does not know and you know does not change the computation (may
    be given several times)."""
    overwrite: bool = False
    """Replace an earlier import in OUT (a folder holding other files is refused even so)."""


# ---- swax data prepare (pre-tokenized shards; see swax.data.shards) ----


@dataclass
class DataPrepareConfig(Command):
    """Tokenize a corpus once into memory-mapped token shards for data.source=DIR:
    swax data prepare SOURCE --tokenizer gpt2 --out DIR [--workers K]"""

    source: str = option(positional=True, metavar="SOURCE")
    """Documents: 'kjv', a text file, a folder of .txt/.md/.jsonl/.parquet files, a .jsonl or
    .parquet file, or a saved Hugging Face dataset folder."""
    out: str = option(metavar="DIR")
    """Folder of the shard set (new, empty, or an interrupted prepare to resume)."""
    tokenizer: str = "byte"
    """byte, gpt2, or a tokenizer.json path or folder."""
    shard_tokens: int = option(100_000_000, bounds="[1, inf)")
    """Tokens per shard file (the last of each split may hold fewer)."""
    workers: int = option(1, bounds="[1, inf)")
    """Tokenizing processes; the output does not depend on it."""
    val_fraction: float = bounded(0.02, "[0, 1)")
    """Share of the documents held out for validation (by a hash of their text), in [0, 1)."""
    split_seed: int = bounded(0, "(-inf, inf)")
    """Seed of the validation hash (as data.split_seed)."""
    format: str = "auto"
    """auto | kjv | text | jsonl | parquet | hf."""
    field: str = "text"
    """JSONL field or Parquet / Arrow column holding the text."""
    overwrite: bool = False
    """Replace a complete shard set already in --out."""
    progress: bool = True
    """Show a progress bar on stderr."""


@dataclass
class DataFarShareConfig(Command):
    """The natural far share of a corpus: the share of its targets that only a copy from beyond
    the window W predicts, at each training length T and W = T / divisor (swax.data.copies):
    swax data far-share SOURCE --tokenizer gpt2 --seq-lens 256,4k,16k --out FILE.json"""

    source: str = option(positional=True, metavar="SOURCE")
    """Documents: 'kjv', 'pystdlib' (the Python standard library's source), a text file, a
    folder of .txt/.md/.jsonl/.parquet files, a .jsonl or .parquet file, or a saved Hugging
    Face dataset folder."""
    tokenizer: str = "byte"
    """byte, gpt2, or a tokenizer.json path or folder."""
    seq_lens: str = "256,4k,16k"
    """Training lengths T (comma list; 4k = 4096)."""
    divisors: str = "128,32,8,4"
    """Windows as divisors of T: W = T / d (the paper's 128 and 2048 at 16k are 128 and 8)."""
    context: int = option(0, bounds="[0, inf)")
    """Tokens of the context that must repeat (the copy's key) and the order of the n-gram
    baseline; 0 = 8 for the byte tokenizer, 4 otherwise (about the same stretch of text)."""
    held_out: float = bounded(0.1, "(0, 1)")
    """Share of the documents held out (by a hash of their text) and read; the rest fits the
    n-gram baseline."""
    samples: int = option(1000, bounds="[1, inf)")
    """Bootstrap resamples of the held-out documents for the 95 % interval."""
    seed: int = bounded(0, "(-inf, inf)")
    """Seed of the split and of the bootstrap."""
    format: str = "auto"
    """auto | kjv | pystdlib | text | jsonl | parquet | hf."""
    field: str = "text"
    """JSONL field or Parquet / Arrow column holding the text."""
    out: str = option("", metavar="FILE")
    """Write the result as JSON here (its parent folder is created); empty = print only."""


@dataclass
class DataVerifyConfig(Command):
    """Check every shard of a shard set against the size and SHA-256 in its index.json (reads
    every byte; training checks the sizes only)."""

    folder: str = option(positional=True, metavar="DIR")
    """The shard set (written by swax data prepare)."""
    progress: bool = True
    """Show a progress bar on stderr."""

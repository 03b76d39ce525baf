"""`swax eval niah`: RULER needle-in-a-haystack through the constant-memory generation path.

For every task and length, RULER-format records are generated in the model's own tokenizer
(:mod:`swax.eval.ruler`) or read from a folder written by ``--dump``; each prompt (``input`` +
``answer_prefix``) is prefilled in chunks and decoded greedily for the task's
``tokens_to_generate``; predictions are cleaned as RULER's ``evaluate.py`` does
(:func:`swax.eval.ruler.postprocess_pred`) and scored with RULER's ``string_match_all``.

Outputs in the results folder:

- ``results.json``: settings, scores by task and length, per-depth scores, timings, peak memory,
  and the model's throughput by length (prompt tokens prefilled per second, tokens decoded per
  second; when the predictor reports them, as :class:`SwaxPredictor` does);
- ``summary-{length}.csv``: RULER's summary layout (rows Tasks / Score / Nulls) for each length;
- ``summary.csv``: one row per task and length (task, length, score, nulls, samples);
- ``pred/{task}-{length}.jsonl``: every prediction with its references, depth and score;
- ``heatmap-{task}.png``: accuracy by needle depth × length.
"""

from __future__ import annotations

import csv
import json
import logging
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swax.core.errors import SwaxError
from swax.core.plotting import format_length, pyplot
from swax.core.progress import progress_bar
from swax.eval.ruler import (
    TASKS,
    generate_niah,
    postprocess_pred,
    read_jsonl,
    string_match_all,
    write_jsonl,
)
from swax.generate import PREFILL_CHUNK, generate
from swax.state import DEFAULT_WINDOW

log = logging.getLogger("swax")

DEPTH_BINS = 10  # heatmap rows: needle depth in bins of 10%

DEFAULT_LENGTHS = "4k,8k,16k,32k,65k,131k"
"""The lengths of ``swax eval niah`` when neither --lengths nor --records gives them."""


def results_files() -> list[str]:
    """The files ``swax eval niah`` writes in its results folder (glob patterns relative to
    it; see the module docstring): what ``--overwrite`` may replace."""

    return [
        "results.json",
        "summary.csv",
        "summary-[0-9]*.csv",
        *[f"heatmap-{t}.png" for t in TASKS],
        *[f"pred/{t}-[0-9]*.jsonl" for t in TASKS],
    ]


def dump_files() -> list[str]:
    """The files ``swax eval niah --dump`` writes (glob patterns): ``TASK-LENGTH.jsonl``."""

    return [f"{t}-[0-9]*.jsonl" for t in TASKS]


def parse_length(text: str | int) -> int:
    """'4k' -> 4096, '131k' -> 131072, '128k' -> 131072, '2000' -> 2000."""
    if isinstance(text, int):
        return text
    t = str(text).strip().lower()
    try:
        if t.endswith("k"):
            k = int(t[:-1])
            return 131072 if k in (128, 131) else 65536 if k == 65 else k * 1024
        if t.endswith("m"):
            return int(t[:-1]) * 1024 * 1024
        return int(t)
    except ValueError:
        raise SwaxError(f"cannot read length {text!r}; expected a number like 4096 or 4k") from None


def parse_lengths(text: str | Sequence, what: str = "lengths") -> list[int]:
    """A comma list of lengths ("4k,8k,2000"); an empty list, a length that is not a number
    and one below 1 are SwaxErrors naming ``what`` (e.g. "--lengths") and the value."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        lengths = [parse_length(x) for x in items if str(x).strip()]
    except SwaxError as e:
        raise SwaxError(f"{what}: {e}") from None
    if not lengths or any(n < 1 for n in lengths):
        raise SwaxError(f"{what} must be positive lengths in tokens (e.g. 4k,8k), got {text!r}")
    return lengths


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


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
            generate(self.model, warm, max_new_tokens=2, window=self.window,
                     prefill_chunk_size=self.prefill_chunk, compile=self.compile)  # fmt: skip
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


@dataclass
class NiahResult:
    scores: dict[str, dict[int, float]] = field(default_factory=dict)
    nulls: dict[str, dict[int, int]] = field(default_factory=dict)
    by_depth: dict[str, dict[int, dict[int, list[float]]]] = field(default_factory=dict)
    samples: int = 0
    timing: dict[int, Timing] = field(default_factory=dict)
    """By length, over all tasks: the predictor's prefill and decode work (empty when the
    predictor does not report it)."""

    def average(self, length: int) -> float:
        vals = [s[length] for s in self.scores.values() if length in s]
        return sum(vals) / len(vals) if vals else float("nan")


def _depth_bin(depth) -> int:
    d = depth[0] if isinstance(depth, (list, tuple)) else depth
    return min(DEPTH_BINS - 1, max(0, int(float(d) // (100 / DEPTH_BINS))))


def dumped_cells(folder: str | Path) -> dict[str, list[int]]:
    """{task: sorted lengths} of the ``TASK-LENGTH.jsonl`` files in a folder written by
    ``--dump`` (in RULER's task order; other files are ignored). A missing folder, or one
    without such files, is a SwaxError naming it."""

    folder = Path(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise SwaxError(f"--records {folder} {what} (expected a folder written by --dump)")
    found: dict[str, set[int]] = {}
    for p in folder.iterdir():
        task, _, length = p.name.removesuffix(".jsonl").rpartition("-")
        if p.name.endswith(".jsonl") and task in TASKS and length.isdigit() and p.is_file():
            found.setdefault(task, set()).add(int(length))
    if not found:
        raise SwaxError(
            f"--records {folder} holds no TASK-LENGTH.jsonl records (write them with "
            "swax eval niah --dump DIR)"
        )
    return {t: sorted(found[t]) for t in TASKS if t in found}


def records_grid(
    folder: str | Path, tasks: Sequence[str] | None = None, lengths: Sequence[int] | None = None
) -> tuple[list[str], list[int]]:
    """(tasks, lengths) to evaluate from a ``--dump`` folder: those of its records, or the
    given ones (which narrow them). Every task must have records at every length (the results
    are a full table); a missing file is a SwaxError naming it and what the folder holds."""
    cells = dumped_cells(folder)
    tasks = list(cells) if tasks is None else list(tasks)
    if lengths is None:
        lengths = sorted({n for t in tasks for n in cells.get(t, ())})
    missing = [f"{t}-{n}.jsonl" for t in tasks for n in lengths if n not in cells.get(t, ())]
    if missing or not lengths:
        held = "; ".join(f"{t} at {','.join(map(str, ns))}" for t, ns in cells.items())
        raise SwaxError(
            f"--records {folder} has no {missing[0] if missing else 'records of ' + tasks[0]} "
            f"(it holds {held}); pass --tasks and --lengths it holds"
        )
    return tasks, list(lengths)


def load_dumped(folder: Path, task: str, length: int) -> list[dict]:

    return read_jsonl(folder / f"{task}-{length}.jsonl")


def _all_records(
    tokenizer, tasks, lengths, samples, seed, haystack_text, key_split, records_dir
) -> dict[tuple[str, int], list[dict]]:
    """{(task, length): records}, generated or read from ``records_dir``."""

    records = {}
    for length in lengths:
        for task in tasks:
            if records_dir is not None:
                records[task, length] = load_dumped(Path(records_dir), task, length)[:samples]
            else:
                records[task, length] = generate_niah(
                    task,
                    length,
                    samples,
                    tokenizer,
                    seed=seed,
                    haystack_text=haystack_text,
                    key_split=key_split,
                )
    return records


def _predict_cell(predict, records: list[dict], by_depth: dict, on_sample, timing) -> list[dict]:
    """Predict and score every record of one task and length; one row per record (what
    ``pred/{task}-{length}.jsonl`` holds). Scores are also filed by needle depth, and the
    predictor's ``last_timing`` (if it has one) is added to ``timing``."""

    rows = []
    for rec in records:
        prompt = rec["input"] + rec.get("answer_prefix", "")
        pred = postprocess_pred(predict(prompt, int(rec.get("tokens_to_generate", 128))))
        if getattr(predict, "last_timing", None) is not None:
            timing += predict.last_timing
        score = string_match_all([pred], [rec["outputs"]])
        rows.append(
            {
                "index": rec["index"],
                "pred": pred,
                "outputs": rec["outputs"],
                "depth": rec.get("depth"),
                "score": score,
                "length": rec.get("length"),
            }
        )
        if rec.get("depth") is not None:
            by_depth.setdefault(_depth_bin(rec["depth"]), []).append(score)
        on_sample()
    return rows


def run_niah(
    predict,
    tokenizer,
    tasks: Sequence[str],
    lengths: Sequence[int],
    samples: int,
    seed: int = 42,
    out_dir: str | Path | None = None,
    haystack_text: str | None = None,
    key_split: str | None = None,
    records_dir: str | Path | None = None,
    settings: dict | None = None,
    progress: bool = True,
) -> NiahResult:
    """Generate (or read) the records, predict, score, and write the results folder.

    ``predict(prompt: str, max_new_tokens: int) -> str`` is the model (see
    :class:`SwaxPredictor`); tests pass stubs.
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SwaxError(
            f"unknown NIAH task {unknown[0]!r}; expected one of {', '.join(TASKS)} or 'all'"
        )
    out = Path(out_dir) if out_dir else None
    if out:
        (out / "pred").mkdir(parents=True, exist_ok=True)
    result = NiahResult(samples=samples)
    t0 = time.perf_counter()
    # all records first (cheap), so a bad length or data file fails before any model work
    all_records = _all_records(
        tokenizer, tasks, lengths, samples, seed, haystack_text, key_split, records_dir
    )
    total = sum(len(r) for r in all_records.values())
    # records read from --records may be fewer than asked for: count those evaluated
    result.samples = max((len(r) for r in all_records.values()), default=samples)
    bar = progress_bar(total, "niah", "sample", enabled=progress)
    timings: dict[str, float] = {}
    for length in lengths:
        for task in tasks:
            bar.set_postfix_str(f"{task} @ {length:,}")
            ts = time.perf_counter()
            by_depth: dict[int, list[float]] = {}
            cell_timing = result.timing.setdefault(length, Timing())
            rows = _predict_cell(
                predict, all_records[task, length], by_depth, bar.update, cell_timing
            )
            if by_depth:
                result.by_depth.setdefault(task, {})[length] = by_depth
            timings[f"{task}-{length}"] = time.perf_counter() - ts
            preds = [r["pred"] for r in rows]
            result.scores.setdefault(task, {})[length] = string_match_all(
                preds, [r["outputs"] for r in rows]
            )
            result.nulls.setdefault(task, {})[length] = sum(1 for p in preds if not p)
            if out:
                with (out / "pred" / f"{task}-{length}.jsonl").open("w") as fh:
                    for r in rows:
                        fh.write(json.dumps(r) + "\n")
    bar.close()
    result.timing = {n: t for n, t in result.timing.items() if t.prefill_tokens}
    if out:
        settings = {
            **(settings or {}),
            "tasks": list(tasks),
            "lengths": list(lengths),
            "samples": result.samples,
            "seed": seed,
            "key_split": key_split,
            "elapsed_s": time.perf_counter() - t0,
            "peak_rss_gib": peak_rss_gib(),
            "seconds_by_task_length": timings,
        }
        _write_outputs(out, result, tasks, lengths, settings)
    return result


def _write_outputs(out: Path, r: NiahResult, tasks, lengths, settings: dict) -> None:
    data = {
        "settings": settings,
        "scores": {t: {str(n): s for n, s in v.items()} for t, v in r.scores.items()},
        "average": {str(n): r.average(n) for n in lengths},
        "nulls": {t: {str(n): s for n, s in v.items()} for t, v in r.nulls.items()},
        "throughput": {str(n): t.as_dict() for n, t in r.timing.items()},
        "by_depth": {
            t: {
                str(n): {str(b * 100 // DEPTH_BINS): sum(x) / len(x) for b, x in sorted(d.items())}
                for n, d in v.items()
            }
            for t, v in r.by_depth.items()
        },
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))
    with (out / "summary.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task", "length", "score", "nulls", "samples"])
        for t in tasks:
            for n in lengths:
                w.writerow([t, n, f"{r.scores[t][n]:.2f}", r.nulls[t][n], r.samples])
    for n in lengths:  # RULER's own summary layout, one file per length
        with (out / f"summary-{n}.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["Tasks", *tasks])
            w.writerow(["Score", *[f"{r.scores[t][n]:.2f}" for t in tasks]])
            w.writerow(["Nulls", *[f"{r.nulls[t][n]}/{r.samples}" for t in tasks]])
    heatmaps(out, r, tasks, lengths)


def format_table(r: NiahResult, tasks, lengths) -> str:
    """Tasks × lengths with the average row, as printed to the terminal."""
    head = ["task", *[_fmt_len(n) for n in lengths]]
    rows = [[t, *[f"{r.scores[t][n]:.1f}" for n in lengths]] for t in tasks]
    rows.append(["average", *[f"{r.average(n):.1f}" for n in lengths]])
    extra = []
    if r.timing:  # the model's speed, below the accuracy table
        for key, label in (("prefill", "prefill tok/s"), ("decode", "decode tok/s")):
            rates = [r.timing[n].as_dict()[f"{key}_tokens_per_s"] if n in r.timing else None
                     for n in lengths]  # fmt: skip
            extra.append([label, *["-" if x is None else _fmt_rate(x) for x in rates]])
    rows += extra
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row))
        for row in [head, *rows]
    ]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(len(lines) - 1 - len(extra), "-" * len(lines[0]))
    if extra:
        lines.insert(len(lines) - len(extra), "-" * len(lines[0]))
    return "\n".join(lines)


def _fmt_rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.1f}"


def _fmt_len(n: int) -> str:

    return format_length(n) if n % 1024 == 0 else str(n)


def heatmaps(out: Path, r: NiahResult, tasks, lengths) -> list[Path]:
    """One PNG per task: accuracy by needle depth (rows) × length (columns)."""
    import numpy as np

    plt = pyplot()
    paths = []
    for t in tasks:
        grid = np.full((DEPTH_BINS, len(lengths)), np.nan)
        for j, n in enumerate(lengths):
            for b, xs in r.by_depth.get(t, {}).get(n, {}).items():
                grid[b, j] = sum(xs) / len(xs)
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 4.2))
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [_fmt_len(n) for n in lengths])
        ax.set_yticks(range(DEPTH_BINS), [f"{b * 100 // DEPTH_BINS}%" for b in range(DEPTH_BINS)])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(t)
        fig.colorbar(im, ax=ax, label="accuracy")
        fig.tight_layout()
        p = out / f"heatmap-{t}.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def dump_records(
    out_dir: str | Path,
    tokenizer,
    tasks,
    lengths,
    samples: int,
    seed: int,
    haystack_text: str | None = None,
    key_split: str | None = None,
) -> list[Path]:
    """Write ``TASK-LENGTH.jsonl`` (RULER's format) for every task and length; no model."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in tasks:
        for n in lengths:
            recs = generate_niah(
                task,
                n,
                samples,
                tokenizer,
                seed=seed,
                haystack_text=haystack_text,
                key_split=key_split,
            )
            p = out / f"{task}-{n}.jsonl"
            write_jsonl(recs, p)
            paths.append(p)
    return paths

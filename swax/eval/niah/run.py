"""Running ``swax eval niah``: :func:`run_niah` predicts and scores every record, task by task
and length by length, and writes the results folder."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Sequence
from pathlib import Path

from swax.core.errors import SwaxError
from swax.core.progress import progress_bar
from swax.eval.niah.predictor import Timing
from swax.eval.niah.records import _all_records
from swax.eval.niah.report import DEPTH_BINS, NiahResult, _write_outputs
from swax.eval.ruler import TASKS, postprocess_pred, string_match_all


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _depth_bin(depth) -> int:
    d = depth[0] if isinstance(depth, (list, tuple)) else depth
    return min(DEPTH_BINS - 1, max(0, int(float(d) // (100 / DEPTH_BINS))))


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

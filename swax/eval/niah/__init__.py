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

The package: :mod:`~swax.eval.niah.predictor` (:class:`SwaxPredictor`, the model side),
:mod:`~swax.eval.niah.records` (lengths, ``--dump`` folders, the records of a run),
:mod:`~swax.eval.niah.run` (:func:`run_niah`), :mod:`~swax.eval.niah.report` (the results, the
files of the results folder and the terminal table).
"""

from swax.eval.niah.predictor import SwaxPredictor, Timing
from swax.eval.niah.records import (
    DEFAULT_LENGTHS,
    dump_files,
    dump_records,
    dumped_cells,
    load_dumped,
    parse_length,
    parse_lengths,
    records_grid,
)
from swax.eval.niah.report import DEPTH_BINS, NiahResult, format_table, heatmaps, results_files
from swax.eval.niah.run import peak_rss_gib, run_niah

__all__ = [
    "DEFAULT_LENGTHS",
    "DEPTH_BINS",
    "NiahResult",
    "SwaxPredictor",
    "Timing",
    "dump_files",
    "dump_records",
    "dumped_cells",
    "format_table",
    "heatmaps",
    "load_dumped",
    "parse_length",
    "parse_lengths",
    "peak_rss_gib",
    "records_grid",
    "results_files",
    "run_niah",
]

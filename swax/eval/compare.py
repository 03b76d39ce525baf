"""`swax eval compare`: several results folders in one table and one figure per kind.

Each folder is read by what it holds:

- ``swax eval niah`` (``results.json`` with ``average``): a models × lengths table of the
  task-averaged accuracy (``compare.csv``) and a figure of accuracy against length, one line per
  model (``compare.png``);
- ``swax eval tasks`` (``results.json`` with ``tasks``): a tasks × models table of each task's
  main metrics (``compare-tasks.csv``: the values as in ``results.json``, fractions for
  accuracies; printed as percentages);
- ``swax eval ppl`` (``ppl.json``): a positions × models table of the loss
  (``compare-ppl.csv``) and the loss-by-position curves (``compare-ppl.png``).

Folders of different kinds may be mixed; the printed report has one section per kind. This is
the form in which the window-size study is read.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from swax.core.errors import SwaxError
from swax.core.plotting import save_curves
from swax.eval.tasks import _MAIN_METRICS
from swax.eval.tasks.specs import TASKS
from swax.model import run_config_file

RESULT_FILES = (
    "compare.csv",
    "compare.png",
    "compare-tasks.csv",
    "compare-ppl.csv",
    "compare-ppl.png",
)
"""The files ``swax eval compare`` writes in its --out folder (what ``--overwrite`` replaces)."""

KINDS = {"average": ("niah", dict), "tasks": ("tasks", dict), "buckets": ("ppl", list)}
"""The key of a results file that says which command wrote it, with the type of its value."""


def _label(folder: Path, settings: dict) -> str:
    return settings.get("label") or folder.name


def _read_json(path: Path) -> dict:
    """A results file written by swax eval, as a dict; a file that is not such JSON (unreadable,
    not UTF-8, not JSON, not an object) is a SwaxError naming it."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SwaxError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise SwaxError(f"{path} holds no JSON object (compare reads the results of swax eval)")
    return data


def _kind(path: Path, data: dict, keys: tuple[str, ...]) -> str:
    for key in keys:
        kind, tp = KINDS[key]
        if isinstance(data.get(key), tp):
            return kind
    want = " or ".join(repr(k) for k in keys)
    raise SwaxError(
        f"{path} holds no {want} (compare reads the results of swax eval niah, tasks and ppl)"
    )


def load_results(folders: list[str | Path]) -> dict[str, dict[str, object]]:
    """``{"niah": {model: {length: accuracy}}, "tasks": {model: {task: metrics}}, "ppl": {model:
    [bucket rows]}}`` of the results folders, each folder read by what it holds; a model's name
    is its ``settings.label`` (else the folder's name), made unique with the folder's path."""
    found: dict[str, dict[str, object]] = {"niah": {}, "tasks": {}, "ppl": {}, "train_len": {}}
    for f in map(Path, folders):
        if (f / "results.json").is_file():
            data = _read_json(f / "results.json")
            kind = _kind(f / "results.json", data, ("average", "tasks"))
        elif (f / "ppl.json").is_file():
            data = _read_json(f / "ppl.json")
            kind = _kind(f / "ppl.json", data, ("buckets",))
        elif not f.is_dir():
            what = "is not a folder" if f.exists() else "does not exist"
            raise SwaxError(f"results folder {f} {what}")
        else:
            raise SwaxError(
                f"{f} holds neither results.json (swax eval niah or tasks) nor ppl.json "
                "(swax eval ppl)"
            )
        label = _label(f, data.get("settings") or {})
        if label in found[kind]:
            label = f"{label} ({f})"
        if kind == "niah":
            try:
                found[kind][label] = {int(k): v for k, v in data["average"].items()}
            except ValueError:
                raise SwaxError(
                    f"{f / 'results.json'}: 'average' is not keyed by lengths"
                ) from None
        elif kind == "tasks":
            found[kind][label] = {t: m for t, m in data["tasks"].items() if isinstance(m, dict)}
        else:
            found[kind][label] = data["buckets"]
        train_len = _train_len(data.get("settings") or {})
        if train_len:
            found["train_len"][label] = train_len
    return found


def _train_len(settings: dict) -> int | None:
    """The training length of the model behind a results folder: its ``train_len`` setting,
    else the seq_len of the run around its model folder (None when neither is known)."""
    if settings.get("train_len"):
        return int(settings["train_len"])
    model = settings.get("model")
    if not model or str(model).startswith("preset:"):
        return None
    try:
        run_yaml = run_config_file(model)
        seq_len = (yaml.safe_load(run_yaml.read_text()) or {}).get("seq_len") if run_yaml else None
    except (OSError, yaml.YAMLError):
        return None
    return int(seq_len) if isinstance(seq_len, int) else None


def _train_len_lines(train_len: dict[str, int], models) -> list[tuple[float, str]]:
    """Dashed markers at the training length of the ``models`` (one per distinct length)."""
    by_len: dict[int, list[str]] = {}
    for m in models:
        if m in train_len:
            by_len.setdefault(train_len[m], []).append(m)
    if len(by_len) == 1:
        (n,) = by_len
        return [(n, f"training length {n:,}")]
    return [(n, f"training length {n:,} ({', '.join(ms)})") for n, ms in sorted(by_len.items())]


def _table(rows: list[list[str]], left: int = 1) -> list[str]:
    """Aligned lines of ``rows`` (the first is the header): the first ``left`` columns
    left-aligned, the others right-aligned; a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(widths[i]) if i < left else c.rjust(widths[i]) for i, c in enumerate(r))
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def _length(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _niah(niah: dict, out: Path, train_len: dict[str, int]) -> list[str]:

    lengths = sorted({n for v in niah.values() for n in v})
    head = ["model", *[_length(n) for n in lengths]]
    rows = [[m, *[f"{v[n]:.1f}" if n in v else "-" for n in lengths]] for m, v in niah.items()]
    with (out / "compare.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", *lengths])
        for m, v in niah.items():
            w.writerow([m, *[v.get(n, "") for n in lengths]])
    save_curves(
        out / "compare.png",
        {m: (sorted(v), [v[x] for x in sorted(v)]) for m, v in niah.items()},
        "context length (tokens)",
        "NIAH accuracy (average over tasks)",
        ylim=(-3, 103),
        vlines=_train_len_lines(train_len, niah),
    )
    return ["NIAH accuracy (%, average over tasks)", *_table([head, *rows])]


def _tasks(tasks: dict, out: Path, train_len: dict[str, int]) -> list[str]:

    models = list(tasks)
    names = [t for t in TASKS if any(t in v for v in tasks.values())]
    cells = [  # (task, metric) of every main metric some model has
        (t, metric)
        for t in names
        for metric in _MAIN_METRICS[TASKS[t].kind]
        if any(metric in v.get(t, {}) for v in tasks.values())
    ]

    def value(m: str, t: str, metric: str):
        x = tasks[m].get(t, {}).get(metric)
        return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    with (out / "compare-tasks.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["task", "metric", *models])
        for t, metric in cells:
            w.writerow(
                [
                    t,
                    metric,
                    *["" if value(m, t, metric) is None else value(m, t, metric) for m in models],
                ]
            )

    def shown(x, metric: str) -> str:
        if x is None:
            return "-"
        return f"{x:.3f}" if metric == "perplexity" else f"{100 * x:.2f}"

    rows = [["task", "metric", *models]]
    rows += [
        [t, metric, *[shown(value(m, t, metric), metric) for m in models]] for t, metric in cells
    ]
    return ["short-context tasks (%; perplexity as is)", *_table(rows, left=2)]


def _ppl(ppl: dict, out: Path, train_len: dict[str, int]) -> list[str]:

    models = list(ppl)
    ends = sorted({int(r["bucket_end"]) for rows in ppl.values() for r in rows})
    loss = {m: {int(r["bucket_end"]): r["loss"] for r in rows} for m, rows in ppl.items()}
    with (out / "compare-ppl.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["bucket_end", *models])
        for e in ends:
            w.writerow([e, *[loss[m].get(e, "") for m in models]])
    save_curves(
        out / "compare-ppl.png",
        {m: (sorted(v), [v[x] for x in sorted(v)]) for m, v in loss.items()},
        "position (tokens)",
        "loss (nats/token)",
        ylim=(0, None),  # from zero: a flat curve must look flat
        vlines=_train_len_lines(train_len, ppl),
    )
    rows = [["positions up to", *models]]
    rows += [
        [f"{e:,}", *[f"{loss[m][e]:.4f}" if e in loss[m] else "-" for m in models]] for e in ends
    ]
    return ["loss (nats/token) by position", *_table(rows)]


def compare(folders: list[str | Path], out_dir: str | Path) -> str:
    """Write the tables and figures of the results ``folders`` (see the module docstring) into
    ``out_dir``; return the printed report, one section per kind of results."""
    found = load_results(folders)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    marks = found["train_len"]
    sections = [
        draw(found[kind], out, marks)
        for kind, draw in (("niah", _niah), ("tasks", _tasks), ("ppl", _ppl))
        if found[kind]
    ]
    return "\n\n".join("\n".join(s) for s in sections)

"""`swax eval compare`: several results folders in one table and one figure.

NIAH folders (``results.json``) give a models × lengths table of the task-averaged accuracy and a
figure of accuracy against length, one line per model; perplexity folders (``ppl.json``) give
loss-by-position curves. This is the form in which the window-size study is read.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..errors import SwaxError

RESULT_FILES = (
    "compare.csv",
    "compare.png",
    "compare-tasks.csv",
    "compare-ppl.csv",
    "compare-ppl.png",
)
"""The files ``swax eval compare`` writes in its --out folder (what ``--overwrite`` replaces)."""


def _label(folder: Path, settings: dict) -> str:
    return settings.get("label") or folder.name


def _read_json(path: Path, key: str) -> dict:
    """A results file written by swax eval; a file that is not such JSON (unreadable, not
    UTF-8, not JSON, without ``key``) is a SwaxError naming it."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SwaxError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or key not in data:
        raise SwaxError(
            f"{path} holds no {key!r} (compare reads the results of swax eval niah and ppl)"
        )
    return data


def load_results(folders: list[str | Path]) -> tuple[dict, dict]:
    niah, ppl = {}, {}
    for f in map(Path, folders):
        if (f / "results.json").is_file():
            data = _read_json(f / "results.json", "average")
            niah[_label(f, data.get("settings", {}))] = {
                int(k): v for k, v in data["average"].items()
            }
        elif (f / "ppl.json").is_file():
            data = _read_json(f / "ppl.json", "buckets")
            ppl[_label(f, data.get("settings", {}))] = data["buckets"]
        else:
            raise SwaxError(
                f"{f} holds neither results.json (swax eval niah) nor ppl.json (swax eval ppl)"
            )
    return niah, ppl


def compare(folders: list[str | Path], out_dir: str | Path) -> str:
    """Write compare.csv and compare.png (and compare-ppl.png); return the printed table."""
    from .plots import save_curves

    niah, ppl = load_results(folders)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    if niah:
        lengths = sorted({n for v in niah.values() for n in v})
        head = ["model", *[f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in lengths]]
        rows = [[m, *[f"{v[n]:.1f}" if n in v else "-" for n in lengths]] for m, v in niah.items()]
        with (out / "compare.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["model", *lengths])
            for m, v in niah.items():
                w.writerow([m, *[v.get(n, "") for n in lengths]])
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, *rows]:
            lines.append(
                "  ".join(
                    c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)
                )
            )
        lines.insert(1, "-" * len(lines[0]))
        save_curves(
            out / "compare.png",
            {m: (sorted(v), [v[x] for x in sorted(v)]) for m, v in niah.items()},
            "context length (tokens)",
            "NIAH accuracy (average over tasks)",
            ylim=(-3, 103),
        )
    if ppl:
        save_curves(
            out / "compare-ppl.png",
            {
                m: ([r["bucket_end"] for r in rows_], [r["loss"] for r in rows_])
                for m, rows_ in ppl.items()
            },
            "position (tokens)",
            "loss (nats/token)",
        )
        if not lines:
            lines.append("perplexity curves: " + ", ".join(ppl))
    return "\n".join(lines)

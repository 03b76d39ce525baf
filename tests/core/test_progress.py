"""Progress output (swax.core.progress): a bar on a terminal, whole lines every so often elsewhere,
never a carriage return in a log."""

import io
import os
import subprocess
import sys

from swax import SwaxConfig, SwaxLM
from swax.core.progress import LineProgress, progress_bar


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_lines_when_not_a_terminal():
    out = io.StringIO()
    bar = progress_bar(8, "niah", "sample", file=out)
    assert isinstance(bar, LineProgress)
    bar.interval = 0  # a line at every update
    bar.update(2)
    bar.set_postfix_str("niah_single_1 @ 1,024")
    bar.update(2)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("niah: 2/8 samples (25%)")
    assert lines[1].startswith("niah: 4/8 samples (50%)") and lines[1].endswith("@ 1,024")
    assert "ETA" in lines[1]


def test_nothing_for_short_work_or_when_disabled():
    out = io.StringIO()
    bar = progress_bar(3, "ppl", "chunk", file=out)  # the default interval: 30 s
    for _ in range(3):
        bar.update(1)
    quiet = progress_bar(3, "ppl", "chunk", enabled=False, file=out)
    quiet.interval = 0
    quiet.update(3)
    assert out.getvalue() == "" and quiet.n == 3


def test_a_bar_on_a_terminal():
    from tqdm import tqdm

    bar = progress_bar(3, "ppl", "chunk", file=_Terminal())
    assert isinstance(bar, tqdm)
    bar.close()


def test_a_piped_evaluation_has_no_carriage_return(tmp_path):
    """`swax eval ppl` with its stderr in a pipe: progress as whole lines (one per update with
    $SWAX_PROGRESS_SECONDS=0), no \\r."""
    model = tmp_path / "m"
    SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=16)).save_pretrained(model)
    env = {**os.environ, "SWAX_PROGRESS_SECONDS": "0", "SWAX_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "swax",
        "eval",
        "ppl",
        "--model",
        str(model),
        "--lengths",
        "64,128",
        "--samples",
        "2",
        "--out",
        str(tmp_path / "o"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr + r.stdout
    assert any(ln.startswith("ppl: ") and "chunks" in ln for ln in r.stderr.splitlines()), r.stderr
    assert "how to read:" in r.stdout and "threads 1 (as asked)" in r.stdout

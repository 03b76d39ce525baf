"""Where the short window's lower text loss comes from (experiments/text_study/positions.py):
the position ranges and the far-context swap by hand, and the committed split adding up to the
archived text loss of each run."""

import json

import numpy as np
import pytest

from experiments.text_study import positions as tp

HERE = tp.HERE


def test_position_ranges_average_the_right_queries():
    losses = np.arange(2 * 10, dtype=float).reshape(2, 10)  # stretch s, position t: 10 s + t
    got = tp.range_means(losses, ((0, 2), (2, 5), (5, 10)))
    assert got.tolist() == [[0.5, 3.0, 7.0], [10.5, 13.0, 17.0]]
    d = tp.paired_stretches(np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0, 0.0]))
    t2 = 4.3027  # Student t, 97.5 % quantile, 2 degrees of freedom (tables)
    assert d["mean"] == 2.0 and d["ci"] == pytest.approx([2 - t2 / 3**0.5, 2 + t2 / 3**0.5], 1e-4)


def test_the_far_context_swap_keeps_the_last_8_or_64_tokens():
    rows = np.arange(4)[:, None] * 1000 + np.arange(257)[None, :]  # stretch s, position t
    _, near, _ = tp.swap_far(rows, (3,))  # nothing older than the last 8: nothing swapped
    assert (near == rows).all()
    real, swapped, at = tp.swap_far(rows, (12, 80))
    assert at.tolist() == [12, 80] * 4 and (real[0] == rows[0]).all() and (real[3] == rows[1]).all()
    # stretch 0, query 12: positions 0-4 from stretch 2 (4 // 2 stretches away), 5-12 kept
    assert (swapped[0, :5] == rows[2, :5]).all() and (swapped[0, 5:] == rows[0, 5:]).all()
    # stretch 1, query 80: positions 0-16 from stretch 3, the last 64 (17-80) and on kept
    assert (swapped[3, :17] == rows[3, :17]).all() and (swapped[3, 17:] == rows[1, 17:]).all()


def test_the_position_split_adds_up_to_each_runs_archived_text_loss(tmp_path):
    """results/text_code_positions.json, weighted by the positions of each range, gives back
    the text loss the sweep archived for the same run (the same stretches and window), and
    TEXT_POSITIONS.md is made from that file."""
    result = json.loads(tp.RESULT.read_text())
    widths = [hi - lo for lo, hi in result["ranges"]]
    names = {"short": "short", "long": "long", "stochastic": "stoch"}
    checked = 0
    for fam, seeds in result["families"].items():
        for seed, s in seeds.items():
            for role, short_name in names.items():
                rec = HERE / "results" / "text_code" / f"{fam.lower()}-{short_name}"
                archived = json.loads((rec / f"seed{seed}.json").read_text())["text_val_loss"]
                mean = sum(w * x for w, x in zip(widths, s[role])) / sum(widths)
                assert mean == pytest.approx(archived, abs=1e-9)
                checked += 1
    assert checked >= 3
    path = tp.write_report(result, tmp_path)
    assert path.read_text() == (HERE / tp.REPORT).read_text()

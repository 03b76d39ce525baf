"""The text study (experiments/text_study): its readings and report from hand-made and committed
archives, the committed report in sync with the committed per-run files, the rule committed
before the first main-run result, and the reduced study end to end (slow tier)."""

import json
import math
import subprocess

import pytest

from experiments.tests.helpers import ROOT, run_study
from experiments.text_study import readings, report
from experiments.text_study.tests.test_rule import g

HERE = readings.HERE


def _record(seed, gain_mean, loss):
    row = {"key": "beyond_64", "gain": g(gain_mean, gain_mean - 0.01, gain_mean + 0.01)}
    return {"seed": seed, "copies": {"buckets": [row]}, "text_val_loss": loss}


def _git(*args):
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def test_the_quality_half_reads_the_seeds_that_have_all_three_runs():
    """A seed without its stochastic run counts for the laziness reading but not for the
    quality half, which says from how many seeds it was read; a short window better than the
    long one is pointed out (the rule's premise fails)."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(seeds=[0, 1, 2, 3])
    runs = {
        "s": [_record(k, 0.05, 1.10 + 0.001 * k) for k in range(3)],
        "l": [_record(k, 0.0, 1.20 + 0.002 * k) for k in range(3)],
        "t": [_record(k, 0.0, 1.15 + 0.003 * k) for k in range(2)],
    }
    roles = {"short": "s", "long": "l", "stochastic": "t"}
    res = readings.family_result(cfg, runs, roles)
    assert [p["seed"] for p in res["seeds"]] == [0, 1, 2]
    assert res["quality_seeds"] == 2 and sorted(res["loss"]) == [0, 1]
    # cost: short - long = -0.10 and -0.101 (hand values), below 0 in both seeds
    assert math.isclose(res["quality"]["cost"]["mean"], -0.1005, abs_tol=1e-9)
    text = "\n".join(report.family_section("pystdlib", "SX", cfg, runs, roles, 30.7))
    assert "(from 2 of 4 seeds; the rest not run yet)" in text
    assert "the premise of the quality half" in text
    assert "| 2 | 0.050 [0.040, 0.060]* |" in text and text.rstrip().endswith("| – | – | – |")


def test_the_summaries_carry_the_128_arm_by_its_own_reading():
    """REPORT.md's and the README's sentences give the W_long = 128 verdict beside the 64 one,
    read from the long-128 runs against the short ones over (128, 256]."""
    from types import SimpleNamespace

    def rec(seed, **gains):  # {range key: mean gain}, interval +- 0.001
        rows = [{"key": k, "gain": g(m, m - 0.001, m + 0.001)} for k, m in gains.items()]
        return {"seed": seed, "copies": {"buckets": rows}}

    cfg = SimpleNamespace(seeds=[0, 1])
    runs = {  # short copies in both ranges; long-64 as much beyond 64; long-128 none beyond 128
        "s": [rec(k, beyond_64=0.03, r128_256=0.01) for k in (0, 1)],
        "l": [rec(k, beyond_64=0.03) for k in (0, 1)],
        "l128": [rec(k, r128_256=0.0) for k in (0, 1)],
    }
    roles = {"short": "s", "long": "l", "long128": "l128"}
    res = readings.family_result(cfg, runs, roles)
    res["w128"] = readings.family_result(cfg, runs, roles, 128, "long128")
    assert res["verdict"] == "not lazy" and res["w128"]["verdict"] == "lazy"
    r = {
        "corpus": "pystdlib",
        "family": "SX",
        "tokens": 30.7,
        "map": "m",
        **res,
        "memory_half": "held",
    }
    assert "W_long = 128 against 8, **lazy** (2 of 2 seeds)" in readings.summary_lines([r])[0]
    del r["w128"]
    assert "128" not in readings.summary_lines([r])[0]


def test_a_family_whose_every_control_failed_names_each_attempt():
    """SX on KJV was tried at input-gate bias -4 and again at 0; the reason names both."""
    from swax.sweep import load_sweep

    ccfg = load_sweep(HERE / "text_controls.yaml")
    flat = {
        "key": "beyond_32",
        "gain": g(0.0, -0.001, 0.001),
        "probes": {"reset": g(0.0, 0.0, 0.0)},
    }
    rec = {"seed": 0, "copies": {"buckets": [flat]}, "summary": {"tokens": 16.4e6}}
    _, out = readings.control_table(ccfg, {"sx-kjv": [rec], "sx-kjv-b0": [rec], "sd-kjv": [rec]})
    sx, sd = out[("kjv", "SX")], out[("kjv", "SD")]
    assert not sx["passes"] and not sd["passes"]
    assert readings.failed(sx).startswith("its controls failed: sx-kjv (bias -4): gain beyond 32")
    assert "; sx-kjv-b0 (bias 0): gain beyond 32" in readings.failed(sx)
    assert readings.failed(sd).startswith("its control (sd-kjv) failed: gain beyond 32 0.000")


def test_the_appearances_are_paired_by_seed():
    from types import SimpleNamespace

    def curve(seed, first_above):  # above 0 from checkpoint index first_above on
        lows = [0.001 if i >= first_above else -0.001 for i in range(4)]
        pts = [
            {"tokens": 2e6 * (i + 1), "ci": {"beyond_64": [lo, 0.01]}} for i, lo in enumerate(lows)
        ]
        return {"seed": seed, "copy_curve": pts}

    cfg = SimpleNamespace(seeds=[0, 1, 2], families={"SX": {"short": "s", "long": "l"}})
    runs = {"s": [curve(0, 0), curve(1, 2)], "l": [curve(0, 9)]}
    text = "\n".join(report.paired_appearance(cfg, runs, lambda name: "beyond_64"))
    assert "| seed | short (s) | long (l) |" in text
    assert "| 0 | 2.0M | never |" in text and "| 1 | 6.0M |  |" in text
    assert "| 2 |" not in text  # no run of seed 2 yet


def test_the_prediction_is_printed_with_both_maps_once_the_clean_one_is_complete():
    def lazy(n, k):  # k lazy seeds of n
        return [{"kind": "lazy"}] * k + [{"kind": "memory"}] * (n - k)

    cfg = type("Cfg", (), {"base": {"seq_len": 256, "data": {"synthetic": {"fraction": 0.5}}}})
    cells = {(64, "0%"): lazy(5, 5), (64, "1%"): lazy(3, 0), (64, "2%"): lazy(3, 0)}
    shares = {
        ("pystdlib", "byte"): {
            "rows": [{"seq_len": 256, "windows": [{"window": 64, "share": 0.02}]}]
        }
    }
    old_only = readings.map_readings(("laziness.yaml", cfg, cells, None))
    assert len(old_only) == 1  # the clean map pending: the committed prediction alone
    maps = readings.map_readings((readings.L.CLEAN_MAP, cfg, cells, None))
    assert len(maps) == 2
    rho, lo, hi = maps[1]["rho"]
    assert rho == pytest.approx(0.005)  # 5/5 lazy at 0 %, 0/3 at 1 %: half-way
    assert 0 <= lo < rho < hi <= 0.02
    assert maps[1]["per"] == pytest.approx(0.5 / (0.5 + 0.5 * 256))
    preds = readings.map_predictions("pystdlib", "lazy", maps, shares)
    assert [p["primary"] for p in preds] == ["not lazy", "not lazy"]
    assert all(p["reading"] == "refuted (predicted not lazy)" for p in preds)
    assert "by the map the rule committed and by its rerun" in readings.prediction_summary(preds)
    # the two maps can disagree: a far share above the clean map's interval (its upper end is
    # below 2 %: the 1 % cell's 0 of 3 leaves little posterior above one half) and inside the
    # committed one's (0-1.25 %), read as the episodes' share
    assert hi < 0.0125
    mid = {
        ("pystdlib", "byte"): {
            "rows": [{"seq_len": 256, "windows": [{"window": 64, "share": (hi + 0.0125) / 2}]}]
        }
    }
    second = readings.map_predictions("pystdlib", "lazy", maps, mid)
    assert [p["secondary"] for p in second] == ["cannot predict", "not lazy"]
    lines = report.prediction_lines("pystdlib", preds)
    assert len(lines) == 2 and "Jeffreys posterior per cell" in lines[1]
    assert "2 % of its targets" in lines[0]
    # without the far-share result: the committed primary prediction only
    bare = readings.map_predictions("pystdlib", "partial", maps, {})
    assert len(bare) == 1 and bare[0]["reading"].startswith("neither")


def test_the_committed_report_is_made_from_the_committed_runs(tmp_path):
    path = report.write_report(tmp_path, f"{report.COMMAND} report")
    assert path.read_text() == (HERE / report.REPORT).read_text()


RULE = ("experiments/text_study/TEXT_RULE.md", "experiments/regime_study/TEXT_RULE.md")
"""TEXT_RULE.md now and before issue 61 moved the study into its own folder."""


def _results(archive: str) -> tuple[str, str]:
    """An archive's folder now and before the move."""
    return (
        f"experiments/text_study/results/{archive}",
        f"experiments/regime_study/results/{archive}",
    )


def test_the_rule_was_committed_before_the_first_main_run_result():
    first_rule = _git("log", "--format=%ct", "--reverse", "--", *RULE)
    if not first_rule:
        pytest.skip("no git history here (an exported tree)")
    rule_time = int(first_rule.split()[0])
    for archive in ("text_code", "text_kjv"):
        out = _git("log", "--format=%ct", "--reverse", "--", *_results(archive))
        for t in (out or "").split():
            assert int(t) >= rule_time, archive
    # the history holds the main runs (a check that the paths above find them)
    assert _git("log", "--format=%ct", "--", *_results("text_code")).split()


@pytest.mark.slow
def test_quick_text_study_runs_and_reports(tmp_path):
    """The study end to end in its reduced form (the CI smoke test): the controls and the
    pystdlib runs trained, probed and archived, and TEXT_STUDY.md written from the archives."""
    out = str(tmp_path / "r")
    r = run_study("experiments.text_study", "run", "--quick", "--report-dir", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "r" / "TEXT_STUDY.md").read_text()
    for control in ("sd-code", "sx-code"):
        assert f"| {control} | pystdlib |" in text
    ranges = ("(8, 32]", "(32, 64]", "(64, 128]", "(128, 256]", "(256, 1024]", "(32, T]", "(64, T]")
    for run in ("sx-short", "sx-long", "sx-stoch"):
        for rng in ranges:
            assert f"| {run} | 0 | {rng} | 8 (" in text, (run, rng)
        kept = tmp_path / "runs/text_code_quick/archive" / run / "seed0.json"
        assert kept.is_file(), run
    # the KJV sections read the controls the quick study did not run
    assert text.count("- control not run yet.") == 2
    assert "sx-short seed 0 (beyond_64):" in text  # the curve over the kept checkpoints
    # the position split and far-context probe of the quick runs (positions.py)
    args = ("run", "--quick", "--positions", "--samples", "4", "--report-dir", out)
    r = run_study("experiments.text_study", *args, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    split = json.loads((tmp_path / "r" / "text_code_positions.json").read_text())
    assert list(split["families"]["SX"]) == ["0"] and split["families"]["SD"] == {}
    positions = (tmp_path / "r" / "TEXT_POSITIONS.md").read_text()
    assert "## SX" in positions and "## SD" not in positions and "| 0 | " in positions

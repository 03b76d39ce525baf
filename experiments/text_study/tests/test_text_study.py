"""The text-only study's rule (experiments/regime_study/TEXT_RULE.md, applied by textstudy.py):
each branch of each verdict from hand-made inputs, the committed report in sync with the
committed per-run files, and the rule committed before the first main-run result."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from tests.experiments.regime import HERE, ROOT, script


@pytest.fixture(scope="module")
def ts():
    """The study's report (textstudy.py)."""
    return script("textstudy")


@pytest.fixture(scope="module")
def tr():
    """The study's rule (textrule.py)."""
    return script("textrule")


def g(mean, lo, hi):
    return {"mean": mean, "ci": [lo, hi], "n": 1000, "copies": lo > 0}


def test_a_control_passes_when_the_memory_copies_and_the_reset_removes_it(tr):
    def rec(gain, reset, far=None):
        rows = [{"key": "beyond_32", "gain": gain, "probes": {"reset": reset}}]
        if far:
            rows.append({"key": "r128_256", "gain": far})
        return {"copies": {"buckets": rows}}

    ok = tr.control_reading(rec(g(0.09, 0.07, 0.11), g(0.0, 0.0, 0.0), g(0.009, 0.006, 0.012)))
    assert ok["passes"] and ok["arm128"]
    assert not tr.control_reading(rec(g(0.09, 0.07, 0.11), g(0.0, 0.0, 0.0)))["arm128"]
    # an interval that reaches 0 is not a copy, whatever its mean
    weak = tr.control_reading(rec(g(0.03, -0.001, 0.06), g(0.0, 0.0, 0.0)))
    assert not weak["passes"] and "does not lie above 0" in weak["why"]
    # a gain the reset keeps is attention's, not the memory's
    att = tr.control_reading(rec(g(0.09, 0.07, 0.11), g(0.05, 0.03, 0.07)))
    assert not att["passes"] and "not the memory alone" in att["why"]
    # a small reset effect, below a quarter of the gain, still passes
    assert tr.control_reading(rec(g(0.09, 0.07, 0.11), g(0.01, 0.005, 0.015)))["passes"]


def test_one_seed_reads_lazy_between_not_lazy_or_no_reference(tr):
    short = g(0.04, 0.02, 0.06)
    assert tr.seed_reading(short, g(0.01, 0.0, 0.02)) == "lazy"  # 0.25x exactly
    assert tr.seed_reading(short, g(0.011, 0.0, 0.02)) == "between"
    assert tr.seed_reading(short, g(0.03, 0.0, 0.05)) == "not lazy"  # 0.75x exactly
    assert tr.seed_reading(short, g(-0.01, -0.02, 0.0)) == "lazy"
    assert tr.seed_reading(g(0.04, -0.01, 0.09), g(0.0, 0, 0)) == "no reference"
    assert tr.seed_reading(None, g(0.0, 0, 0)) == "no reference"


@pytest.mark.parametrize(
    "readings, planned, verdict",
    [
        (["lazy"] * 5, 5, "lazy"),
        (["lazy"] * 4 + ["between"], 5, "partial"),
        (["not lazy"] * 4 + ["lazy"], 5, "not lazy"),
        (["not lazy"] * 3 + ["between"] * 2, 5, "partial"),
        (["lazy"] * 3 + ["no reference"] * 2, 5, "cannot decide at this scale"),
        (["lazy"] * 4 + ["no reference"], 5, "partial"),  # 4 references, not 5 of 5 lazy
        (["lazy"] * 4, 5, "incomplete (4 of 5 seeds)"),
        (["lazy"] * 3, 3, "lazy"),
        (["not lazy"] * 2 + ["between"], 3, "partial"),
        (["not lazy"] * 2 + ["no reference"], 3, "cannot decide at this scale"),
    ],
)
def test_the_family_verdict(tr, readings, planned, verdict):
    assert tr.family_verdict(readings, planned) == verdict


def test_claim_3_memory_half(tr):
    assert tr.memory_half(["not lazy"] * 4 + ["lazy"], 5) == "held"
    assert tr.memory_half(["lazy"] * 5, 5) == "did not hold"
    assert tr.memory_half(["between"] * 5, 5) == "cannot be shown at this scale"
    assert tr.memory_half(["no reference"] * 2 + ["not lazy"] * 3, 5) == (
        "cannot be shown at this scale"
    )


def test_claim_3_quality_half(tr):
    long = [1.00, 1.02, 0.98, 1.01, 0.99]
    short = [x + 0.10 + e for x, e in zip(long, [0.01, -0.01, 0.0, 0.005, -0.005])]
    # the stochastic run within 0.01 of the long one: below half the cost (0.05)
    stoch = [x + 0.01 + e for x, e in zip(long, [0.002, -0.002, 0.001, 0.0, -0.001])]
    assert tr.quality_half(short, long, stoch)["verdict"] == "held"
    # as costly as the short window: above half the cost
    assert tr.quality_half(short, long, short)["verdict"] == "did not hold"
    # straddling half the cost
    wide = [x + d for x, d in zip(long, [0.0, 0.10, 0.02, 0.09, 0.04])]
    q = tr.quality_half(short, long, wide)
    assert q["diff"]["ci"][0] < 0.05 < q["diff"]["ci"][1]
    assert q["verdict"] == "cannot be shown at this scale"
    # no cost to recover: the short window is no worse than the long one within the noise
    flat = [x + d for x, d in zip(long, [0.02, -0.02, 0.01, -0.01, 0.0])]
    assert tr.quality_half(flat, long, stoch)["verdict"] == "not applicable"


def _record(seed, gain_mean, loss):
    row = {"key": "beyond_64", "gain": g(gain_mean, gain_mean - 0.01, gain_mean + 0.01)}
    return {"seed": seed, "copies": {"buckets": [row]}, "text_val_loss": loss}


def test_the_quality_half_reads_the_seeds_that_have_all_three_runs(ts):
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
    res = ts.family_result(cfg, runs, roles)
    assert [p["seed"] for p in res["seeds"]] == [0, 1, 2]
    assert res["quality_seeds"] == 2 and sorted(res["loss"]) == [0, 1]
    # cost: short - long = -0.10 and -0.101 (hand values), below 0 in both seeds
    assert math.isclose(res["quality"]["cost"]["mean"], -0.1005, abs_tol=1e-9)
    text = "\n".join(ts.family_section("pystdlib", "SX", cfg, runs, roles, 30.7))
    assert "(from 2 of 4 seeds; the rest not run yet)" in text
    assert "the premise of the quality half" in text
    assert "| 2 | 0.050 [0.040, 0.060]* |" in text and text.rstrip().endswith("| – | – | – |")


def test_the_summaries_carry_the_128_arm_by_its_own_reading(ts):
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
    res = ts.family_result(cfg, runs, roles)
    res["w128"] = ts.family_result(cfg, runs, roles, 128, "long128")
    assert res["verdict"] == "not lazy" and res["w128"]["verdict"] == "lazy"
    r = {
        "corpus": "pystdlib",
        "family": "SX",
        "tokens": 30.7,
        "map": "m",
        **res,
        "memory_half": "held",
    }
    assert (
        "SX on pystdlib not lazy in 2 paired seeds (at W_long = 128: lazy in 2 paired seeds)"
        in ts.readme_sentence([r])
    )
    assert "W_long = 128 against 8, **lazy** (2 of 2 seeds)" in ts.summary_lines([r])[0]
    del r["w128"]
    assert "128" not in ts.readme_sentence([r]).split("T = 256):")[1]


def test_a_family_whose_every_control_failed_names_each_attempt(ts):
    """SX on KJV was tried at input-gate bias -4 and again at 0; the reason names both."""
    from swax.sweep import load_sweep

    ccfg = load_sweep(HERE / "text_controls.yaml")
    flat = {
        "key": "beyond_32",
        "gain": g(0.0, -0.001, 0.001),
        "probes": {"reset": g(0.0, 0.0, 0.0)},
    }
    rec = {"seed": 0, "copies": {"buckets": [flat]}, "summary": {"tokens": 16.4e6}}
    _, out = ts.control_table(ccfg, {"sx-kjv": [rec], "sx-kjv-b0": [rec], "sd-kjv": [rec]})
    sx, sd = out[("kjv", "SX")], out[("kjv", "SD")]
    assert not sx["passes"] and not sd["passes"]
    assert ts.failed(sx).startswith("its controls failed: sx-kjv (bias -4): gain beyond 32")
    assert "; sx-kjv-b0 (bias 0): gain beyond 32" in ts.failed(sx)
    assert ts.failed(sd).startswith("its control (sd-kjv) failed: gain beyond 32 0.000")


def test_the_memory_appears_when_two_checkpoints_in_a_row_copy(tr):
    pts = [
        {"tokens": 2e6, "ci": {"k": [0.001, 0.01]}},
        {"tokens": 4e6, "ci": {"k": [-0.001, 0.01]}},
        {"tokens": 6e6, "ci": {"k": [0.002, 0.01]}},
        {"tokens": 8e6, "ci": {"k": [0.003, 0.01]}},
    ]
    assert tr.appeared_at(pts, "k") == pytest.approx(6.0)
    assert tr.appeared_at(pts[:3], "k") is None


def test_the_appearances_are_paired_by_seed(ts):
    from types import SimpleNamespace

    def curve(seed, first_above):  # above 0 from checkpoint index first_above on
        lows = [0.001 if i >= first_above else -0.001 for i in range(4)]
        pts = [
            {"tokens": 2e6 * (i + 1), "ci": {"beyond_64": [lo, 0.01]}} for i, lo in enumerate(lows)
        ]
        return {"seed": seed, "copy_curve": pts}

    cfg = SimpleNamespace(seeds=[0, 1, 2], families={"SX": {"short": "s", "long": "l"}})
    runs = {"s": [curve(0, 0), curve(1, 2)], "l": [curve(0, 9)]}
    text = "\n".join(ts.paired_appearance(cfg, runs, lambda name: "beyond_64"))
    assert "| seed | short (s) | long (l) |" in text
    assert "| 0 | 2.0M | never |" in text and "| 1 | 6.0M |  |" in text
    assert "| 2 |" not in text  # no run of seed 2 yet


def test_the_maps_prediction_is_read_against_the_verdict(tr):
    assert tr.map_prediction("not lazy").startswith("confirmed")
    assert tr.map_prediction("lazy").startswith("refuted")
    assert tr.map_prediction("partial").startswith("neither")
    # the committed constants are TEXT_RULE.md's
    rule = (HERE / "TEXT_RULE.md").read_text()
    lo, hi = tr.RHO_STAR[1:]
    assert f"0.25 % of the episodes (95 % bootstrap interval\n{100 * lo:g}–{100 * hi:g} %)" in rule
    assert "0.0085 %" in rule and math.isclose(tr.RHO_STAR[0] * tr.ANSWERS_OF_TARGETS, 8.5e-5)


def test_a_maps_prediction_is_its_interval_against_the_far_share(tr):
    rho, per = (0.004, 0.001, 0.01), 0.05  # rho* 0.4 % [0.1, 1] % of the episodes, 5 % answers
    # primary reading, on the targets' scale: the interval is [0.005, 0.05] % of the targets
    assert tr.predict(0.0006, rho, per) == "not lazy"
    assert tr.predict(0.00004, rho, per) == "lazy"
    assert tr.predict(0.0003, rho, per) == "cannot predict"
    # secondary reading: the text's share read as the episodes' share
    assert tr.predict(0.0006, rho, 1.0) == "lazy" and tr.predict(0.02, rho, 1.0) == "not lazy"
    assert tr.map_prediction("lazy", "lazy").startswith("confirmed")
    assert tr.map_prediction("not lazy", "lazy") == "refuted (predicted lazy)"
    assert "cannot predict" in tr.map_prediction("lazy", "cannot predict")
    # the committed constants give the committed section 6: both corpora above the interval per
    # target; on the secondary reading pystdlib (1.28 %) above it, KJV (0.30 %) inside it
    assert tr.predict(0.0128, tr.RHO_STAR, tr.ANSWERS_OF_TARGETS) == "not lazy"
    assert tr.predict(0.0030, tr.RHO_STAR, tr.ANSWERS_OF_TARGETS) == "not lazy"
    assert tr.predict(0.0128, tr.RHO_STAR, 1.0) == "not lazy"
    assert tr.predict(0.0030, tr.RHO_STAR, 1.0) == "cannot predict"


def test_the_prediction_is_printed_with_both_maps_once_the_clean_one_is_complete(ts):
    def lazy(n, k):  # k lazy seeds of n
        return [{"kind": "lazy"}] * k + [{"kind": "memory"}] * (n - k)

    cfg = type("Cfg", (), {"base": {"seq_len": 256, "data": {"synthetic": {"fraction": 0.5}}}})
    cells = {(64, "0%"): lazy(5, 5), (64, "1%"): lazy(3, 0), (64, "2%"): lazy(3, 0)}
    shares = {
        ("pystdlib", "byte"): {
            "rows": [{"seq_len": 256, "windows": [{"window": 64, "share": 0.02}]}]
        }
    }
    old_only = ts.map_readings(("laziness.yaml", cfg, cells, None))
    assert len(old_only) == 1  # the clean map pending: the committed prediction alone
    maps = ts.map_readings((ts.L.CLEAN_MAP, cfg, cells, None))
    assert len(maps) == 2
    rho, lo, hi = maps[1]["rho"]
    assert rho == pytest.approx(0.005)  # 5/5 lazy at 0 %, 0/3 at 1 %: half-way
    assert 0 <= lo < rho < hi <= 0.02
    assert maps[1]["per"] == pytest.approx(0.5 / (0.5 + 0.5 * 256))
    preds = ts.map_predictions("pystdlib", "lazy", maps, shares)
    assert [p["primary"] for p in preds] == ["not lazy", "not lazy"]
    assert all(p["reading"] == "refuted (predicted not lazy)" for p in preds)
    assert "by the map the rule committed and by its rerun" in ts.prediction_summary(preds)
    # the two maps can disagree: a far share above the clean map's interval (its upper end is
    # below 2 %: the 1 % cell's 0 of 3 leaves little posterior above one half) and inside the
    # committed one's (0-1.25 %), read as the episodes' share
    assert hi < 0.0125
    mid = {
        ("pystdlib", "byte"): {
            "rows": [{"seq_len": 256, "windows": [{"window": 64, "share": (hi + 0.0125) / 2}]}]
        }
    }
    second = ts.map_predictions("pystdlib", "lazy", maps, mid)
    assert [p["secondary"] for p in second] == ["cannot predict", "not lazy"]
    lines = ts.prediction_lines("pystdlib", preds)
    assert len(lines) == 2 and "Jeffreys posterior per cell" in lines[1]
    assert "2 % of its targets" in lines[0]
    # without the far-share result: the committed primary prediction only
    bare = ts.map_predictions("pystdlib", "partial", maps, {})
    assert len(bare) == 1 and bare[0]["reading"].startswith("neither")


def test_the_committed_report_is_made_from_the_committed_runs(ts, tmp_path):
    path = ts.write_report(tmp_path, "python experiments/regime_study/textstudy.py")
    assert path.read_text() == (HERE / ts.REPORT).read_text()


def _git(*args):
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def test_the_rule_was_committed_before_the_first_main_run_result():
    first_rule = _git(
        "log", "--format=%ct", "--reverse", "--", "experiments/regime_study/TEXT_RULE.md"
    )
    if not first_rule:
        pytest.skip("no git history here (an exported tree)")
    rule_time = int(first_rule.split()[0])
    for archive in ("text_code", "text_kjv"):
        out = _git(
            "log", "--format=%ct", "--reverse", "--", f"experiments/regime_study/results/{archive}"
        )
        for t in (out or "").split():
            assert int(t) >= rule_time, archive


@pytest.mark.slow
def test_quick_text_study_runs_and_reports(tmp_path):
    """The study end to end in its reduced form (the CI smoke test): the controls and the
    pystdlib runs trained, probed and archived, and TEXT_STUDY.md written from the archives."""
    cmd = [
        sys.executable,
        str(HERE / "textstudy.py"),
        "--quick",
        "--run",
        "--report-dir",
        str(tmp_path / "r"),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = (tmp_path / "r" / "TEXT_STUDY.md").read_text()
    for control in ("sd-code", "sx-code"):
        assert f"| {control} | pystdlib |" in report
    ranges = ("(8, 32]", "(32, 64]", "(64, 128]", "(128, 256]", "(256, 1024]", "(32, T]", "(64, T]")
    for run in ("sx-short", "sx-long", "sx-stoch"):
        for rng in ranges:
            assert f"| {run} | 0 | {rng} | 8 (" in report, (run, rng)
        kept = tmp_path / "runs/text_code_quick/archive" / run / "seed0.json"
        assert kept.is_file(), run
    # the KJV sections read the controls the quick study did not run
    assert report.count("- control not run yet.") == 2
    assert "sx-short seed 0 (beyond_64):" in report  # the curve over the kept checkpoints
    # the position split and far-context probe of the quick runs (textpositions.py)
    cmd = [
        sys.executable,
        str(HERE / "textpositions.py"),
        "--quick",
        "--run",
        "--samples",
        "4",
        "--report-dir",
        str(tmp_path / "r"),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    split = json.loads((tmp_path / "r" / "text_code_positions.json").read_text())
    assert list(split["families"]["SX"]) == ["0"] and split["families"]["SD"] == {}
    positions = (tmp_path / "r" / "TEXT_POSITIONS.md").read_text()
    assert "## SX" in positions and "## SD" not in positions and "| 0 | " in positions


def test_position_ranges_average_the_right_queries():
    tp = script("textpositions")
    losses = np.arange(2 * 10, dtype=float).reshape(2, 10)  # stretch s, position t: 10 s + t
    got = tp.range_means(losses, ((0, 2), (2, 5), (5, 10)))
    assert got.tolist() == [[0.5, 3.0, 7.0], [10.5, 13.0, 17.0]]
    d = tp.paired_stretches(np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0, 0.0]))
    t2 = 4.3027  # Student t, 97.5 % quantile, 2 degrees of freedom (tables)
    assert d["mean"] == 2.0 and d["ci"] == pytest.approx([2 - t2 / 3**0.5, 2 + t2 / 3**0.5], 1e-4)


def test_the_far_context_swap_keeps_the_last_8_or_64_tokens():
    tp = script("textpositions")
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
    tp = script("textpositions")
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

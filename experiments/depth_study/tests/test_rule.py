"""RULE.md's branches on hand-made results (each reading and verdict can come out either way),
the history (the rule committed before the first main-run result) and the report's sync with
the committed per-run files."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from experiments.depth_study import rule as R
from experiments.depth_study.__main__ import STUDY
from experiments.lab.cli import ROOT, check


def g(mean, lo, hi, n=1000):
    return {"mean": mean, "ci": [lo, hi], "n": n}


def rec(ranges: dict, passkey: dict | None = None, loss: float = 1.0, probes=None) -> dict:
    """A run's result: {range key: E} (G = E, placebo 0), passkey {distance: (k, n, ctrl k)}."""
    buckets = []
    for key, e in ranges.items():
        b = {"key": key, "gain": e, "excess": e, "n": e["n"]}
        if probes and key in probes:
            b["probes"] = probes[key]
        buckets.append(b)
    rows = [
        {"distance": d, "retrieved": k / n, "n": n, "control_retrieved": c / n}
        for d, (k, n, c) in (passkey or {}).items()
    ]
    return {"copies": {"buckets": buckets}, "passkey": {"rows": rows}, "text_val_loss": loss}


FAR = {d: (150, 200, 0) for d in R.FAR_DISTANCES}
NONE = {d: (0, 200, 0) for d in R.FAR_DISTANCES}
MEM = g(0.05, 0.03, 0.07)


def test_counts_needs_the_lower_bound_and_the_minimum_effect():
    assert R.counts(g(0.02, 0.001, 0.04))
    assert not R.counts(g(0.02, -0.001, 0.04))  # interval reaches 0
    assert not R.counts(g(0.009, 0.001, 0.02))  # below delta = 0.01
    assert not R.counts(None) and not R.counts(g(0.5, 0.4, 0.6, n=0))


def test_claim2_seed_readings():
    short = rec({R.MEMORY: MEM})
    lazy = R.claim2_seed(short, rec({R.MEMORY: g(0.005, -0.001, 0.01)}))
    assert lazy["reference"] and lazy["primary"] == "lazy" and lazy["secondary"] == "lazy"
    not_lazy = R.claim2_seed(short, rec({R.MEMORY: g(0.045, 0.03, 0.06)}))
    assert not_lazy["primary"] == "not lazy" and not_lazy["secondary"] == "not lazy"
    # overlapping intervals: the primary reading cannot tell, the secondary's ratio 0.5 neither
    mid = R.claim2_seed(short, rec({R.MEMORY: g(0.025, 0.005, 0.045)}))
    assert mid["primary"] == "unclear" and mid["secondary"] == "unclear"
    # point estimates say lazy (ratio 0.2) where the intervals overlap: only the secondary
    fragile = R.claim2_seed(short, rec({R.MEMORY: g(0.01, -0.02, 0.04)}))
    assert fragile["primary"] == "unclear" and fragile["secondary"] == "lazy"
    none = R.claim2_seed(rec({R.MEMORY: g(0.05, -0.01, 0.1)}), rec({R.MEMORY: MEM}))
    assert not none["reference"] and none["primary"] == "no reference"
    # tight intervals apart, but the long run keeps 80 % of the memory: not lazy, never both
    tight = R.claim2_seed(
        rec({R.MEMORY: g(0.10, 0.095, 0.105)}), rec({R.MEMORY: g(0.08, 0.075, 0.085)})
    )
    assert tight["primary"] == "not lazy"
    gone = R.claim2_seed(short, rec({}))
    assert gone["reference"] and gone["primary"] == "no long result"


def _c2(readings: list[str]) -> list[dict]:
    return [{"reference": r != "no reference", "primary": r} for r in readings]


@pytest.mark.parametrize(
    "readings,planned,verdict",
    [
        (["lazy"] * 5, 5, "held"),
        (["lazy"] * 4 + ["unclear"], 5, "held"),
        (["lazy"] * 4 + ["not lazy"], 5, "partial"),  # one pair not lazy: no verdict of lazy
        (["not lazy"] * 4 + ["lazy"], 5, "did not hold"),
        (["lazy", "lazy", "unclear", "unclear", "not lazy"], 5, "partial"),
        (
            ["lazy"] * 3 + ["no reference"] * 2,
            5,
            "cannot decide at this scale (too few pairs have a reference)",
        ),
        (["lazy"] * 3, 3, "held"),
        (["lazy", "lazy", "unclear"], 3, "partial"),
        (["lazy"] * 4, 5, "incomplete, 4 of 5 seeds"),
    ],
)
def test_claim2_verdicts(readings, planned, verdict):
    assert R.claim2_verdict(_c2(readings), planned, True) == verdict


def test_a_failed_control_means_cannot_decide():
    assert R.claim2_verdict(_c2(["lazy"] * 5), 5, False).startswith("cannot decide")
    assert R.claim1_verdict([], 5, False).startswith("cannot decide")


def test_claim1_seed_and_verdict():
    long = rec({R.MEMORY: MEM}, NONE)
    holds = R.claim1_seed(rec({R.MEMORY: MEM, R.BEYOND_T: g(0.02, 0.01, 0.03)}, FAR), long)
    assert holds["memory"] and holds["copies_beyond_T"] and holds["retrieves"] and holds["holds"]
    # copies beyond T but retrieves no passkey: neither holds nor fails
    half = R.claim1_seed(rec({R.MEMORY: MEM, R.BEYOND_T: g(0.02, 0.01, 0.03)}, NONE), long)
    assert not half["holds"] and not half["fails"]
    flat = rec({R.MEMORY: MEM, R.BEYOND_T: g(0.0, -0.002, 0.002)}, NONE)
    # without a passkey gain the seed cannot fail (missing is not a failure) ...
    assert not R.claim1_seed(flat, long)["fails"]
    for r in flat["passkey"]["rows"]:
        r["gain"] = g(0.0, -0.005, 0.005, n=200)
    fails = R.claim1_seed(flat, long)  # ... with a flat one it does
    assert fails["fails"] and not fails["holds"]
    # the long run retrieving as well: no advantage, claim 1 does not hold in the seed
    same = R.claim1_seed(
        rec({R.MEMORY: MEM, R.BEYOND_T: g(0.02, 0.01, 0.03)}, FAR), rec({R.MEMORY: MEM}, FAR)
    )
    assert not same["retrieves"]
    assert R.claim1_verdict([holds] * 4 + [half], 5, True) == "held"
    assert R.claim1_verdict([fails] * 4 + [holds], 5, True) == "did not hold"
    assert R.claim1_verdict([holds] * 2 + [fails] * 2 + [half], 5, True) == "partial"
    nomem = R.claim1_seed(rec({R.MEMORY: g(0.0, -0.1, 0.1)}, FAR), long)
    assert R.claim1_verdict([nomem] * 2 + [holds] * 3, 5, True).startswith("cannot decide")


def test_claim1_by_the_passkey_gain_when_no_key_comes_back_whole():
    def with_gain(mean, lo, hi):
        r = rec({R.MEMORY: MEM, R.BEYOND_T: g(0.02, 0.01, 0.03)}, NONE)
        for row in r["passkey"]["rows"]:
            row["gain"] = g(mean, lo, hi, n=200)
        return r

    long = with_gain(0.0, -0.01, 0.01)
    seed = R.claim1_seed(with_gain(0.3, 0.2, 0.4), long)
    assert seed["retrieves"] and seed["holds"]
    # pooled over four distances: the interval narrows by half (four equal intervals)
    assert seed["key_gain"]["ci"][1] - seed["key_gain"]["ci"][0] == pytest.approx(0.1)
    assert not R.claim1_seed(with_gain(0.3, 0.2, 0.4), with_gain(0.3, 0.2, 0.4))["retrieves"]
    assert not R.claim1_seed(with_gain(0.005, 0.001, 0.009), long)["retrieves"]  # below delta


def test_five_points_exactly_counts():
    """41 of 800 against 1 of 800 is 5 points above: a float subtraction makes it 4.99..."""
    assert 41 / 800 - 1 / 800 < R.POINTS  # the rounding the rule must not be lost to
    short_rows = {2048: (11, 200, 0), 4096: (10, 200, 0), 8192: (10, 200, 0), 16384: (10, 200, 0)}
    long_rows = {2048: (1, 200, 0), 4096: (0, 200, 0), 8192: (0, 200, 0), 16384: (0, 200, 0)}
    short = rec({R.MEMORY: MEM, R.BEYOND_T: g(0.02, 0.01, 0.03)}, short_rows)
    seed = R.claim1_seed(short, rec({R.MEMORY: MEM}, long_rows))
    assert seed["retrieves"] and seed["holds"]
    long_rows[4096] = (1, 200, 0)  # 39 of 800 apart: 4.9 points, not enough
    assert not R.claim1_seed(short, rec({R.MEMORY: MEM}, long_rows))["retrieves"]


def test_a_short_run_without_its_long_pair_is_printed_not_judged():
    from experiments.depth_study import report as P

    short = rec({R.MEMORY: MEM, R.BEYOND_T: g(0.02, 0.01, 0.03)}, FAR)
    ctl = {"SX": {"passes": True}, "attention": {"passes": True}}
    f = P.family("SX", {"sx-short": {0: short, 1: short}, "sx-long": {1: short}}, 5, ctl)
    assert [x["seed"] for x in f["c1"]] == [1] and [x["seed"] for x in f["alone"]] == [0]
    assert f["v1"].startswith("incomplete, 1 of 5")
    rows = [r for r in P.seed_tables("SX", f) if r.startswith("| 0 ")]
    assert len(rows) == 1 and "pending (no long run yet)" in rows[0]
    assert "+0.0200 [+0.0100, +0.0300] n 1000" in rows[0]  # its E over (T, 4T], with its count
    # the paired seed copies beyond T but retrieves no key: the cell says which part is missing
    paired = [r for r in P.seed_tables("SX", f) if r.startswith("| 1 ")]
    assert "| neither (copies beyond T yes, retrieves no) |" in paired[0]


def test_the_readme_row_counts_the_lazy_pairs_and_the_mechanism():
    from experiments.depth_study import report as P

    short = rec({R.MEMORY: MEM, R.INSIDE: g(0.2, 0.15, 0.25)}, NONE)
    seen = {R.INSIDE: {"reset": g(0.25, 0.2, 0.3), "window_cut": g(0.02, 0.0, 0.05)}}
    busy = {R.INSIDE: {"reset": g(0.25, 0.2, 0.3), "window_cut": g(0.2, 0.14, 0.26)}}
    lazy = rec({R.MEMORY: g(0.005, -0.001, 0.01), R.INSIDE: g(0.3, 0.25, 0.35)}, NONE, probes=seen)
    busy_long = rec({R.MEMORY: g(0.045, 0.03, 0.06), R.INSIDE: g(0.3, 0.25, 0.35)}, probes=busy)
    ctl = {"SX": {"passes": True}, "attention": {"passes": True}}
    runs = {"sx-short": {0: short, 1: short, 2: short}, "sx-long": {0: lazy, 1: busy_long}}
    row = P.summary_row("SX", P.family("SX", runs, 5, ctl))
    assert row[0] == "SX" and "(holds in 0 of 2 seeds)" in row[1]
    assert row[2].endswith("(lazy in 1 of 2; mechanism seen in 1)")
    assert row[3] == row[4] == "pending (no runs yet)"  # no stochastic run yet
    empty = P.summary_row("SD", P.family("SD", {}, 3, ctl))
    assert "lazy in" not in empty[2] and empty[3] == "– (no stochastic arm)"


def test_the_key_gain_table_averages_seeds_and_prints_a_probe_where_it_differs():
    from experiments.depth_study import curves as P

    def run(gains, reset=None):
        rows = []
        for d, m in gains.items():
            r = {"distance": d, "gain": g(m, m - 0.01, m + 0.01, 200)}
            if reset is not None and d <= 128:
                r["probes"] = {"reset": {"gain": g(reset, 0, 0, 200)}, "window_cut": r}
            rows.append(r)
        return {"passkey": {"rows": rows}}

    runs = {
        "a": {0: run({32: 0.2, 2048: 0.0}, reset=0.0), 1: run({32: 0.4, 2048: 0.002}, reset=0.0)},
        "b": {0: run({32: 0.5})},
    }
    lines = P.key_gain_table(runs, ["a", "b", "none"])
    assert lines[0] == "| run | 32 | 2048 |"
    assert lines[2] == "| a | +0.3000 | +0.0010 |"  # the mean of the two seeds
    # the reset differs from the run's own reading: printed; the cut equals it: not
    assert lines[3] == "| a: memory reset | +0.0000 | – |"
    assert lines[4] == "| b | +0.5000 | – |" and len(lines) == 5


def test_pooled_passkey_and_its_wilson_interval():
    p = R.pooled(rec({}, {2048: (10, 200, 0), 4096: (30, 200, 1), 64: (200, 200, 0)}), (2048, 4096))
    assert (p["k"], p["n"]) == (40, 400) and p["share"] == pytest.approx(0.1)
    z2 = 1.959964**2
    mid = (0.1 + z2 / 800) / (1 + z2 / 400)
    assert sum(p["ci"]) / 2 == pytest.approx(mid)
    assert R.pooled(rec({}, {2048: (10, 200, 3)}), (2048,), control=True)["k"] == 3


def test_mechanism_needs_attention_copying_and_an_idle_memory():
    short = rec({R.INSIDE: g(0.2, 0.15, 0.25)})
    probes = {R.INSIDE: {"reset": g(0.25, 0.2, 0.3), "window_cut": g(0.02, 0.0, 0.05)}}
    long = rec({R.INSIDE: g(0.3, 0.25, 0.35)}, probes=probes)
    m = R.mechanism_seed(short, long)
    assert m["attention_copies"] and m["memory_idles"] and m["seen"]
    busy = {R.INSIDE: {"reset": g(0.25, 0.2, 0.3), "window_cut": g(0.2, 0.14, 0.26)}}
    assert not R.mechanism_seed(short, rec({R.INSIDE: g(0.3, 0.25, 0.35)}, probes=busy))["seen"]
    weak = {R.INSIDE: {"reset": g(0.1, 0.05, 0.15), "window_cut": g(0.02, 0.0, 0.05)}}
    m = R.mechanism_seed(short, rec({R.INSIDE: g(0.3, 0.25, 0.35)}, probes=weak))
    assert not m["attention_copies"] and not m["seen"]  # attention carries a third only


def test_claim3_halves():
    short = rec({R.MEMORY: MEM})
    keeps = R.claim3_seed(short, rec({R.MEMORY: g(0.045, 0.03, 0.06)}))
    loses = R.claim3_seed(short, rec({R.MEMORY: g(0.0, -0.01, 0.01)}))
    assert keeps["reading"] == "keeps" and loses["reading"] == "loses"
    assert R.memory_half([keeps] * 4 + [loses], 5) == "held"
    assert R.memory_half([loses] * 4 + [keeps], 5) == "did not hold"
    assert R.memory_half([keeps] * 3 + [loses] * 2, 5) == "cannot be shown at this scale"
    # quality: short costs c = 0.1 over long; stoch within 0.01 of long: held
    s, lg = [1.1, 1.2, 1.15, 1.12, 1.18], [1.0, 1.1, 1.05, 1.02, 1.08]
    assert R.quality_half(s, lg, [x + 0.01 for x in lg])["verdict"] == "held"
    assert R.quality_half(s, lg, [x + 0.09 for x in lg])["verdict"] == "did not hold"
    wobbly = [x + d for x, d in zip(lg, (0.0, 0.1, 0.02, 0.09, 0.05))]
    assert R.quality_half(s, lg, wobbly)["verdict"] == "cannot be shown at this scale"
    # the short window's loss lower than the long one's: nothing to resolve
    assert R.quality_half(lg, s, s)["verdict"].startswith("not applicable")
    # a verdict waits for the planned seeds, and a failed memory control decides nothing
    assert R.quality_half(s[:3], lg[:3], lg[:3], planned=5)["verdict"] == "incomplete, 3 of 5 seeds"
    assert R.quality_half(s, lg, lg, planned=5, control_ok=False)["verdict"].startswith("cannot")
    assert R.memory_half([keeps] * 5, 5, control_ok=False).startswith("cannot decide")


def test_the_reference_counts_only_where_it_matches_the_short_run():
    near = {k: g(0.1, 0.08, 0.12) for k in R.REFERENCE_RANGES}
    short = rec({**near, R.BEYOND_T: g(0.0, -0.01, 0.01)})
    ref = rec({**near, R.BEYOND_T: g(0.05, 0.03, 0.07)})
    r = R.reference_reading(ref, short)
    assert r["counts"] and r["E_far_ref"]["mean"] == 0.05 and r["E_far_short"]["mean"] == 0.0
    off = rec({**near, "r32_128": g(0.2, 0.15, 0.25)})  # one range outside the short run's
    assert not R.reference_reading(off, short)["counts"]
    assert not R.reference_reading(ref, None)["counts"]


def test_a_learning_rate_changes_a_reading_or_the_gap_sign():
    short = rec({R.MEMORY: MEM}, loss=1.0)
    lazy = R.lr_reading(short, rec({R.MEMORY: g(0.005, -0.001, 0.01)}, loss=1.1))
    assert lazy["primary"] == "lazy" and lazy["gap"] == pytest.approx(-0.1)
    also = R.lr_reading(short, rec({R.MEMORY: g(0.004, -0.001, 0.01)}, loss=1.05))
    assert not R.hinges([lazy, also])
    flipped = R.lr_reading(short, rec({R.MEMORY: g(0.004, -0.001, 0.01)}, loss=0.9))
    assert R.hinges([lazy, flipped])  # the sign of the gap
    busy = R.lr_reading(short, rec({R.MEMORY: g(0.045, 0.03, 0.06)}, loss=1.1))
    assert R.hinges([lazy, busy])  # the reading


def test_the_curve_reading_needs_the_lower_bound_to_stay_above_0():
    def curve(los):
        pts = [
            {"step": 960 * (i + 1), "ci": {R.MEMORY: [lo, lo + 0.02]}} for i, lo in enumerate(los)
        ]
        return {"copy_curve": pts}

    assert R.lasting_from(curve([-0.01, 0.001, 0.002, 0.01])) == 1920
    assert R.lasting_from(curve([0.01, -0.001, 0.002, 0.01])) == 2880  # fell below 0 once
    assert R.lasting_from(curve([0.01, 0.02, -0.01])) is None
    assert R.lasting_from({}) is None


def test_controls():
    probes = {"beyond_128": {"reset": g(0.001, -0.002, 0.004)}}
    ok = rec({"beyond_128": g(0.04, 0.02, 0.06)}, probes=probes)
    assert R.memory_control(ok)["passes"]
    leaky = rec(
        {"beyond_128": g(0.04, 0.02, 0.06)}, probes={"beyond_128": {"reset": g(0.03, 0.02, 0.04)}}
    )
    assert not R.memory_control(leaky)["passes"]
    assert not R.memory_control(None)["passes"]
    near = {d: (60, 200, 0) for d in R.NEAR_DISTANCES}
    assert R.attention_control(rec({R.INSIDE: g(0.2, 0.1, 0.3)}, near))["passes"]
    blind = {d: (2, 200, 0) for d in R.NEAR_DISTANCES}
    assert not R.attention_control(rec({R.INSIDE: g(0.2, 0.1, 0.3)}, blind))["passes"]


def test_sign_test():
    assert R.sign_p(5, 5) == pytest.approx(1 / 32)
    assert R.sign_p(4, 5) == pytest.approx(6 / 32)
    assert R.sign_p(3, 3) == pytest.approx(1 / 8)
    assert math.isnan(R.sign_p(0, 0))


# ------------------------------------------------------------------------------ history and sync


def _git(*args):
    r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def test_the_rule_was_committed_after_the_controls_and_before_any_main_result():
    here = "experiments/depth_study"
    first_rule = _git("log", "--format=%ct", "--reverse", "--", f"{here}/RULE.md")
    if not first_rule:
        pytest.skip("no git history here (an exported tree)")
    rule_time = int(first_rule.split()[0])
    for config in ("sx", "sd", "lr", "reference"):
        out = _git("log", "--format=%ct", "--", f"{here}/results/{config}")
        assert all(int(t) >= rule_time for t in (out or "").split()), config
    controls = _git("log", "--format=%ct", "--", f"{here}/results/controls")
    assert controls and all(int(t) <= rule_time for t in controls.split())


def test_the_committed_report_is_made_from_the_committed_results():
    assert check(STUDY) == []


@pytest.mark.slow
def test_quick_depth_study_under_a_minute(tmp_path):
    """The study end to end, reduced: the SX runs trained, probed (copies with the placebo and
    the past-T split, the passkey), archived, and REPORT.md written from the archives."""
    cmd = [
        sys.executable,
        "-m",
        "experiments.depth_study",
        "run",
        "--quick",
        "--report-dir",
        str(tmp_path / "r"),
    ]
    env = {"SWAX_THREADS": "1"}

    r = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "r" / "REPORT.md").read_text()
    for run in ("sx-short", "sx-long", "sx-stoch"):
        assert f"| {run} | 1 |" in text, run
    assert "(8, 32] past T" in text and "## Passkey retrieved" in text


def test_the_loss_table_reads_each_window_and_pairs_seeds_against_the_long_run():
    from experiments.depth_study import curves as P

    def run(own, at: dict):
        keys = {8: "train", 128: "long"}
        return {
            "text_val_loss": own,
            "text_loss": {keys[w]: v for w, v in at.items()},
            "windows": {keys[w]: w for w in at},
        }

    runs = {
        "sx-short": {0: run(1.0, {8: 1.0, 128: 3.0}), 1: run(1.2, {8: 1.2, 128: 4.0})},
        "sx-long": {0: run(0.9, {128: 0.9}), 1: run(1.0, {128: 1.0})},
        "sx-stoch": {1: run(0.95, {8: 0.99, 128: 0.95})},
    }
    lines = P.loss_table(runs, ["sx-short", "sx-long", "sx-stoch", "none"])
    short = "1.1000 (1.000…1.200)"
    assert lines[2] == f"| sx-short | 2 | {short} | {short} | 3.5000 (3.000…4.000) |"
    assert lines[3] == "| sx-long | 2 | 0.9500 (0.900…1.000) | – | 0.9500 (0.900…1.000) |"
    assert len(lines) == 5
    gaps = P.loss_gaps(runs, "SX")
    assert gaps == [["SX", "0", "+0.1000", "–"], ["SX", "1", "+0.2000", "-0.0500"]]


def test_the_key_gain_ceiling_is_the_lowest_to_highest_control_loss():
    from experiments.depth_study import curves as P

    def run(*nll):
        return {"passkey": {"rows": [{"distance": 32, "control_nll": x} for x in nll]}}

    assert P.control_losses({"a": {0: run(3.6, 3.9)}, "b": {1: run(3.5)}, "c": {}}) == (3.5, 3.9)
    assert P.control_losses({"a": {0: {"passkey": {"rows": []}}}}) is None


def test_beside_the_2_layer_study_a_change_needs_two_verdicts():
    from experiments.depth_study import beside as B

    assert B._changed("incomplete, 1 of 5 seeds", "lazy") == "not yet"
    assert B._changed("cannot decide at this scale (a control failed)", "lazy").startswith("no ")
    assert B._changed("held", "lazy") == "no (both held)"  # the 2-layer 'lazy' is 'held' here
    assert B._changed("partial", "lazy") == "yes: held → partial"
    assert B._changed("held", None) == "– (no 2-layer verdict)"


def test_beside_rows_count_the_2_layer_seeds_and_move_the_quality_premise():
    from experiments.depth_study import beside as B

    f = {
        "seeds": [0, 1],
        "c1": [{"holds": False}, {"holds": True}],
        "c2": [{"primary": "lazy"}, {"primary": "unclear"}],
        "mech": [{"seen": True}, {"seen": False}],
        "v1": "partial",
        "v2": "held",
        "gaps": [{"seed": 0, "gap": 0.02}, {"seed": 1, "gap": -0.01}],
    }
    text = {
        "verdict": "partial",
        "seeds": [{"reading": "lazy"}] * 3 + [{"reading": "not lazy"}],
        "memory_half": "held",
        "quality": {"verdict": "cannot be shown at this scale"},
        "loss": {0: [1.0, 1.1, 1.05], 1: [1.2, 1.1, 1.1], 2: [1.0, 1.3, 1.2]},
    }
    c1, c2, c3m, c3q = B.rows_for("SD", f, text)
    assert c1[4] == "partial (holds in 1 of 2)"
    assert c2[3] == "W 64: partial (lazy in 3 of 4)"
    assert c2[4] == "held (lazy in 1 of 2; mechanism seen in 1)" and c2[5] == "yes: partial → held"
    assert c3m[3] == "held" and c3m[4] == "– (no stochastic arm)"
    assert "short − long > 0 in 1 of 3 seeds (mean -0.1000)" in c3q[3]
    assert "short − long > 0 in 1 of 2 seeds (mean +0.0050)" in c3q[4]
    assert c3q[5] == "–; short − long > 0: 1 of 3 → 1 of 2 seeds"

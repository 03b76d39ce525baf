"""The text study's rule (experiments/text_study/TEXT_RULE.md, as functions in rule.py): each
branch of each verdict from hand-made inputs."""

import math
from pathlib import Path

import pytest

from experiments.text_study import rule as R

HERE = Path(__file__).resolve().parents[1]


def g(mean, lo, hi):
    return {"mean": mean, "ci": [lo, hi], "n": 1000, "copies": lo > 0}


def test_a_control_passes_when_the_memory_copies_and_the_reset_removes_it():
    def rec(gain, reset, far=None):
        rows = [{"key": "beyond_32", "gain": gain, "probes": {"reset": reset}}]
        if far:
            rows.append({"key": "r128_256", "gain": far})
        return {"copies": {"buckets": rows}}

    ok = R.control_reading(rec(g(0.09, 0.07, 0.11), g(0.0, 0.0, 0.0), g(0.009, 0.006, 0.012)))
    assert ok["passes"] and ok["arm128"]
    assert not R.control_reading(rec(g(0.09, 0.07, 0.11), g(0.0, 0.0, 0.0)))["arm128"]
    # an interval that reaches 0 is not a copy, whatever its mean
    weak = R.control_reading(rec(g(0.03, -0.001, 0.06), g(0.0, 0.0, 0.0)))
    assert not weak["passes"] and "does not lie above 0" in weak["why"]
    # a gain the reset keeps is attention's, not the memory's
    att = R.control_reading(rec(g(0.09, 0.07, 0.11), g(0.05, 0.03, 0.07)))
    assert not att["passes"] and "not the memory alone" in att["why"]
    # a small reset effect, below a quarter of the gain, still passes
    assert R.control_reading(rec(g(0.09, 0.07, 0.11), g(0.01, 0.005, 0.015)))["passes"]


def test_one_seed_reads_lazy_between_not_lazy_or_no_reference():
    short = g(0.04, 0.02, 0.06)
    assert R.seed_reading(short, g(0.01, 0.0, 0.02)) == "lazy"  # 0.25x exactly
    assert R.seed_reading(short, g(0.011, 0.0, 0.02)) == "between"
    assert R.seed_reading(short, g(0.03, 0.0, 0.05)) == "not lazy"  # 0.75x exactly
    assert R.seed_reading(short, g(-0.01, -0.02, 0.0)) == "lazy"
    assert R.seed_reading(g(0.04, -0.01, 0.09), g(0.0, 0, 0)) == "no reference"
    assert R.seed_reading(None, g(0.0, 0, 0)) == "no reference"


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
def test_the_family_verdict(readings, planned, verdict):
    assert R.family_verdict(readings, planned) == verdict


def test_claim_3_memory_half():
    assert R.memory_half(["not lazy"] * 4 + ["lazy"], 5) == "held"
    assert R.memory_half(["lazy"] * 5, 5) == "did not hold"
    assert R.memory_half(["between"] * 5, 5) == "cannot be shown at this scale"
    assert R.memory_half(["no reference"] * 2 + ["not lazy"] * 3, 5) == (
        "cannot be shown at this scale"
    )


def test_claim_3_quality_half():
    long = [1.00, 1.02, 0.98, 1.01, 0.99]
    short = [x + 0.10 + e for x, e in zip(long, [0.01, -0.01, 0.0, 0.005, -0.005])]
    # the stochastic run within 0.01 of the long one: below half the cost (0.05)
    stoch = [x + 0.01 + e for x, e in zip(long, [0.002, -0.002, 0.001, 0.0, -0.001])]
    assert R.quality_half(short, long, stoch)["verdict"] == "held"
    # as costly as the short window: above half the cost
    assert R.quality_half(short, long, short)["verdict"] == "did not hold"
    # straddling half the cost
    wide = [x + d for x, d in zip(long, [0.0, 0.10, 0.02, 0.09, 0.04])]
    q = R.quality_half(short, long, wide)
    assert q["diff"]["ci"][0] < 0.05 < q["diff"]["ci"][1]
    assert q["verdict"] == "cannot be shown at this scale"
    # no cost to recover: the short window is no worse than the long one within the noise
    flat = [x + d for x, d in zip(long, [0.02, -0.02, 0.01, -0.01, 0.0])]
    assert R.quality_half(flat, long, stoch)["verdict"] == "not applicable"


def test_the_memory_appears_when_two_checkpoints_in_a_row_copy():
    pts = [
        {"tokens": 2e6, "ci": {"k": [0.001, 0.01]}},
        {"tokens": 4e6, "ci": {"k": [-0.001, 0.01]}},
        {"tokens": 6e6, "ci": {"k": [0.002, 0.01]}},
        {"tokens": 8e6, "ci": {"k": [0.003, 0.01]}},
    ]
    assert R.appeared_at(pts, "k") == pytest.approx(6.0)
    assert R.appeared_at(pts[:3], "k") is None


def test_the_maps_prediction_is_read_against_the_verdict():
    assert R.map_prediction("not lazy").startswith("confirmed")
    assert R.map_prediction("lazy").startswith("refuted")
    assert R.map_prediction("partial").startswith("neither")
    # the committed constants are TEXT_RULE.md's
    rule = (HERE / "TEXT_RULE.md").read_text()
    lo, hi = R.RHO_STAR[1:]
    assert f"0.25 % of the episodes (95 % bootstrap interval\n{100 * lo:g}–{100 * hi:g} %)" in rule
    assert "0.0085 %" in rule and math.isclose(R.RHO_STAR[0] * R.ANSWERS_OF_TARGETS, 8.5e-5)


def test_a_maps_prediction_is_its_interval_against_the_far_share():
    rho, per = (0.004, 0.001, 0.01), 0.05  # rho* 0.4 % [0.1, 1] % of the episodes, 5 % answers
    # primary reading, on the targets' scale: the interval is [0.005, 0.05] % of the targets
    assert R.predict(0.0006, rho, per) == "not lazy"
    assert R.predict(0.00004, rho, per) == "lazy"
    assert R.predict(0.0003, rho, per) == "cannot predict"
    # secondary reading: the text's share read as the episodes' share
    assert R.predict(0.0006, rho, 1.0) == "lazy" and R.predict(0.02, rho, 1.0) == "not lazy"
    assert R.map_prediction("lazy", "lazy").startswith("confirmed")
    assert R.map_prediction("not lazy", "lazy") == "refuted (predicted lazy)"
    assert "cannot predict" in R.map_prediction("lazy", "cannot predict")
    # the committed constants give the committed section 6: both corpora above the interval per
    # target; on the secondary reading pystdlib (1.28 %) above it, KJV (0.30 %) inside it
    assert R.predict(0.0128, R.RHO_STAR, R.ANSWERS_OF_TARGETS) == "not lazy"
    assert R.predict(0.0030, R.RHO_STAR, R.ANSWERS_OF_TARGETS) == "not lazy"
    assert R.predict(0.0128, R.RHO_STAR, 1.0) == "not lazy"
    assert R.predict(0.0030, R.RHO_STAR, 1.0) == "cannot predict"

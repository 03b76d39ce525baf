"""The studies' verdict rule and the statistics under it (experiments/lab: stats.py, verdicts.py,
emergence.py, provenance.py; rho*'s interval is the laziness map's tests'), held to
textbook tables, values worked by hand and an independent implementation (scipy 1.17's
scipy.stats, whose numbers are written here as constants: scipy is not a dependency)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from experiments.lab import emergence as E
from experiments.lab import provenance as P
from experiments.lab import stats as S
from experiments.lab import verdicts as V
from swax.sweep import load_sweep

CLAIMS = Path(__file__).resolve().parents[2] / "claims"
"""The claims' settings, whose archives predate the field that records the ids."""
HELD, NOT, CANNOT = "held", "did not hold", "cannot be shown at this scale"

# ------------------------------------------------------------------------------ distributions


def test_t_quantiles_match_the_textbook_table():
    # two-sided 95 % critical values of Student's t (any statistics textbook's table)
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (10, 2.228)):
        assert S.t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)
    assert S.t_quantile(0.80, 3) == pytest.approx(0.978, abs=5e-4)  # one-sided 80 %
    assert S.t_quantile(0.025, 3) == -S.t_quantile(0.975, 3)


def test_the_noncentral_t_matches_scipy_and_reduces_to_the_central_one():
    # scipy.stats.nct.cdf(x, df, nc) at these points
    for (x, df, nc), want in {
        (3.182, 3, 4.2): 0.20925959825432042,
        (-3.182, 3, 4.2): 2.9229720667146755e-08,
        (1.0, 1, 0.5): 0.5927477364400293,
        (2.0, 2, 1.0): 0.7066620495099096,
        (0.5, 10, -1.0): 0.9303983163067515,
    }.items():
        assert S.nct_cdf(x, df, nc) == pytest.approx(want, rel=1e-7, abs=1e-12)
    # noncentrality 0 is Student's t: the table's 3.182 at df 3 leaves 2.5 % above it
    assert S.nct_cdf(3.182, 3, 0.0) == pytest.approx(0.975, abs=1e-4)


def test_the_smallest_detectable_difference_is_the_exact_noncentral_t_value():
    # the noncentrality at which a two-sided 5 % paired t test has 80 % power, n pairs: scipy's
    # nct.sf(t.ppf(.975, n - 1), n - 1, d) + nct.cdf(-t.ppf(.975, n - 1), n - 1, d) = 0.8
    for n, want in ((3, 5.653489266197127), (4, 4.255898686515759), (10, 3.149632886450718)):
        assert S.mde_se(n) == pytest.approx(want, rel=1e-6)
    # many pairs: the normal approximation z_.975 + z_.80 = 1.95996 + 0.84162
    assert S.mde_se(2000) == pytest.approx(1.95996 + 0.84162, abs=2e-3)
    # the cell: SE 0.0350 nats/byte, 4 seeds: 0.1488, where (t.975 + t.80) SE gave 0.1456
    assert round(S.mde_se(4) * 0.03496, 4) == 0.1488
    assert round((3.182 + 0.978) * 0.0350, 4) == 0.1456


def test_jeffreys_intervals_match_the_beta_quantiles():
    # scipy.stats.beta.ppf of Beta(k + 1/2, n - k + 1/2) at 2.5 and 97.5 %
    assert S.jeffreys(2, 3) == pytest.approx((17.67360971312573, 96.12523822148347), abs=1e-7)
    assert S.jeffreys(1, 4) == pytest.approx((2.847089508714679, 71.62483204365873), abs=1e-7)
    lo, hi = S.jeffreys(3, 3)  # k = n: the upper end is 100, the lower the Beta quantile
    assert lo == pytest.approx(46.441675695704966, abs=1e-7) and hi == 100
    lo, hi = S.jeffreys(0, 3)
    assert lo == 0 and hi == pytest.approx(100 - 46.441675695704966, abs=1e-7)
    assert S.betainc(3.5, 0.5, 0.5) == pytest.approx(0.03314550026377369, rel=1e-10)


def test_the_sign_test_counts_the_known_pairs():
    assert S.sign_test_p(3, 0) == (0.125, 0.25)  # 1/8 one-sided, doubled
    assert S.sign_test_p(2, 2) == (11 / 16, 1.0)
    assert all(p != p for p in S.sign_test_p(0, 0))  # nothing to test: NaN


# ------------------------------------------------------------------------------ the verdict rule


def test_a_seed_share_is_judged_by_its_exact_interval_against_one_half():
    # 2 of 4 (the rho = 0 cells): cannot be shown, and no number of seeds settles a share of 1/2
    two = V.share(2, 4)
    assert two["verdict"] == CANNOT and two["settle"] is None
    # 4 of 4: the exact lower end is 0.025 ** (1/4) = 39.8 %, below one half; 5 of 5 gives
    # 0.025 ** (1/5) = 47.8 %, 6 of 6 gives 54.1 %: six seeds settle it
    four = V.share(4, 4)
    assert four["ci"][0] == pytest.approx(100 * 0.025**0.25, abs=1e-6)
    assert four["verdict"] == CANNOT and four["settle"] == 6
    assert V.share(6, 6)["verdict"] == HELD and V.share(6, 6)["ci"][0] == pytest.approx(
        100 * 0.025 ** (1 / 6), abs=1e-6
    )
    assert V.share(0, 6)["verdict"] == NOT and V.share(0, 4)["verdict"] == CANNOT
    assert "which contains one half; no number of seeds settles it" in V.share_text(two, "x")
    assert "6 seeds would settle it at the observed share" in V.share_text(four, "x")


def _t_interval(d, t):
    m = sum(d) / len(d)
    se = statistics.stdev(d) / math.sqrt(len(d))
    return m - t * se, m + t * se


def test_a_paired_difference_whose_interval_straddles_the_threshold_cannot_be_shown():
    # claim 1 beyond T, SX at rho = 1 %: recall beyond T per seed 12, 38, 82, 22 against 50
    d = [12 - 50, 38 - 50, 82 - 50, 22 - 50]
    res = V.paired(d)
    lo, hi = _t_interval(d, 3.18245)
    assert res["ci"] == pytest.approx((lo, hi), abs=1e-3)
    assert lo + 50 == pytest.approx(-10.7, abs=0.05) and hi + 50 == pytest.approx(87.7, abs=0.05)
    assert res["verdict"] == CANNOT
    assert res["p"] == 0.5  # 8 of the 16 sign patterns reach |sum| >= 46, counted by hand
    assert res["settle"] > 4 and res["mde"] > abs(res["mean"])


def test_a_paired_difference_on_one_side_holds_or_does_not():
    held = V.paired([10.0, 12.0, 11.0, 13.0])  # mean 11.5, interval 9.4 to 13.6
    assert held["verdict"] == HELD and held["ci"][0] == pytest.approx(
        _t_interval([10, 12, 11, 13], 3.18245)[0], abs=1e-3
    )
    # the same numbers against a threshold above them: did not hold
    assert V.paired([10.0, 12.0, 11.0, 13.0], threshold=20.0)["verdict"] == NOT
    # a claim that the quantity lies below its threshold reverses the sides
    assert V.paired([10.0, 12.0, 11.0, 13.0], threshold=20.0, above=False)["verdict"] == HELD
    # the exact sign-flip p of 4 seeds all one way is 2/16 = 0.125 whatever their size
    assert held["p"] == 0.125


def test_a_difference_without_spread_is_left_to_the_exact_test():
    # every seed 25 points apart: a t interval of no width; the sign-flip test needs 6 seeds
    four = V.paired([25.0] * 4)
    assert four["verdict"] == CANNOT and four["settle"] == 6
    assert "has no width" in V.paired_text(four, "x")
    assert V.paired([25.0] * 6)["verdict"] == HELD  # p = 2 / 64


def test_seeds_that_would_settle_a_mean_follow_the_t_table():
    # gap 1, spread 1: t(n-1) / sqrt(n) < 1 first at n = 7 (2.447 / 2.646 = 0.925; at n = 6
    # 2.571 / 2.449 = 1.050)
    assert V.settle_mean(1.0, 1.0, 4) == 7
    assert V.settle_mean(0.0, 1.0, 4) is None


# ------------------------------------------------------------------------------ emergence


def _curve(accs, every=1_000_000, n=64):
    return {
        "emergence": [{"tokens": (i + 1) * every, "acc": a, "n": n} for i, a in enumerate(accs)]
    }


def test_emergence_is_a_censored_time_that_the_next_checkpoint_confirms():
    left = E.censored(_curve([60, 70, 80]))
    assert (left["kind"], left["lo"], left["hi"]) == ("left", 0.0, 1.0)
    # a first crossing that fades (sd-long seed 0's 56 -> 38 -> 53) is not the emergence
    fade = E.censored(_curve([10, 56, 38, 53, 60]))
    assert (fade["kind"], fade["lo"], fade["hi"]) == ("interval", 3.0, 4.0)
    never = E.censored(_curve([10, 20, 30]))
    assert (never["kind"], never["lo"], never["hi"]) == ("right", 3.0, math.inf)
    last = E.censored(_curve([10, 20, 55]))  # at the last checkpoint: nothing confirms it
    assert last["kind"] == "right" and "last checkpoint" in last["note"]


def test_runs_the_definition_cannot_read_say_why():
    assert E.unreadable(_curve([60, 70])) == ""
    assert "32 episodes" in E.unreadable(_curve([60, 70], n=32))
    assert "5.12M tokens apart" in E.unreadable(_curve([60, 70], every=5_120_000))
    old = {"curve": [{"tokens": 5_120_000}, {"tokens": 10_240_000}]}
    assert "no recall beyond W_long per checkpoint" in E.unreadable(old)
    assert "5.12M tokens apart" in E.unreadable(old)


def test_pairs_are_ordered_only_where_censoring_does_not_hide_the_order():
    def run(seed, accs):
        return {"seed": seed, **_curve(accs)}

    short = [
        run(0, [10, 60, 60, 60]),
        run(1, [60, 60, 60, 60]),
        run(2, [60, 60, 60, 60]),
        run(3, [10, 10, 60, 60]),
    ]
    long_ = [
        run(0, [10, 10, 10, 60, 60]),
        run(1, [60, 60, 60, 60]),
        run(2, [10, 10, 10, 10]),
        run(3, [60, 60, 60, 60]),
    ]
    d = E.pairs(short, long_, [])
    rows = {r["seed"]: r for r in d["rows"]}
    # seed 0: short in (1, 2], long in (3, 4]: long later, by 3/2 to 4/1
    assert rows[0]["order"] == "long later" and rows[0]["factor"] == (1.5, 4.0)
    # seed 1: both at the first checkpoint (left-censored): the order is hidden, no factor
    assert rows[1]["order"] == "hidden" and rows[1]["factor"] is None
    # seed 2: long never emerged: later, but no factor (lazy at the budget, not a delay)
    assert rows[2]["order"] == "long later" and rows[2]["factor"] is None
    assert E.factor_text(rows[2]["factor"]) == "–"
    # seed 3: short in (2, 3], long at the first checkpoint: short later, 0 to 1/2
    assert rows[3]["order"] == "short later" and rows[3]["factor"] == (0.0, 0.5)
    assert (d["later"], d["earlier"], d["hidden"]) == (2, 1, 1)
    assert (d["p_one"], d["p_two"]) == (0.5, 1.0)  # 2 of 3: P(X >= 2) = 4/8; doubled, capped
    assert d["never"]["long"] == 1
    # a left-censored short run leaves the factor open above
    left, later = {"kind": "left", "lo": 0.0, "hi": 1.0}, {"kind": "interval", "lo": 3, "hi": 4}
    assert E.factor_text(E.factor(left, later)) == "≥ 3.00"


# ------------------------------------------------------------------------------ episode ids


def test_archived_ids_are_read_from_the_field_or_the_archives_history(tmp_path):
    old_cfg = load_sweep(CLAIMS / "claims.yaml")
    rho0 = load_sweep(CLAIMS / "claims_rho0.yaml")
    # no field: results/claims used 128-175, results/claims_rho0 the ids after the vocabulary
    assert P.run_ids({}, old_cfg, "sx-long", 0) == {
        "first": 128,
        "last": 175,
        "old": True,
        "recorded": False,
    }
    assert P.run_ids({}, rho0, "sx-long", 0) == {
        "first": 257,
        "last": 304,
        "old": False,
        "recorded": False,
    }
    rec = {"episode_ids": {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}}
    assert P.run_ids(rec, old_cfg, "sx-long", 0)["recorded"] is True
    assert P.run_ids({"episode_ids": None}, old_cfg, "sx-long", 0) is None
    assert "old episode ids 128–175" in P.label(P.run_ids({}, old_cfg, "sx-long", 0))

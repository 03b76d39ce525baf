"""The window-size study (experiments/window_sweep): the shipped sweeps hold every family and
window, the claims are judged from the numbers, the probe names the memory that carries the
answer, docs/studies.md states the committed sweep, and the quick sweep runs end to end (slow
tier)."""

import json

import pytest

from experiments.lab.sweep_claims import claims
from experiments.lab.sweep_report import carrier
from experiments.tests.helpers import ROOT, run_study
from experiments.window_sweep import report
from swax.sweep import aggregate, load_sweep, run_dir

SWEEP = report.HERE / "sweep.yaml"


@pytest.mark.parametrize(
    "path", [SWEEP, SWEEP.with_name("sweep_gpu.yaml")], ids=["cpu_scale", "h200_scale"]
)
def test_the_shipped_sweeps_have_every_family_and_window(path):
    cfg = load_sweep(path)
    seq = cfg.base["seq_len"]
    families = {"SX": cfg.roles, **cfg.families}
    assert set(families) == {"SX", "SD", "SA"}
    for family, roles in families.items():
        runs = {role: cfg.runs[name] for role, name in roles.items()}
        assert {r.get("model", {}).get("layer_pattern", "SX") for r in runs.values()} == {family}
        short, long_ = runs["short"]["window"], runs["long"]["window"]
        assert short["kind"] == long_["kind"] == "fixed"
        assert short["fixed"] < long_["fixed"] == seq  # the long window is the training length
        assert runs["stochastic"]["window"]["kind"] == "stochastic"
    patterns = {r.get("model", {}).get("layer_pattern", "SX") for r in cfg.runs.values()}
    assert {"X", "A"} <= patterns  # the pure baselines
    assert cfg.base["data"]["synthetic"]["task"] == "mqar"


def test_the_cpu_sweep_has_seeds_a_phase_diagram_curves_and_a_probe():
    cfg = load_sweep(SWEEP)
    assert len(cfg.seeds) >= 2
    # the phase diagram: input-gate bias x window, two points shared with the SX runs
    assert set(cfg.grid.axes) == {"model.mlstm_igate_bias_init", "window.fixed"}
    assert sorted(cfg.aliases.values()) == ["sx-long", "sx-short"]
    assert cfg.eval.curve_multiples and cfg.eval.probe_multiple == 1
    quick = load_sweep(SWEEP, quick=True)
    assert quick.seeds == [0] and len(quick.runs) == 3


def _agg(acc_by_mult, seq=64, spread=0.0):
    return {
        "val_loss": (1.0, 0.0),
        "episodes_deploy": {m * seq: (a, spread) for m, a in acc_by_mult.items()},
        "episodes_long": {m * seq: (0.0, 0.0) for m in acc_by_mult},  # not what is judged
        "nll_deploy": {m * seq: (1.0, 0.0) for m in acc_by_mult},
    }


ROLES = {"short": "s", "long": "l", "stochastic": "st"}


def test_claims_hold_on_the_papers_pattern():
    agg = {
        "s": _agg({1: 80, 2: 85, 4: 80}),
        "l": _agg({1: 100, 2: 30, 4: 10}),
        "st": _agg({1: 98, 2: 80, 4: 75}),
    }
    verdicts = [v for _, v, _ in claims(agg, 64, ROLES)]
    assert verdicts == ["held", "held", "held"]


def test_claims_fail_when_the_numbers_say_so():
    agg = {
        "s": _agg({1: 90, 2: 10, 4: 0}),  # no extrapolation
        "l": _agg({1: 95, 2: 90, 4: 90}),  # no collapse
        "st": _agg({1: 40, 2: 5, 4: 0}),  # neither quality nor recall
    }
    verdicts = [v for _, v, _ in claims(agg, 64, ROLES)]
    assert verdicts == ["did not hold", "did not hold", "did not hold"]
    # quality alone is not enough for claim 3, recall alone neither
    agg["st"] = _agg({1: 95, 2: 5, 4: 0})
    assert claims(agg, 64, ROLES)[2][1] == "did not hold"


def test_a_model_that_learned_nothing_fails_the_claims_instead_of_escaping_them():
    agg = {n: _agg({1: 6, 2: 6, 4: 6}) for n in ("s", "l", "st")}
    verdicts = [v for _, v, _ in claims(agg, 64, ROLES)]
    assert verdicts[:2] == ["did not hold", "did not hold"], verdicts


def test_probe_reads_which_memory_carries_the_answer():
    p = lambda full, cut, reset, both: {  # noqa: E731
        "full": (full, 0),
        "window_cut": (cut, 0),
        "reset": (reset, 0),
        "both": (both, 0),
    }
    assert carrier(p(100, 100, 6, 6)) == "recurrent memory"
    assert carrier(p(100, 6, 100, 6)) == "sliding-window attention"
    assert carrier(p(100, 90, 90, 6)) == "either alone"
    assert carrier(p(100, 10, 10, 6)) == "both together"
    assert carrier(p(20, 10, 10, 6)) == "neither learned"
    assert carrier(p(90, 90, 90, 90)) == "full attention (untouched by the probe)"


def test_the_studies_page_states_the_committed_sweep():
    # docs/studies.md's window-sweep summary is what the report writes from the committed
    # results.json (that page, not the README)
    assert report.STUDIES_PAGE == ROOT / "docs" / "studies.md"
    results = json.loads((report.HERE / "results.json").read_text())
    seq_len = next(iter(results.values()))[0]["seq_len"]
    block = report.readme_block(load_sweep(SWEEP), aggregate(results), seq_len)
    assert block == report.studies_block()
    page = report.STUDIES_PAGE.read_text()
    assert f"{report.README_BEGIN}\n{block}\n{report.README_END}" in page
    assert report.README_BEGIN not in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_quick_sweep_writes_a_report_from_the_runs(tmp_path):
    args = ("run", "--quick", "--report-dir", str(tmp_path / "report"))
    r = run_study("experiments.window_sweep", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "report" / "REPORT.md").read_text()
    assert "**A smoke run**" in text
    for f in ("recall_vs_length.png", "learning_curves.png", "phase_diagram.png"):
        assert (tmp_path / "report" / f).stat().st_size > 1000
    cfg = load_sweep(SWEEP, quick=True)
    assert cfg.jobs == 2  # the parallel path
    for name in cfg.runs:
        ev = json.loads((tmp_path / run_dir(cfg, name, 0) / "eval.json").read_text())
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {name} | SX"))
        # the table's numbers are the run's own, not typed
        own = ev[f"episodes_{ev['deploy']}"]
        assert f"| {own['64']['acc']:.1f} ± 0.0 | {own['128']['acc']:.1f} ± 0.0 |" in row
        assert len(ev["curve"]) == 2 and set(ev["probe"]) == {"full", "window_cut", "reset", "both"}
    assert (
        text.count("**1 (SX). A short training window makes the mLSTM layers") == 1
        and "## The paper's claims at this scale" in text
    )
    assert "not testable" not in text
    assert "## Phase diagram" in text and "| -4 | 8 |" in text
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert set(results) == {*cfg.runs, *cfg.grid_runs}
    assert results["sx-short"][0]["pattern"] == "SX"
    assert set(results["sx-short"][0]["episodes_long"]) == {"64", "128", "256"}
    # a second invocation reuses every run: nothing is retrained or re-evaluated
    stamps = {n: (tmp_path / run_dir(cfg, n, 0) / "eval.json").stat().st_mtime_ns for n in cfg.runs}
    r2 = run_study("experiments.window_sweep", *args, cwd=tmp_path)
    assert r2.returncode == 0 and "swax train:" not in r2.stdout + r2.stderr
    assert stamps == {
        n: (tmp_path / run_dir(cfg, n, 0) / "eval.json").stat().st_mtime_ns for n in cfg.runs
    }

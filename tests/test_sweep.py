"""The window sweep: config validation, resumability, the claims' judgments, the quick run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from swax.errors import ConfigError
from swax.sweep import aggregate, load_sweep, mean_spread, run_dir, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "experiments" / "window_sweep" / "sweep.yaml"
sys.path.insert(0, str(ROOT / "experiments" / "window_sweep"))
import run as report  # noqa: E402


def test_the_shipped_sweep_is_valid_and_has_the_issue_variants():
    cfg = load_sweep(SWEEP)
    assert len(cfg.seeds) >= 2
    w = {
        n: (r.get("window", {}), r.get("model", {}).get("layer_pattern", "SX"))
        for n, r in cfg.runs.items()
    }
    patterns = {p for _, p in w.values()}
    assert {"SX", "X", "S", "A", "SD"} <= patterns
    fixed = sorted(
        win.get("fixed") for win, p in w.values() if p == "SX" and win.get("kind") == "fixed"
    )
    assert fixed == [16, 64, cfg.base["seq_len"]]  # short, mid, long = training length
    stoch = sorted(
        win["p_short"] for win, p in w.values() if p == "SX" and win.get("kind") == "stochastic"
    )
    assert stoch == [0.5, 0.75]
    assert set(cfg.roles.values()) <= set(cfg.runs)
    quick = load_sweep(SWEEP, quick=True)
    assert quick.seeds == [0] and len(quick.runs) == 3


def _write(tmp_path, data) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _tiny_sweep(tmp_path, runs):
    return {
        "out_dir": str(tmp_path / "out"),
        "seeds": [0],
        "base": {
            "steps": 2,
            "seq_len": 64,
            "batch_size": 2,
            "threads": 1,
            "model": {"preset": "tiny", "d_model": 32, "n_heads": 2},
            "data": {"synthetic": {"fraction": 0.5, "compact": True}},
            "window": {"kind": "fixed", "short": 8, "long": 64},
            "checkpoint": {"every": 1},
            "log": {"every": 1, "val_every": 0, "val_batches": 1},
        },
        "runs": runs,
        "eval": {"length_multiples": [1, 2], "samples": 1, "ppl_multiples": [1], "ppl_samples": 1},
    }


def test_bad_sweep_configs_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "missing.yaml")
    bad = _tiny_sweep(tmp_path, {"a": {"window": {"fixed": 0}}})
    with pytest.raises(ConfigError, match="sweep run a: .*window.fixed"):
        load_sweep(_write(tmp_path, bad))
    bad = _tiny_sweep(tmp_path, {"a": {"optim": {"learning_rate": 1.0}}})
    with pytest.raises(ConfigError, match="learning_rate"):
        load_sweep(_write(tmp_path, bad))
    data = _tiny_sweep(tmp_path, {"a": {}})
    data["roless"] = {}
    with pytest.raises(ConfigError, match="roless"):
        load_sweep(_write(tmp_path, data))
    cfg = load_sweep(_write(tmp_path, _tiny_sweep(tmp_path, {"a": {}})))
    with pytest.raises(ConfigError, match="unknown sweep run 'b'"):
        run_sweep(cfg, only=["b"], progress=False)


def test_a_finished_run_is_neither_retrained_nor_reevaluated(tmp_path):
    cfg = load_sweep(
        _write(
            tmp_path,
            _tiny_sweep(
                tmp_path, {"w8": {"window": {"fixed": 8}}, "x": {"model": {"layer_pattern": "X"}}}
            ),
        )
    )
    first = run_sweep(cfg, progress=False)
    assert set(first) == {"w8", "x"}
    assert first["w8"][0]["windows"] == {"long": 64, "train": 8}
    assert first["x"][0]["windows"] == {"long": 64}  # no attention: one window
    files = [
        run_dir(cfg, n, 0) / f
        for n in ("w8", "x")
        for f in ("summary.json", "eval.json", "model/model.safetensors")
    ]
    stamps = [f.stat().st_mtime_ns for f in files]
    again = run_sweep(cfg, progress=False)
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert again == first
    assert set(first["w8"][0]["text_loss"]) == {"long", "train"}
    assert 0 < first["x"][0]["text_loss"]["long"] < 10
    # a cache from before the text loss existed is completed, not redone
    cache = run_dir(cfg, "x", 0) / "eval.json"
    old = json.loads(cache.read_text())
    del old["text_loss"]
    old["episodes_long"]["64"]["acc"] = 42.0  # a marker a re-evaluation would overwrite
    cache.write_text(json.dumps(old))
    done = run_sweep(cfg, only=["x"], progress=False)["x"][0]
    assert done["episodes_long"]["64"]["acc"] == 42.0
    assert done["text_loss"] == first["x"][0]["text_loss"]
    # an interrupted run (checkpoint, no summary) is resumed, not restarted
    rd = run_dir(cfg, "w8", 0)
    (rd / "summary.json").unlink()
    (rd / "eval.json").unlink()
    run_sweep(cfg, only=["w8"], progress=False)
    log = (rd / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(ln)["step"] for ln in log if '"step"' in ln]
    assert steps.count(1) == 1  # step 1 was not trained a second time


def test_mean_spread_and_aggregate():
    assert mean_spread([1.0, 3.0]) == (2.0, 1.0)
    ev = lambda acc, nll, loss: {  # noqa: E731
        "val_loss": loss,
        "pattern": "SXSX",
        "windows": {"long": 32},
        "text_loss": {"long": loss + 1},
        "episodes_long": {"32": {"acc": acc, "nll": nll}, "64": {"acc": acc / 2, "nll": nll}},
    }
    agg = aggregate({"r": [ev(50.0, 1.0, 2.0), ev(70.0, 2.0, 2.2)]})["r"]
    assert agg["episodes_long"][32] == (60.0, 10.0)
    assert agg["episodes_long"][64] == (30.0, 5.0)
    assert agg["nll_long"][32] == (1.5, 0.5)
    assert agg["val_loss"][0] == pytest.approx(2.1)
    assert agg["text_loss_long"][0] == pytest.approx(3.1)


def _agg(acc_by_mult, val, spread=0.0, seq=256):
    # the claims judge quality by the text loss with the long window; the training-window
    # validation loss is set to something that would give other verdicts
    return {
        "val_loss": (1.0, 0.0),
        "text_loss_long": (val, spread),
        "episodes_long": {m * seq: (a, 0.0) for m, a in acc_by_mult.items()},
        "nll_long": {m * seq: (1.0, 0.0) for m in acc_by_mult},
    }


ROLES = {"short": "s", "long": "l", "stochastic": "st"}


def test_claims_hold_on_the_papers_pattern():
    agg = {
        "s": _agg({1: 90, 2: 85, 4: 80}, val=1.50, spread=0.005),
        "l": _agg({1: 95, 2: 10, 4: 0}, val=1.40, spread=0.005),
        "st": _agg({1: 95, 2: 80, 4: 75}, val=1.42, spread=0.005),
    }
    verdicts = [v for _, v, _ in report.claims(agg, 256, ROLES)]
    assert verdicts == ["held", "held", "held"]


def test_claims_fail_when_the_numbers_say_so():
    agg = {
        "s": _agg({1: 90, 2: 10, 4: 0}, val=1.50, spread=0.005),  # no extrapolation
        "l": _agg({1: 95, 2: 90, 4: 90}, val=1.40, spread=0.005),  # no collapse
        "st": _agg({1: 95, 2: 5, 4: 0}, val=1.49, spread=0.005),
    }  # short-window quality
    verdicts = [v for _, v, _ in report.claims(agg, 256, ROLES)]
    assert verdicts == ["did not hold", "did not hold", "did not hold"]


def test_claims_are_not_judged_when_nothing_was_learned():
    agg = {n: _agg({1: 0, 2: 0, 4: 0}, val=1.45, spread=0.01) for n in ("s", "l", "st")}
    verdicts = [v for _, v, _ in report.claims(agg, 256, ROLES)]
    assert all(v.startswith("not testable") or "not testable" in v for v in verdicts), verdicts


@pytest.mark.slow
def test_quick_sweep_writes_a_report_from_the_runs(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments/window_sweep/run.py"),
            "--quick",
            "--report-dir",
            str(tmp_path / "report"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "report" / "REPORT.md").read_text()
    for f in ("accuracy_vs_length.png", "heatmaps.png", "ppl_by_position.png"):
        assert (tmp_path / "report" / f).stat().st_size > 1000
    cfg = load_sweep(SWEEP, quick=True)
    for name in cfg.runs:
        ev = json.loads((tmp_path / run_dir(cfg, name, 0) / "eval.json").read_text())
        row = next(ln for ln in text.splitlines() if ln.startswith(f"| {name} | SX"))
        # the table's numbers are the run's own, not typed
        assert f"| {ev['text_loss']['long']:.4f} ± 0.0000 |" in row
        assert f"{ev['episodes_long']['256']['acc']:.1f} ± 0.0" in row
    assert text.count("**1. ") == 1 and "## The paper's claims at this scale" in text
    # a second invocation reuses every run: nothing is retrained
    r2 = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments/window_sweep/run.py"),
            "--quick",
            "--report-dir",
            str(tmp_path / "report"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r2.returncode == 0 and "swax train:" not in r2.stdout
    assert r2.stdout.count("(cached)") == len(cfg.runs)

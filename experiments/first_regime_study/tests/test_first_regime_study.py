"""The first regime study (experiments/first_regime_study): its configs hold the regime the issue
set (short window <= T/32, long <= T/8, text most of the supervised tokens, three seeds, the
laziness map), its design numbers are computed right, and the --quick study runs end to end
(slow tier)."""

import json

import pytest
import yaml

from experiments.first_regime_study import report as rs
from experiments.tests.helpers import run_study
from swax.sweep import aggregate, load_sweep, run_dir, train_config

HERE = rs.HERE


def _resolved(cfg, name):
    return train_config(cfg, name, cfg.seeds[0])


@pytest.mark.parametrize("config", ["sweep.yaml", "sweep_gpu.yaml"])
def test_the_study_is_in_the_papers_regime(config):
    cfg = load_sweep(HERE / config)
    assert len(cfg.seeds) >= 3
    families = {"SX": cfg.roles, **cfg.families}
    assert {"SX", "SD"} <= set(families)
    for family, roles in families.items():
        short, long_, stoch = (_resolved(cfg, roles[r]) for r in ("short", "long", "stochastic"))
        T = short.seq_len
        assert T >= 256
        patterns = {c.model.layer_pattern for c in (short, long_, stoch)}
        assert len(patterns) == 1
        assert {"S", family[1]} <= set(patterns.pop())  # SWA with mLSTM / DeltaNet / attention
        assert short.window.kind == long_.window.kind == "fixed"
        assert short.window.fixed * 32 <= T and long_.window.fixed * 8 <= T
        assert long_.window.fixed > short.window.fixed
        s = stoch.window
        assert s.kind == "stochastic" and s.p_short == 0.5 and s.anneal_frac == 0.1
        assert (s.short, s.long) == (short.window.fixed, long_.window.fixed)
    # text is most of the supervised tokens, counted here from the YAML itself
    syn = yaml.safe_load((HERE / config).read_text())["base"]["data"]["synthetic"]
    T = cfg.base["seq_len"]
    answers = syn["fraction"] * syn["num_queries"]
    text = (1 - syn["fraction"]) * T
    assert syn["answers_only"] and text / (text + answers) > 0.5
    # the laziness map: long window / T from 1/16 to 1, shares 0 ... uniform
    axes = cfg.grid.axes
    ratios = [w / T for w in axes["window.fixed+data.synthetic.far_from"]]
    assert ratios == [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1]
    assert axes["data.synthetic.far_share"] == [0.0, 0.02, 0.1, 0.3, None]
    assert cfg.eval.episodes == {"far_share": None}  # evaluation distances are uniform
    assert set(cfg.eval.length_multiples) >= {1, 2, 4, 8, 16, 32}


def test_design_numbers_are_computed_from_the_config():
    cfg = load_sweep(HERE / "sweep.yaml")
    shares = rs.target_shares(cfg)
    # 90% episodes x 1 answer against 10% text sequences x 256 targets
    assert shares["answers_of_targets"] == pytest.approx(0.9 / (0.9 + 25.6))
    assert shares["answers_of_loss"] == shares["answers_of_targets"]  # weight 1
    # a training episode has 257 tokens, 2 of them the query and its answer and 2 the pair,
    # so its distance is uniform over [8, 253]: 221 of those 246 values lie beyond W = 32
    assert rs.uniform_far_share(32, 256, cfg) == pytest.approx(221 / 246)
    assert rs.uniform_far_share(256, 256, cfg) == 0.0


def test_laziness_cells_read_the_grid_runs():
    cfg = load_sweep(HERE / "sweep.yaml", quick=True)

    def fake(name, acc_in, acc_far):
        return {
            "name": name,
            "seed": 0,
            "pattern": "XS",
            "seq_len": 256,
            "val_loss": 1.0,
            "windows": {"long": 32},
            "deploy": "long",
            "text_val_loss": 1.5,
            "episodes_long": {
                "256": {"acc": acc_in, "nll": 0.1},
                "512": {"acc": acc_far, "nll": 1.0},
            },
        }

    results = {name: [fake(name, 90.0, 10.0 * i)] for i, name in enumerate(cfg.grid_runs)}
    cells = rs.laziness_cells(cfg, aggregate(results), 256)
    assert len(cells) == len(cfg.grid_runs)
    for i, (name, point) in enumerate(cfg.grid_points.items()):
        c = next(c for c in cells if c["name"] == name)
        assert c["far"] == 10.0 * i and c["in"] == 90.0 and c["text"] == 1.5
        assert c["window"] == point["window.fixed+data.synthetic.far_from"]


@pytest.mark.slow
def test_quick_study_writes_a_report_from_the_runs(tmp_path):
    args = ("run", "--quick", "--report-dir", str(tmp_path / "r"))
    r = run_study("experiments.first_regime_study", *args, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "r" / "FIRST_STUDY.md").read_text()
    assert "**A smoke run**" in text
    for f in ("recall_vs_length.png", "laziness_map.png"):
        assert (tmp_path / "r" / f).stat().st_size > 1000
    for section in (
        "## The paper's claims in this regime",
        "## The laziness map",
        "## Multi-pair recall",
    ):
        assert section in text
    cfg = load_sweep(HERE / "sweep.yaml", quick=True)
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert set(results) == {*cfg.runs, *cfg.grid_runs}
    for name in cfg.runs:
        (ev,) = results[name]
        want = (
            cfg.runs[name].get("model", {}).get("layer_pattern", cfg.base["model"]["layer_pattern"])
        )
        assert ev["pattern"] == want and ev["seq_len"] == 256  # the run trained what was asked
        assert set(ev["episodes_long"]) == {"256", "512"} and "acc" in ev["episodes_long"]["256"]
        assert ev["text_val_loss"] == ev["text_loss"][ev["deploy"]]
        on_disk = json.loads((tmp_path / run_dir(cfg, name, 0) / "eval.json").read_text())
        assert on_disk["episodes_long"] == ev["episodes_long"]  # the runs' own numbers
    assert "episodes_train" in results["sx-short"][0]
    multi = json.loads((tmp_path / "r" / "results_multipair.json").read_text())
    assert set(multi) == {"xs-conv"}
    # a second invocation retrains and re-evaluates nothing
    r2 = run_study("experiments.first_regime_study", *args, cwd=tmp_path, timeout=900)
    assert r2.returncode == 0 and "swax train:" not in r2.stdout + r2.stderr

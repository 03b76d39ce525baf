"""The regime study (experiments/regime_study): its configs hold the regime the issue sets (short
window <= T/32, long <= T/8, text most of the supervised tokens, three seeds, the laziness map),
its design numbers are computed right, and the --quick study runs end to end (slow tier)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from swax.sweep import aggregate, all_jobs, load_sweep, run_dir
from tests.experiments.regime import HERE, ROOT, script


def _report_module():
    return script("run")


def _resolved(cfg, name):
    from swax.sweep import train_config

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
    rs = _report_module()
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
    rs = _report_module()
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
    cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--report-dir", str(tmp_path / "r")]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
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
    r2 = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r2.returncode == 0 and "swax train:" not in r2.stdout + r2.stderr


# ------------------------------------------------------------------------------ laziness map


def _laziness_module():
    return script("laziness")


def test_the_laziness_map_is_the_issues_grid():
    cfg = load_sweep(HERE / "laziness.yaml")
    T = cfg.base["seq_len"]
    axes = cfg.grid.axes
    assert sorted(w * 16 // T for w in axes["window.fixed+window.long"]) == [1, 2, 4]
    assert axes["data.synthetic.far_share"] == [0.0, 0.005, 0.01, 0.02, 0.05, 0.1, None]
    assert len(cfg.grid.seeds) >= 3 and cfg.archive and cfg.eval.bucket_samples >= 64
    lz = _laziness_module()
    assert lz.columns(cfg) == ["0%", "0.5%", "1%", "2%", "5%", "10%", "uniform", "power"]
    for name, point in cfg.grid_points.items():
        tc = _resolved(cfg, name)
        w = point["window.fixed+window.long"]
        # the far threshold is the long window, which is the training window
        assert tc.window.fixed == tc.window.long == w
        if point["data.synthetic.far_share"] is not None:
            assert tc.data.synthetic.far_from == w
        assert tc.optim.schedule == "wsd"  # no decay before learning starts


def test_rho_star_reads_where_half_the_seeds_stay_lazy():
    lz = _laziness_module()
    # lazy shares 1, 1, 1/3 at 0, 1 %, 2 %: half is crossed at 1 % + 0.5 / (2/3) × 1 % = 1.75 %
    assert lz.rho_star([(0.0, 1.0), (0.01, 1.0), (0.02, 1 / 3)]).startswith("1.75% (between 1%")
    assert lz.rho_star([(0.0, 1 / 3), (0.01, 0.0)]).startswith("≤ 0%")
    assert lz.rho_star([(0.0, 1.0), (0.1, 2 / 3)]).startswith("> 10%")
    assert lz.rho_star([]) == "–"


def _fake_run(kind_inside, beyond, seed, T=256, W=32):
    """An archived run in the sweep's format, with recall inside W and beyond it given."""

    def row(lo, hi, inside, acc):
        k = round(acc * 64 / 100)
        tally = {"correct": k, "n": 64, "acc": 100 * k / 64}
        return {
            "lo": lo,
            "hi": hi,
            "inside_long": inside,
            **tally,
            "probes": {"window_cut": dict(tally), "reset": dict(tally)},
        }

    rows = [row(0, 8, True, kind_inside), row(8, W, True, kind_inside), row(W, T, False, beyond)]
    from swax.probes.buckets import verdict

    return {
        "seq_len": T,
        "buckets": rows,
        "laziness": verdict(rows, 6.25, T),
        "seed": seed,
        "text_val_loss": 1.6,
        "summary": {"elapsed": 240.0, "tokens": 10240000},
    }


def test_laziness_report_is_built_from_the_archive(tmp_path):
    lz = _laziness_module()
    cfg = load_sweep(HERE / "laziness.yaml")
    cfg.archive = str(tmp_path / "kept")
    runs = {  # W = 32: lazy at 0 % on both seeds, memory at 10 % on one of two
        ("grid-w32-far0.0-lawuniform", 0): (100, 5),
        ("grid-w32-far0.0-lawuniform", 1): (100, 3),
        ("grid-w32-far0.1-lawuniform", 0): (100, 5),
        ("grid-w32-far0.1-lawuniform", 1): (100, 80),
    }
    for (name, seed), (inside, beyond) in runs.items():
        p = tmp_path / "kept" / name / f"seed{seed}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(_fake_run(inside, beyond, seed)))
    cells = lz.load_cells(cfg)
    assert [r["kind"] for r in cells[(32, "0%")]] == ["lazy", "lazy"]
    assert sorted(r["kind"] for r in cells[(32, "10%")]) == ["lazy", "memory"]
    text = lz.write_report(cfg, cells, tmp_path, "cmd").read_text()
    assert "4 of 72 planned" in text
    # no ids recorded, not an archive known to be clean: read as the old ids, and said so
    assert "The map's runs used old episode ids 128–175" in text
    # lazy shares 1 at 0 % and 1/2 at 10 %: half is reached at 10 %; each share with its
    # Jeffreys interval (scipy.stats.beta.ppf: Beta(2.5, .5) 2.5 % = 0.333; Beta(1.5, 1.5) 2.5 %
    # and 97.5 % = 0.061 and 0.939)
    assert (
        "| 32 (T/8) | 2/2 [33–100] | – | – | – | – | 1/2 [6–94] | – | – | 10% (between 0% and "
        "10%) |" in text
    )
    # recall with its Wilson interval: 51 of 64 in (W, T] is 80 % [68–88]
    assert "| 32 | 10% | 1 | 100 [97–100] | 80 [68–88] |" in text
    assert (tmp_path / "laziness_share.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("config", ["laziness.yaml", "laziness_clean.yaml"])
def test_quick_laziness_map_runs_and_reports(tmp_path, config):
    cmd = [
        sys.executable,
        str(HERE / "laziness.py"),
        "--config",
        config,
        "--quick",
        "--run",
        "--report-dir",
        str(tmp_path / "r"),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "r" / "LAZINESS.md").read_text()
    assert "2 of 2 planned" in text and "| 32 | 0% | 0 |" in text
    # the runs record the ids they trained with, and the report reads them from there
    assert "The map's runs used clean episode ids 257–304" in text
    cfg = load_sweep(HERE / config, quick=True)
    kept = list((tmp_path / cfg.out_dir / "archive").rglob("seed0.json"))
    assert len(kept) == 2
    for path in kept:
        ids = json.loads(path.read_text())["episode_ids"]
        assert ids == {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}


# ------------------------------------------------------------------------------ the claims


def _claims_module():
    return script("claims")


def test_the_claims_study_is_in_the_papers_regime():
    cfg = load_sweep(HERE / "claims.yaml")
    assert len(cfg.seeds) >= 4
    for family, roles in {"SX": cfg.roles, **cfg.families}.items():
        short, long_, stoch = (_resolved(cfg, roles[r]) for r in ("short", "long", "stochastic"))
        T = short.seq_len
        assert short.window.fixed * 32 == T and long_.window.fixed * 8 == T
        assert (stoch.window.short, stoch.window.long) == (short.window.fixed, long_.window.fixed)
        assert {c.model.layer_pattern for c in (short, long_, stoch)} == {family}
        for c in (short, long_, stoch):  # one far share, beyond the long window, for all roles
            assert c.data.synthetic.far_from == long_.window.fixed
            assert c.data.synthetic.far_share == cfg.base["data"]["synthetic"]["far_share"]
            assert c.optim.schedule == "wsd"
        near = _resolved(cfg, f"{family.lower()}-long-near").data.synthetic
        uniform = _resolved(cfg, f"{family.lower()}-long-uniform").data.synthetic
        assert near.far_share == 0.0 and uniform.far_share is None
    assert cfg.eval.text_samples >= 256 and cfg.eval.bucket_samples >= 64


def _rec(beyond, inside=100.0, beyond_t=None, text=1.6, seed=0):
    from swax.probes.buckets import LAZY_INSIDE, LAZY_MARGIN

    lazy = inside >= LAZY_INSIDE and beyond <= 6.25 + LAZY_MARGIN
    kind = "lazy" if lazy else "memory" if beyond >= 50 else "partial"
    return {
        "seed": seed,
        "inside": inside,
        "beyond": beyond,
        "kind": kind,
        "text": text,
        "beyond_T": beyond if beyond_t is None else beyond_t,
        "cut_inner": inside,
        "reset_beyond": 6.0,
        "minutes": 15.0,
    }


ROLES = {"short": "s", "long": "l", "stochastic": "st"}
# text losses by seed with the study's spread (about 0.04 nats/byte between seeds), shared by
# the roles of a seed as paired runs share theirs; six seeds, the fewest with which a seed
# share can settle "most" (6 of 6: 54-100 %) and an exact sign-flip test can reach 5 %
SEED_TEXT = (1.31, 1.33, 1.38, 1.30, 1.35, 1.32)


def _verdicts(cl, runs):
    return [(c["verdict"], [p["verdict"] for p in c["parts"]]) for c in cl.judge("SX", ROLES, runs)]


def _base(cost=0.05, stoch=0.01):
    return {  # short: memory, long: lazy, stochastic: memory
        "s": [_rec(90, text=t + cost, seed=i) for i, t in enumerate(SEED_TEXT)],
        "l": [_rec(5, text=t, seed=i) for i, t in enumerate(SEED_TEXT)],
        "st": [_rec(85, text=t + stoch, seed=i) for i, t in enumerate(SEED_TEXT)],
    }


def test_claims_hold_when_the_numbers_say_so():
    cl = _claims_module()
    held = ("held", ["held", "held"])
    assert _verdicts(cl, _base()) == [held, ("held", ["held"]), held]


def test_claims_fail_when_the_numbers_say_so():
    cl = _claims_module()
    base = _base()

    def verdicts(**change):
        return _verdicts(cl, {**base, **change})

    # the long window not lazy in most seeds: claim 2 fails, claim 3's recall half too
    got = verdicts(l=[_rec(80, seed=i, text=t) for i, t in enumerate(SEED_TEXT)])
    assert got[1] == ("did not hold", ["did not hold"])
    assert got[2][1][0] == "did not hold"  # 85 is not 10 points above 80
    # the short window did not learn on any seed: 1a fails, 1b cannot be shown
    weak = [_rec(b, seed=i, text=1.35) for i, b in enumerate((20, 10, 5, 8, 12, 7))]
    assert verdicts(s=weak)[0] == (
        "did not hold",
        ["did not hold", "cannot be shown at this scale"],
    )
    # recall beyond T lost: claim 1 held in part
    lost = [_rec(90, beyond_t=10, seed=i, text=t + 0.05) for i, t in enumerate(SEED_TEXT)]
    assert verdicts(s=lost)[0] == ("held in part", ["held", "did not hold"])
    # stochastic quality as bad as the short window's: claim 3's quality part fails
    worse = [_rec(85, text=t + 0.05, seed=i) for i, t in enumerate(SEED_TEXT)]
    assert verdicts(st=worse)[2] == ("held in part", ["held", "did not hold"])
    # runs missing: not yet run
    assert [c["verdict"] for c in cl.judge("SX", ROLES, {"s": base["s"]})] == ["not yet run"] * 3


def test_a_cost_within_the_seed_noise_cannot_be_shown():
    """Claim 3's quality half at the study's real spread: a short-window cost of 0.002
    nats/byte, unpaired noise of 0.03 between runs, is not a measurement of no cost: the verdict
    says it cannot be shown and names the smallest cost the design detects: the exact
    noncentral t value, 3.5139 standard errors at 6 seeds (scipy.stats.nct and brentq)."""
    cl = _claims_module()
    noise = (0.03, -0.02, 0.01, -0.03, 0.02, -0.01)  # run-to-run noise the pairing keeps
    runs = _base(cost=0.0)
    runs["s"] = [
        _rec(90, text=t + 0.002 + e, seed=i) for i, (t, e) in enumerate(zip(SEED_TEXT, noise))
    ]
    c3 = cl.judge("SX", ROLES, runs)[2]
    quality = c3["parts"][1]
    assert quality["verdict"] == "cannot be shown at this scale"
    d = [0.002 + e for e in noise]
    m = sum(d) / 6
    se = (sum((x - m) ** 2 for x in d) / 5 / 6) ** 0.5
    assert f"detects (95 %, 80 % power) is {3.5139027291712472 * se:.4f}" in quality["evidence"]
    assert c3["verdict"] == "held in part"  # recall held, quality cannot be shown
    # a short window measurably *better* than the long one: no cost to recover
    runs["s"] = [
        _rec(90, text=t - 0.015 + e / 10, seed=i) for i, (t, e) in enumerate(zip(SEED_TEXT, noise))
    ]
    quality = cl.judge("SX", ROLES, runs)[2]["parts"][1]
    assert quality["verdict"] == "cannot be shown at this scale"
    assert "no cost to recover" in quality["evidence"]


def test_four_seeds_settle_no_share_and_say_how_many_would():
    """The study's 4 seeds: a share of 4 of 4 cannot exclude one half (40-100 %), so claims 1a
    and 2 cannot be shown whatever the runs did; the evidence says 6 seeds would settle it.
    A paired difference well away from its threshold is still decided by its t interval."""
    cl = _claims_module()
    four = {k: v[:4] for k, v in _base().items()}
    c1, c2, _ = cl.judge("SX", ROLES, four)
    assert [p["verdict"] for p in c1["parts"]] == ["cannot be shown at this scale"] * 2
    assert "4 of 4 (95 % exact interval 40–100 %)" in c1["parts"][0]["evidence"]
    assert "6 seeds would settle it" in c2["parts"][0]["evidence"]
    # recall beyond T far below half of that beyond W_long on every seed, with some spread:
    # did not hold (t interval -42.7 to -33.1), though the sign-flip p cannot go below 0.125
    lost = [
        _rec(100, beyond_t=b, seed=i, text=t + 0.05)
        for i, (b, t) in enumerate(zip((16, 12, 11, 9), SEED_TEXT))
    ]
    c1 = cl.judge("SX", ROLES, {**four, "s": lost})[0]
    assert c1["parts"][1]["verdict"] == "did not hold"
    assert "exact sign-flip p = 0.125" in c1["parts"][1]["evidence"]


def test_recall_at_the_ceiling_cannot_show_claim_3():
    cl = _claims_module()
    runs = _base()
    runs["l"] = [_rec(98, seed=i, text=t) for i, t in enumerate(SEED_TEXT)]
    runs["st"] = [_rec(99, seed=i, text=t + 0.01) for i, t in enumerate(SEED_TEXT)]
    part = cl.judge("SX", ROLES, runs)[2]["parts"][0]
    assert part["verdict"] == "cannot be shown at this scale"
    assert "already recalls ≥ 90 %" in part["evidence"]


def test_verdicts_name_where_they_were_made_and_print_intervals(tmp_path):
    cl = _claims_module()
    cfg = load_sweep(HERE / "claims.yaml")
    runs = {"sx-short": _base()["s"], "sx-long": _base()["l"], "sx-stoch": _base()["st"]}
    text = cl.write_report([(cfg, runs)], tmp_path, "cmd").read_text()
    assert "— **held** (ρ = 1 %, 30.7M tokens, 6 seeds)." in text
    # the exact interval of 6 of 6: 0.025 ** (1/6) = 54 % to 100 %
    assert (
        "sx-long seeds that end lazy: 6 of 6 (95 % exact interval 54–100 %), which lies "
        "above one half" in text
    )


def test_the_delay_reads_censored_emergence_per_family():
    cl = _claims_module()
    cfg = load_sweep(HERE / "claims_rho0.yaml")

    def run(seed, crossing):  # recall beyond W_long every 1M tokens, crossing at `crossing`
        pts = [
            {
                "tokens": m * 1_000_000,
                "acc": 100.0 if crossing and m >= crossing else 5.0,
                "cut": 100.0,
                "reset": 5.0,
                "n": 64,
            }
            for m in range(1, 31)
        ]
        return {**_rec(90, seed=seed), "emergence": pts}

    runs = {
        "sx-short": [run(0, 2), run(1, 3), run(2, 2), run(3, 4)],
        "sx-long": [run(0, 6), run(1, 3), run(2, None), run(3, 1)],
        "sx-stoch": [run(s, 2) for s in range(4)],
    }
    lines = "\n".join(cl.delay_lines(cfg, runs))
    # seed 0: short in (1, 2], long in (5, 6]: later, by 5/2 to 6/1
    assert "| 0 | 1.00–2.00 | 5.00–6.00 | 1.00–2.00 | long later | 2.50–6.00 |" in lines
    # seed 1: the same interval: the order is hidden, no factor
    assert "| 1 | 2.00–3.00 | 2.00–3.00 | 1.00–2.00 | hidden | – |" in lines
    # seed 2: the long window never emerged: later, but lazy at the budget, not a delay
    assert "| 2 | 1.00–2.00 | > 30.00 (never) | 1.00–2.00 | long later | – |" in lines
    # seed 3: long at the first checkpoint (left-censored), short in (3, 4]: short later
    assert "| 3 | 3.00–4.00 | ≤ 1.00 | 1.00–2.00 | short later | 0.00–0.33 |" in lines
    # 2 later, 1 earlier, 1 hidden: one-sided P(X >= 2 of 3) = 4/8, two-sided 1
    assert "later in 2, earlier in 1, and censoring hides the order in 1" in lines
    assert "one-sided p = 0.500 (long later), two-sided p = 1.000" in lines
    assert "long 1 of 4" in lines
    # runs without a curve the definition can read are left out, with the reason
    old = {k: [{**r, "emergence": []} for r in v] for k, v in runs.items()}
    assert "left out of the delay reading: the runs have no recall beyond W_long" in "\n".join(
        cl.delay_lines(cfg, old)
    )


def _quick(tmp_path, script, *args):
    cmd = [
        sys.executable,
        str(HERE / script),
        "--quick",
        "--run",
        *args,
        "--report-dir",
        str(tmp_path / "r"),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.slow
def test_quick_rho0_claims_run_and_report(tmp_path):
    """The rho = 0 claims end to end in their reduced form, with the emergence curve read at
    every checkpoint."""
    _quick(tmp_path, "claims.py", "--config", "claims_rho0.yaml")
    claims = (tmp_path / "r" / "CLAIMS.md").read_text()
    assert "3 of 3 planned" in claims and "## No answer beyond W_long" in claims
    # 4 episodes per checkpoint: the censored emergence cannot be read, and the report says so
    assert "left out of the delay reading: the runs have 4 episodes per checkpoint" in claims
    assert "clean episode ids 257–304" in claims  # recorded by the archive, read from it
    kept = json.loads((tmp_path / "runs/claims_rho0_quick/archive/sx-long/seed0.json").read_text())
    assert kept["episode_ids"] == {
        "task": "mqar",
        "first": 257,
        "last": 304,
        "tokenizer_vocab": 257,
    }
    points = kept["emergence"]["points"]
    assert [p["step"] for p in points] == [20, 40] and {"acc", "cut", "reset", "n"} <= set(
        points[0]
    )


@pytest.mark.slow
def test_quick_text_only_runs_and_reports(tmp_path):
    _quick(tmp_path, "textonly.py")
    text_only = (tmp_path / "r" / "TEXT_ONLY.md").read_text()
    assert "3 of 3 planned" in text_only
    assert text_only.count("| sx-long | 0 |") == 4  # one row per bucket


@pytest.mark.slow
def test_quick_claims_study_runs_and_reports(tmp_path):
    cmd = [
        sys.executable,
        str(HERE / "claims.py"),
        "--quick",
        "--run",
        "--report-dir",
        str(tmp_path / "r"),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    text = (tmp_path / "r" / "CLAIMS.md").read_text()
    assert "5 of 5 planned" in text and "## Controls" in text
    assert text.count("| sx-") == 5  # one row per run


def test_claims_with_fewer_seeds_than_planned_are_provisional(tmp_path):
    cl = _claims_module()
    cfg = load_sweep(HERE / "claims.yaml")
    one = {"sx-short": [_rec(90)], "sx-long": [_rec(5)], "sx-stoch": [_rec(85)]}
    text = cl.write_report([(cfg, one)], tmp_path, "cmd").read_text()
    assert (
        "— **cannot be shown at this scale (provisional: 1 of 4 seeds)** (ρ = 1 %, 30.7M tokens, "
        "1 seed)" in text
    )
    assert (
        "(SD). With a long window the model relies on attention (it is lazy).** — **not yet run**"
        in text
    )


def test_the_study_report_reads_the_map_and_the_claims_from_the_archive(tmp_path):
    # REPORT.md states results only through numbers computed from the archived runs: two lazy
    # seeds at 0 % (W = 32) and one of two at 1 %, a positive control lazy in both its seeds,
    # a long window that learned the memory in both at 1 %, and the far share of text
    report = script("report")
    lcfg = load_sweep(HERE / "laziness.yaml")
    ccfg = load_sweep(HERE / "claims.yaml")
    zcfg = load_sweep(HERE / "claims_rho0.yaml")
    tcfg = load_sweep(HERE / "textonly.yaml")
    lcfg.archive, ccfg.archive = str(tmp_path / "map"), str(tmp_path / "claims")
    zcfg.archive, tcfg.archive = str(tmp_path / "rho0"), str(tmp_path / "text")
    runs = {
        (lcfg.archive, "grid-w32-far0.0-lawuniform", 0): (100, 5),
        (lcfg.archive, "grid-w32-far0.0-lawuniform", 1): (100, 3),
        (lcfg.archive, "grid-w32-far0.01-lawuniform", 0): (100, 5),
        (lcfg.archive, "grid-w32-far0.01-lawuniform", 1): (100, 90),
        (ccfg.archive, "sx-long-near", 0): (100, 5),
        (ccfg.archive, "sx-long-near", 1): (100, 8),
        (ccfg.archive, "sd-long-near", 0): (100, 5),  # lazy
        (ccfg.archive, "sd-long-near", 1): (100, 30),  # partial, its window cut keeps 100 %
        **{(ccfg.archive, n, s): (100, 95) for n in ("sx-short", "sx-stoch") for s in (0, 1)},
        (ccfg.archive, "sx-long", 0): (100, 80),
        (ccfg.archive, "sx-long", 1): (100, 100),
        **{(zcfg.archive, n, s): (100, 95) for n in ("sx-short", "sx-stoch") for s in (0, 1)},
        (zcfg.archive, "sx-long", 0): (100, 5),
        (zcfg.archive, "sx-long", 1): (100, 3),
    }
    clean = {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}
    for (archive, name, seed), (inside, beyond) in runs.items():
        p = Path(archive) / name / f"seed{seed}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        rec = _fake_run(inside, beyond, seed)
        if archive == zcfg.archive:  # these record their ids; the others predate the field
            rec["episode_ids"] = clean
        p.write_text(json.dumps(rec))
    far = {
        "rows": [
            {
                "seq_len": 256,
                "rows": 10,
                "windows": [{"window": 32, "divisor": 8, "share": 0.005, "ci": [0.004, 0.006]}],
            }
        ]
    }
    settings = [(c, report.C.load_runs(c)) for c in (ccfg, zcfg)]
    text = report.write_report(tmp_path, lcfg, settings, tcfg, {("kjv", "byte"): far}).read_text()
    # Jeffreys intervals (scipy.stats.beta.ppf): 2/2 from 33 %, 1/2 6-94 %
    assert "| 32 (T/8) | 2/2 [33–100] | – | 1/2 [6–94] |" in text
    assert "the SX long window ended lazy in 2 of 2 (16–100 %) seeds" in text
    # one table per setting, each naming its episode ids; 2 seeds settle no share
    assert "**ρ = 1 %** (old episode ids 128–175, which the KJV text also holds):" in text
    assert "**ρ = 0** (clean episode ids 257–304, after the tokenizer's vocabulary):" in text
    assert text.count("| 2 (SX) | lazy | cannot be shown at this scale (2 seeds) |") == 2
    assert "| 1 (SD) | beyond W_long | not yet run |" in text
    assert "The Gated DeltaNet hybrid: lazy in 1 of 2 (1–99 %) seeds" in text
    # the far share against rho*: 0.5 % of the targets; rho*(T/8) = 1 % of the answers, which
    # are 0.9 / (0.9 + 0.1 * 256) of the targets; rho* with its interval
    per = 0.9 / (0.9 + 0.1 * 256)
    lo, hi = report.L.rho_star_interval(report.L.load_cells(lcfg), 32, ["0%", "1%"])
    assert (
        f"ρ*(T/8) = 1 % (95 % interval {report.L.interval_text(lo, hi)} on old episode ids) is "
        f"{100 * 0.01 * per:.3f} % of the targets" in text
    )
    assert f"the text's own far share is {0.005 / (0.01 * per):.0f}× ρ* (" in text
    # the README's paragraph is made from the same numbers
    block = report.readme_block(settings, report.L.load_cells(lcfg), {("kjv", "byte"): far})
    assert "ended lazy in 2 of 2 (16–100 %) SX seeds and 1 of 2 (1–99 %) SD seeds" in block
    assert (
        "SX at ρ = 1 %, 30.7M tokens, 2 seeds: claim 1 cannot be shown at this scale, claim 2 "
        "cannot be shown at this scale" in block
    )
    assert "(SD at " not in block  # no SD claims run in this archive: no SD verdict
    assert "Text alone puts 0.50 % of KJV's targets beyond the claims' W_long = 32" in block


def test_the_map_of_record_is_the_clean_map_once_every_run_is_archived(tmp_path):
    """Until the clean-id rerun is complete, the reports show the old map and say the rerun is
    pending (with its partial table); once complete, the clean map replaces it."""
    lz = _laziness_module()
    old, clean = load_sweep(HERE / "laziness.yaml"), load_sweep(HERE / "laziness_clean.yaml")
    old.archive, clean.archive = str(tmp_path / "old"), str(tmp_path / "clean")
    ids = {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}

    def put(archive, name, seed, rec):
        p = Path(archive) / name / f"seed{seed}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(rec))

    put(old.archive, "grid-w32-far0.0-lawuniform", 0, _fake_run(100, 5, 0))
    put(clean.archive, "w32-far0", 0, {**_fake_run(100, 5, 0), "episode_ids": ids})
    name, cfg, cells, pending = lz.map_of_record(old, clean)
    assert name == "laziness.yaml" and pending is not None
    text = lz.write_report(cfg, cells, tmp_path, "cmd", pending, name).read_text()
    assert "is pending: 1 of 78 runs archived" in text
    assert "### The rerun on clean ids so far" in text
    # every one of the 78 runs archived (seeds 0-4 in the 0 % cells): the clean map is the map
    for job, seed in all_jobs(clean):
        put(clean.archive, job, seed, {**_fake_run(100, 5, seed), "episode_ids": ids})
    name, cfg, cells, pending = lz.map_of_record(old, clean)
    assert name == "laziness_clean.yaml" and pending is None
    assert len(cells[(32, "0%")]) == 5 and len(cells[(32, "1%")]) == 3
    block = lz.readme_block(cfg, cells, pending, name)
    assert "78 of the 78 runs laziness_clean.yaml lists" in block
    assert "clean episode ids 257–304" in block and "pending" not in block


def test_the_readme_states_the_committed_reading():
    # the README's paragraph on the regime study, and docs/studies.md's laziness map, are what
    # report.py and laziness.py write from the committed results (rerun both after committing a
    # run)
    report = script("report")
    laziness = report.L
    name, lcfg, cells, pending = laziness.map_of_record()
    block = report.readme_block(report.C.load_settings(), cells, report.load_far_shares(), pending)
    readme = (ROOT / "README.md").read_text()
    assert f"{report.README_BEGIN}\n{block}\n{report.README_END}" in readme
    assert laziness.STUDIES_PAGE == ROOT / "docs" / "studies.md"
    studies = laziness.STUDIES_PAGE.read_text()
    assert (
        f"{laziness.README_BEGIN}\n{laziness.readme_block(lcfg, cells, pending, name)}\n"
        f"{laziness.README_END}" in studies
    )
    # each block stands in one place only, so that no stale copy is left behind
    assert report.README_BEGIN not in studies and laziness.README_BEGIN not in readme


def test_the_committed_claims_and_map_are_what_the_archives_give(tmp_path):
    # CLAIMS.md and LAZINESS.md as committed are what claims.py and laziness.py write from the
    # committed results today (rerun both after a change to the rule or a new run)
    cl, lz = _claims_module(), _laziness_module()
    got = cl.write_report(cl.load_settings(), tmp_path, "python experiments/regime_study/claims.py")
    assert got.read_text() == (HERE / "CLAIMS.md").read_text()
    name, cfg, cells, pending = lz.map_of_record()
    got = lz.write_report(
        cfg, cells, tmp_path, "python experiments/regime_study/laziness.py", pending, name
    )
    assert got.read_text() == (HERE / "LAZINESS.md").read_text()


def test_the_map_of_record_is_the_clean_rerun_and_each_run_records_clean_ids():
    # issue 50: 72 + 6 runs, every JSON recording episode ids after the tokenizer's vocabulary
    lz = _laziness_module()
    name, cfg, cells, pending = lz.map_of_record()
    assert name == lz.CLEAN_MAP and pending is None
    files = sorted((HERE / "results" / "laziness_clean").glob("*/seed*.json"))
    assert len(files) == sum(len(v) for v in cells.values()) == 72 + 6
    for f in files:
        ids = json.loads(f.read_text())["episode_ids"]
        assert ids["first"] >= ids["tokenizer_vocab"] and ids["last"] >= ids["first"], f


def test_the_committed_reports_name_no_local_path():
    # generated reports say where their inputs are relative to the study, never as this
    # checkout's absolute path
    for md in sorted(HERE.glob("*.md")):
        assert str(ROOT) not in md.read_text(), md.name

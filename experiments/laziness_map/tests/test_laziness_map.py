"""The laziness map (experiments/laziness_map): the issue's grid, ρ* and its interval, the report
built from an archive, the map of record, one-line refusals of mixed id ranges, and the quick
map end to end (slow tier)."""

import json
import math

import pytest

from experiments.lab.cli import Study, main
from experiments.laziness_map import cells as lz
from experiments.laziness_map.report import readme_block, write_report
from experiments.tests.helpers import fake_run, put, run_study
from swax.core.errors import SwaxError
from swax.sweep import all_jobs, load_sweep, train_config

HERE = lz.HERE


def test_the_laziness_map_is_the_issues_grid():
    cfg = load_sweep(HERE / "laziness.yaml")
    T = cfg.base["seq_len"]
    axes = cfg.grid.axes
    assert sorted(w * 16 // T for w in axes["window.fixed+window.long"]) == [1, 2, 4]
    assert axes["data.synthetic.far_share"] == [0.0, 0.005, 0.01, 0.02, 0.05, 0.1, None]
    assert len(cfg.grid.seeds) >= 3 and cfg.archive and cfg.eval.bucket_samples >= 64
    assert lz.columns(cfg) == ["0%", "0.5%", "1%", "2%", "5%", "10%", "uniform", "power"]
    for name, point in cfg.grid_points.items():
        tc = train_config(cfg, name, cfg.seeds[0])
        w = point["window.fixed+window.long"]
        # the far threshold is the long window, which is the training window
        assert tc.window.fixed == tc.window.long == w
        if point["data.synthetic.far_share"] is not None:
            assert tc.data.synthetic.far_from == w
        assert tc.optim.schedule == "wsd"  # no decay before learning starts


def test_rho_star_reads_where_half_the_seeds_stay_lazy():
    # lazy shares 1, 1, 1/3 at 0, 1 %, 2 %: half is crossed at 1 % + 0.5 / (2/3) × 1 % = 1.75 %
    assert lz.rho_star([(0.0, 1.0), (0.01, 1.0), (0.02, 1 / 3)]).startswith("1.75% (between 1%")
    assert lz.rho_star([(0.0, 1 / 3), (0.01, 0.0)]).startswith("≤ 0%")
    assert lz.rho_star([(0.0, 1.0), (0.1, 2 / 3)]).startswith("> 10%")
    assert lz.rho_star([]) == "–"


def test_laziness_report_is_built_from_the_archive(tmp_path):
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
        p.write_text(json.dumps(fake_run(inside, beyond, seed)))
    cells = lz.load_cells(cfg)
    assert [r["kind"] for r in cells[(32, "0%")]] == ["lazy", "lazy"]
    assert sorted(r["kind"] for r in cells[(32, "10%")]) == ["lazy", "memory"]
    text = write_report(cfg, cells, tmp_path, "cmd").read_text()
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
    out = str(tmp_path / "r")
    args = ("run", "--quick", "--config", config, "--report-dir", out)
    r = run_study("experiments.laziness_map", *args, cwd=tmp_path)
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


def test_the_map_of_record_is_the_clean_map_once_every_run_is_archived(tmp_path):
    """Until the clean-id rerun is complete, the reports show the old map and say the rerun is
    pending (with its partial table); once complete, the clean map replaces it."""
    old, clean = load_sweep(HERE / "laziness.yaml"), load_sweep(HERE / "laziness_clean.yaml")
    old.archive, clean.archive = str(tmp_path / "old"), str(tmp_path / "clean")
    ids = {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}

    put(old.archive, "grid-w32-far0.0-lawuniform", 0, fake_run(100, 5, 0))
    put(clean.archive, "w32-far0", 0, {**fake_run(100, 5, 0), "episode_ids": ids})
    name, cfg, cells, pending = lz.map_of_record(old, clean)
    assert name == "laziness.yaml" and pending is not None
    text = write_report(cfg, cells, tmp_path, "cmd", pending, name).read_text()
    assert "is pending: 1 of 78 runs archived" in text
    assert "### The rerun on clean ids so far" in text
    # every one of the 78 runs archived (seeds 0-4 in the 0 % cells): the clean map is the map
    for job, seed in all_jobs(clean):
        put(clean.archive, job, seed, {**fake_run(100, 5, seed), "episode_ids": ids})
    name, cfg, cells, pending = lz.map_of_record(old, clean)
    assert name == "laziness_clean.yaml" and pending is None
    assert len(cells[(32, "0%")]) == 5 and len(cells[(32, "1%")]) == 3
    block = readme_block(cfg, cells, pending, name)
    assert "78 of the 78 runs laziness_clean.yaml lists" in block
    assert "clean episode ids 257–304" in block and "pending" not in block


def test_the_map_of_record_is_the_clean_rerun_and_each_run_records_clean_ids():
    # issue 50: 72 + 6 runs, every JSON recording episode ids after the tokenizer's vocabulary
    name, cfg, cells, pending = lz.map_of_record()
    assert name == lz.CLEAN_MAP and pending is None
    files = sorted((HERE / "results" / "laziness_clean").glob("*/seed*.json"))
    assert len(files) == sum(len(v) for v in cells.values()) == 72 + 6
    for f in files:
        ids = json.loads(f.read_text())["episode_ids"]
        assert ids["first"] >= ids["tokenizer_vocab"] and ids["last"] >= ids["first"], f


def test_rho_star_has_an_interval_that_moves_when_every_cell_agrees():
    # 3/3 at 0 and 1 %, 0/3 at 2 and 5 %: a bootstrap over seeds gives 1.5 % every time; the
    # per-cell posteriors do not (3 of 3 lazy is compatible with a lazy share of 46 %)
    cells = ((0.0, 3, 3), (0.01, 3, 3), (0.02, 0, 3), (0.05, 0, 3))
    lo, hi = lz.rho_star_posterior(cells, 20_000)
    assert lo < 0.01 < 0.015 < hi < 0.05
    # two cells, 3/3 at 0 and 0/3 at 1 %: rho* is 0 when the first share draws at or below 1/2
    # (P = I_.5(3.5, .5) = 0.0331 > 2.5 %), beyond the last share when both draw above it (P =
    # 0.967 x 0.0331 = 0.032 > 2.5 %), and symmetric about 0.5 % (swap p for 1 - p of the other
    # cell): the interval is [0, beyond 1 %] and the median 0.5 %
    row = ((0.0, 3, 3), (0.01, 0, 3))
    lo, med, hi = lz.rho_star_posterior(row, 20_000, 0, (0.025, 0.5, 0.975))
    assert lo == 0.0 and hi == math.inf and med == pytest.approx(0.005, abs=3e-4)


def test_a_table_of_mixed_id_ranges_is_refused_in_one_line(tmp_path, capsys):
    cfg = tmp_path / "map.yaml"
    text = (HERE / "laziness.yaml").read_text().split("\nquick:")[0]  # no quick overrides
    cfg.write_text(text.replace("archive: results/laziness", "archive: kept"))
    fake = {
        "seq_len": 256,
        "buckets": [],
        "laziness": {
            "inside_long": 100,
            "beyond_long": 5,
            "beyond_T": 5,
            "kind": "lazy",
            "chance": 6.25,
        },
    }
    for seed, ids in (
        (0, None),
        (1, {"task": "mqar", "first": 257, "last": 304, "tokenizer_vocab": 257}),
    ):
        p = tmp_path / "kept" / "grid-w32-far0.0-lawuniform" / f"seed{seed}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({**fake, **({"episode_ids": ids} if ids else {})}))
    sweep = load_sweep(cfg)
    study = Study(
        package="a map",
        here=tmp_path,
        configs=("map.yaml",),
        reports=lambda out: [write_report(sweep, lz.load_cells(sweep), out, "cmd")],
    )
    with pytest.raises(SystemExit) as e:
        main(study, ["report", "--report-dir", str(tmp_path / "r")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert "128–175 (old: 1 run" in err[0] and "257–304 (clean: 1 run" in err[0]
    with pytest.raises(SwaxError, match="mixes runs trained on different episode ids"):
        lz.load_cells(load_sweep(cfg))

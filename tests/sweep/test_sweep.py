"""Sweeps: config validation, grids, resumability, the archive, aggregation, stopping; the
window-size study's own tests are experiments/window_sweep/tests/."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from swax.core.errors import ConfigError
from swax.data import PackedLoader, build_datasets
from swax.data.config import DataConfig
from swax.data.mqar import mqar_ids
from swax.data.tokenizer import load_tokenizer
from swax.sweep import (
    aggregate,
    all_jobs,
    archive_path,
    emergence,
    episode_ids,
    load_sweep,
    mean_spread,
    run_dir,
    run_sweep,
    train_config,
)
from swax.sweep.archive import archive_result


def test_grid_points_expand_and_reuse_equal_runs(tmp_path):
    data = _tiny_sweep(tmp_path, {"w8": {"window": {"fixed": 8}}})
    data["grid"] = {
        "from_run": "w8",
        "axes": {"window.fixed": [8, 16], "model.mlstm_igate_bias_init": [-10, -3]},
        "labels": {"window.fixed": "w", "model.mlstm_igate_bias_init": "b"},
    }
    data["base"]["model"]["mlstm_igate_bias_init"] = -3
    cfg = load_sweep(_write(tmp_path, data))
    # (the YAML writer sorted the axes: the bias comes first)
    assert set(cfg.grid_runs) == {"grid-b-10-w8", "grid-b-3-w8", "grid-b-10-w16", "grid-b-3-w16"}
    assert cfg.grid_points["grid-b-10-w16"] == {
        "window.fixed": 16,
        "model.mlstm_igate_bias_init": -10,
    }
    assert cfg.aliases == {"grid-b-3-w8": "w8"}  # the same config as run w8
    assert run_dir(cfg, "grid-b-3-w8", 0) == run_dir(cfg, "w8", 0)
    tc = train_config(cfg, "grid-b-10-w16", 0)
    assert tc.window.fixed == 16 and tc.model.mlstm_igate_bias_init == -10
    jobs = all_jobs(cfg)
    assert jobs[0] == ("w8", 0) and ("grid-b-3-w8", 0) not in jobs and len(jobs) == 4
    cfg.grid.seeds = [0, 7]  # a grid seed the sweep's runs do not have: the shared run trains it
    assert ("w8", 7) in all_jobs(cfg) and len(all_jobs(cfg)) == 8
    data["grid"]["from_run"] = "nope"
    with pytest.raises(ConfigError, match="grid.from_run names unknown run 'nope'"):
        load_sweep(_write(tmp_path, data))


def test_grid_axes_tied_by_plus_and_excluded_points(tmp_path):
    data = _tiny_sweep(tmp_path, {"w8": {"window": {"fixed": 8}}})
    data["base"]["data"]["synthetic"].update(task="mqar", fraction=0.5, min_distance=2)
    tied = "window.fixed+data.synthetic.far_from"
    data["grid"] = {
        "from_run": "w8",
        "axes": {tied: [8, 16], "data.synthetic.far_share": [0.0, 0.5, None]},
        "labels": {tied: "w", "data.synthetic.far_share": "f"},
        "exclude": [{tied: 16, "data.synthetic.far_share": [0.5, None]}],
    }
    cfg = load_sweep(_write(tmp_path, data))
    names = set(cfg.grid_runs)
    assert len(names) == 4 and "grid-f0.5-w8" in names and "grid-f0.5-w16" not in names
    tc = train_config(cfg, "grid-f0.5-w8", 0)
    assert tc.window.fixed == tc.data.synthetic.far_from == 8  # one value, both keys
    assert tc.data.synthetic.far_share == 0.5
    assert train_config(cfg, "grid-fNone-w8", 0).data.synthetic.far_share is None
    data["grid"]["exclude"] = [{"window.fixed": 8}]
    with pytest.raises(ConfigError, match="grid.exclude names 'window.fixed'"):
        load_sweep(_write(tmp_path, data))


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
        "eval": {
            "length_multiples": [1, 2],
            "samples": 1,
            "ppl_multiples": [1],
            "ppl_samples": 1,
            "curve_multiples": [1],
            "curve_samples": 1,
            "probe_multiple": 1,
            "probe_samples": 1,
        },
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


@pytest.mark.parametrize(
    "section,key,value,needle",
    [
        ("eval", "samples", -1, "eval.samples must be >= 0, got -1"),
        ("eval", "length_multiples", [1, 0], "eval.length_multiples must be a positive"),
        ("eval", "ppl_samples", -1, "eval.ppl_samples must be >= 0, got -1"),
        ("eval", "probe_window", 0, "eval.probe_window must be a positive integer"),
        ("eval", "batch_size", 0, "eval.batch_size must be a positive integer"),
        ("eval", "seed", -3, "eval.seed must be >= 0, got -3"),
        (None, "seeds", [], "seeds must name at least one seed"),
        (None, "seeds", [-1], "seeds must be >= 0, got -1"),
        (None, "jobs", 0, "jobs must be a positive integer, got 0"),
        ("grid", "seeds", [-2], "grid.seeds must be >= 0, got -2"),
        ("eval", "episodes", {"min_distance": -1}, "eval.episodes of sweep run a: "),
    ],
)
def test_sweep_numbers_are_checked_when_loaded(tmp_path, section, key, value, needle):
    # these reached the evaluation (or an IndexError) before: seeds [] crashed in load_sweep
    data = _tiny_sweep(tmp_path, {"a": {}})
    (data.setdefault(section, {}) if section else data)[key] = value
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_sweep(_write(tmp_path, data))


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
    # learning curves read every kept checkpoint; the probe has its four settings
    w8 = first["w8"][0]
    assert [p["step"] for p in w8["curve"]] == [1, 2]
    assert [p["tokens"] for p in w8["curve"]] == [2 * 64, 2 * 2 * 64]
    assert set(w8["probe"]) == {"full", "window_cut", "reset", "both"}
    assert w8["deploy"] == "train" and first["x"][0]["deploy"] == "long"
    # the curve of the final checkpoint is the final model's recall (same weights, same
    # episodes), computed from the checkpoint's safetensors
    assert w8["curve"][-1]["acc"]["64"] == w8["episodes_train"]["64"]["acc"]
    # an interrupted run (checkpoint, no summary) is resumed, not restarted
    rd = run_dir(cfg, "w8", 0)
    (rd / "summary.json").unlink()
    (rd / "eval.json").unlink()
    run_sweep(cfg, only=["w8"], progress=False)
    log = (rd / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(ln)["step"] for ln in log if '"step"' in ln]
    assert steps.count(1) == 1  # step 1 was not trained a second time


def test_the_archive_keeps_each_finished_run_and_the_sweep_resumes_from_it(tmp_path):
    """A run's committed result (archive/NAME/seedS.json) is written once it is evaluated;
    with the run folders gone (another machine, a fresh clone) the sweep trains nothing and
    returns the archived results. The bucket stage evaluates recall by distance."""
    data = _tiny_sweep(
        tmp_path, {"m": {"data": {"synthetic": {"task": "mqar", "min_distance": 2}}}}
    )
    data["archive"] = "kept"
    data["eval"]["bucket_samples"] = 2
    data["eval"]["bucket_far"] = [2]
    cfg = load_sweep(_write(tmp_path, data))
    first = run_sweep(cfg, progress=False)["m"][0]
    kept = tmp_path / "kept" / "m" / "seed0.json"  # relative to the sweep YAML
    assert archive_path(cfg, "m", 0) == kept and kept.is_file()
    saved = json.loads(kept.read_text())
    assert saved["summary"]["steps"] == 2 and saved["summary"]["tokens"] == 2 * 2 * 64
    rows = first["buckets"]
    assert [(r["lo"], r["hi"]) for r in rows] == [(0, 8), (8, 64), (64, 128)]
    assert all(r["n"] == 2 and set(r["probes"]) == {"window_cut", "reset"} for r in rows)
    assert first["laziness"]["kind"] in ("lazy", "memory", "partial", "none")
    # the episode ids it trained with: the range the training loader hands out, read from the
    # loader's own episodes (the byte tokenizer's 257 ids come first, so no text emits them)
    tc = train_config(cfg, "m", 0)
    tok = load_tokenizer("byte")
    train_ds, _ = build_datasets(DataConfig(), tok, seq_len=1, seed=0)
    loader = PackedLoader(train_ds, 64, 2, synthetic=tc.data.synthetic, tokenizer=tok)
    ids = np.concatenate(mqar_ids(loader.synthetic))
    assert saved["episode_ids"] == {
        "task": "mqar",
        "first": int(ids.min()),
        "last": int(ids.max()),
        "tokenizer_vocab": 257,
    }
    assert int(ids.min()) >= 257 and len(ids) == int(ids.max()) - int(ids.min()) + 1
    shutil.rmtree(tmp_path / "out")
    again = run_sweep(cfg, progress=False)["m"][0]
    assert not (tmp_path / "out").exists()  # nothing trained or evaluated
    assert again == saved


def test_the_archive_records_the_episode_ids_of_each_kind_of_run(tmp_path):
    """Set ids (the legacy 128-175), needle episodes (the tokenizer's own ids) and a run with
    no episodes: each archived result says which."""
    data = _tiny_sweep(tmp_path, {
        "legacy": {"data": {"synthetic": {"task": "mqar", "mqar_first_id": 128,
                                          "mqar_keys": 8, "mqar_values": 8, "mqar_noise": 4}}},
        "needle": {"data": {"synthetic": {"task": "needle"}}},
        "text": {"data": {"synthetic": {"fraction": 0.0}}},
    })  # fmt: skip
    cfg = load_sweep(_write(tmp_path, data))
    got = {n: episode_ids(train_config(cfg, n, 0)) for n in cfg.runs}
    assert got["legacy"] == {
        "task": "mqar",
        "first": 128,
        "last": 128 + 8 + 8 + 4 - 1,
        "tokenizer_vocab": 257,
    }
    assert got["needle"] == {"task": "needle"} and got["text"] is None
    path = tmp_path / "a" / "seed0.json"
    archive_result(path, {"x": 1}, {"steps": 2, "other": 3}, got["legacy"])
    assert json.loads(path.read_text()) == {
        "x": 1,
        "summary": {"steps": 2},
        "episode_ids": got["legacy"],
    }


def test_mean_spread_and_aggregate():
    assert mean_spread([1.0, 3.0]) == (2.0, 1.0)
    curve = lambda accs: [  # noqa: E731
        {"step": s, "tokens": 100 * s, "acc": {"32": a}, "nll": {"32": 1.0}}
        for s, a in zip((1, 2, 3), accs)
    ]
    ev = lambda acc, nll, loss, accs: {  # noqa: E731
        "val_loss": loss,
        "pattern": "SXSX",
        "windows": {"long": 32, "train": 8},
        "deploy": "train",
        "text_loss": {"long": loss + 1},
        "episodes_long": {"32": {"acc": acc, "nll": nll}, "64": {"acc": acc / 2, "nll": nll}},
        "episodes_train": {"32": {"acc": 1.0, "nll": 9.0}, "64": {"acc": 3.0, "nll": 9.0}},
        "curve": curve(accs),
        "probe": {"full": {"acc": acc, "nll": nll}, "reset": {"acc": 0.0, "nll": 3.0}},
    }
    agg = aggregate({"r": [ev(50.0, 1.0, 2.0, [10, 60, 90]), ev(70.0, 2.0, 2.2, [10, 20, 30])]})[
        "r"
    ]
    assert agg["episodes_long"][32] == (60.0, 10.0)
    assert agg["episodes_long"][64] == (30.0, 5.0)
    assert agg["nll_long"][32] == (1.5, 0.5)
    assert agg["episodes_deploy"] == {32: (1.0, 0.0), 64: (3.0, 0.0)}  # the training window
    assert agg["val_loss"][0] == pytest.approx(2.1)
    assert agg["text_loss_long"][0] == pytest.approx(3.1)
    assert agg["curve"][32] == [(100, (10.0, 0.0)), (200, (40.0, 20.0)), (300, (60.0, 30.0))]
    assert agg["emergence"] == [200, None]  # first checkpoint at >= 50%, per seed
    assert agg["probe"] == {"full": (60.0, 10.0), "reset": (0.0, 0.0)}
    assert emergence(curve([49.9, 50.0, 10]), "32") == 200


def _processes_with(tag: str) -> list[int]:
    """Pids of the processes whose environment holds ``tag`` (this test's own)."""
    import os

    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if tag.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_sigterm_to_a_parallel_sweep_stops_its_runs_and_it_resumes(tmp_path):
    """SIGTERM to the sweep's process alone (a scheduler's stop): its worker processes stop
    too, each training run with a checkpoint, no process is left behind, and the same command
    then finishes the sweep from those checkpoints."""
    import os
    import secrets
    import signal
    import time

    data = _tiny_sweep(tmp_path, {"a": {"window": {"fixed": 8}}, "b": {"window": {"fixed": 16}}})
    data["base"].update(steps=400, seq_len=64)
    data["base"]["checkpoint"] = {"every": 20}
    data["base"]["log"] = {"every": 1, "val_every": 0, "val_batches": 1}
    data["jobs"] = 2
    path = _write(tmp_path, data)
    tag = f"SWAX_SWEEP_TEST={secrets.token_hex(8)}"
    env = {**os.environ, tag.split("=")[0]: tag.split("=")[1]}
    cmd = [sys.executable, "-m", "swax", "sweep", str(path)]
    log = tmp_path / "sweep.log"  # a file, not a pipe: a full pipe would block the runs
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=fh, stderr=fh)
    metrics = [tmp_path / "out" / "runs" / f"{n}-s0" / "metrics.jsonl" for n in ("a", "b")]
    t0 = time.time()
    while not all(m.is_file() and m.read_text().count('"loss"') >= 30 for m in metrics):
        assert proc.poll() is None and time.time() - t0 < 900, log.read_text()[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # to the sweep's own process only
    assert proc.wait(timeout=600) != 0
    err = log.read_text()
    deadline = time.time() + 60
    while _processes_with(tag) and time.time() < deadline:
        time.sleep(0.2)
    assert _processes_with(tag) == [], err[-2000:]  # no orphaned worker
    for name in ("a", "b"):  # each run stopped at a step boundary with its checkpoint
        assert f"swax sweep: {name} seed 0: stopped by SIGTERM after step" in err, err[-2000:]
    for m in metrics:
        assert any((m.parent / "checkpoints").glob("step_*")) and not (m.parent / "model").exists()
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("resumed from step_") == 2
    for m in metrics:
        assert (m.parent / "eval.json").is_file()


def test_copy_probe_keys_are_checked_by_name(tmp_path):
    data = _tiny_sweep(tmp_path, {"w8": {"window": {"fixed": 8}}})
    data["eval"] = {"copy_events": 8, "copy_heldout_tokens": 60000}
    assert load_sweep(_write(tmp_path, data)).eval.copy_heldout_tokens == 60000
    data["eval"]["copy_heldout_tokens"] = -1
    with pytest.raises(ConfigError, match="copy_heldout_tokens"):
        load_sweep(_write(tmp_path, data))


def test_a_study_scripts_entry_point_exits_with_one_line(capsys):
    from swax.sweep import run_script

    def raising(exc):
        def main():
            raise exc

        return main

    stopped = KeyboardInterrupt("stopped by SIGTERM after step 3")
    stopped.reported, stopped.exit_code = True, 143

    cases = [
        (lambda: 3, 3, ""),
        (raising(ConfigError("window=0: must be >= 1")), 2, "error: window=0: must be >= 1\n"),
        (raising(KeyboardInterrupt()), 130, "interrupted: finished runs are kept"),
        (raising(stopped), 143, ""),  # a run's stop, its line printed already
    ]
    for main, code, err in cases:
        with pytest.raises(SystemExit) as e:
            run_script(main)
        assert e.value.code == code
        got = capsys.readouterr().err
        assert got.startswith(err) and got.count("\n") == (1 if err else 0)

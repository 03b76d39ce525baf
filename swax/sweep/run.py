"""Running a sweep: train every run (unless finished), evaluate it stage by stage (each stage
cached in the run's ``eval.json``), in this process or in ``jobs`` worker processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from safetensors.torch import load_file

from swax.core.errors import ConfigError, SwaxError
from swax.core.threads import applied_threads, auto_threads, last_setting, set_threads
from swax.data import DataConfig, build_datasets, load_model_tokenizer
from swax.eval.ppl import bucketize, position_losses
from swax.eval.recall import recall_by_window
from swax.model import SwaxLM
from swax.probes.buckets import chance_of, distance_buckets, recall_by_bucket, verdict
from swax.probes.episodes import episode_accuracy
from swax.sweep.archive import archive_result, episode_ids, provenance
from swax.sweep.config import (
    EvalSpec,
    SweepConfig,
    archive_path,
    episode_config,
    grid_seeds,
    run_dir,
    train_config,
)
from swax.sweep.copystages import CopyStages
from swax.train import train
from swax.train.checkpoint import latest_checkpoint, list_checkpoints


def _train_one(cfg: SweepConfig, name: str, seed: int) -> dict:
    tcfg = train_config(cfg, name, seed)
    rd = Path(tcfg.run_dir)
    if (rd / "summary.json").is_file() and (rd / "model").is_dir():
        return json.loads((rd / "summary.json").read_text())
    if latest_checkpoint(rd) is not None:
        tcfg = tcfg.replace(resume=True)
    elif rd.exists():
        tcfg = tcfg.replace(overwrite=True)  # an unfinished run without a checkpoint
    return train(tcfg)


STAGES = (
    "recall",
    "text_loss",
    "ppl",
    "curve",
    "probe",
    "buckets",
    "emergence",
    "copies",
    "copy_curve",
    "passkey",
)
"""Evaluation stages, each cached in the run's eval.json once done (a cache from an older
version of the sweep is completed with the missing stages, not redone)."""


def evaluate_run(cfg: SweepConfig, name: str, seed: int, progress: bool = False) -> dict:
    """Evaluate one finished run, stage by stage (see STAGES), cached in its eval.json:
    episodes at every length (long window, and training window where different), held-out
    text loss at the training length with each window, loss by position, recall at every kept
    checkpoint (learning curves) and the mechanism probe."""
    tcfg = train_config(cfg, name, seed)
    rd = Path(tcfg.run_dir)
    cache = rd / "eval.json"
    out = json.loads(cache.read_text()) if cache.is_file() else {}
    ev = cfg.eval
    todo = [st for st in STAGES if _wanted(ev, st) and not _done(out, st)]
    if not todo:
        return out
    model, tok = load_run_model(tcfg)
    train_ds, val = run_texts(tcfg, tok)
    windows = {"long": tcfg.window.long}
    train_w = tcfg.window.train_window
    if ev.train_window and train_w != tcfg.window.long and model.config.window_layers:
        windows["train"] = train_w
    # The window a run is used with: its own fixed window, or the long one after a stochastic
    # schedule (which ends on it); learning curves and the probe read recall there.
    deploy = "train" if tcfg.window.kind == "fixed" and "train" in windows else "long"
    ctx = _EvalContext(cfg, tcfg, model, tok, val.tokens, windows, windows[deploy], progress)
    ctx.train_tokens = train_ds.tokens
    t0 = time.perf_counter()
    for stage in todo:
        out.update(getattr(ctx, stage)())
        out.update(
            name=name,
            seed=seed,
            windows=windows,
            deploy=deploy,
            pattern=model.config.layer_types,
            seq_len=tcfg.seq_len,
        )
        if deploy in out.get("text_loss", {}):  # the run's quality: text at its own window
            out["text_val_loss"] = out["text_loss"][deploy]
        summary = json.loads((rd / "summary.json").read_text())
        out["val_loss"] = summary["final_val_loss"]
        out["train_elapsed_s"] = summary.get("elapsed")
        out["eval_elapsed_s"] = out.get("eval_elapsed_s", 0.0) + time.perf_counter() - t0
        t0 = time.perf_counter()
        cache.write_text(json.dumps(out, indent=1))
    return json.loads(cache.read_text())  # the same form as a cached result (string keys)


def load_run_model(tcfg) -> tuple[SwaxLM, object]:
    """A finished run's model (in eval mode) and tokenizer, from its ``model`` folder."""
    folder = Path(tcfg.run_dir) / "model"
    return SwaxLM.from_pretrained(folder).eval(), load_model_tokenizer(folder)


def run_texts(tcfg, tok):
    """(training set, held-out set) of a run's data config, as its evaluation reads them."""
    data_cfg = DataConfig(
        source=tcfg.data.source,
        format=tcfg.data.format,
        field=tcfg.data.field,
        tokenizer=tcfg.data.tokenizer,
        val_source=tcfg.data.val_source,
        val_fraction=tcfg.data.val_fraction,
    )
    return build_datasets(data_cfg, tok, seq_len=1, seed=0)


def _wanted(ev: EvalSpec, stage: str) -> bool:
    return {
        "recall": ev.samples > 0,
        "text_loss": ev.text_samples > 0,
        "ppl": ev.ppl_samples > 0 and bool(ev.ppl_multiples),
        "curve": bool(ev.curve_multiples),
        "probe": ev.probe_multiple > 0,
        "buckets": ev.bucket_samples > 0,
        "emergence": ev.emergence_samples > 0,
        "copies": ev.copy_events > 0,
        "copy_curve": ev.copy_curve_events > 0,
        "passkey": ev.passkey_trials > 0,
    }[stage]


def _done(out: dict, stage: str) -> bool:
    keys = {
        "recall": ["episodes_long"],
        "text_loss": ["text_loss"],
        "ppl": ["ppl", "ppl_done"],
        "curve": ["curve"],
        "probe": ["probe"],
        "buckets": ["buckets"],
        "emergence": ["emergence"],
        "copies": ["copies"],
        "copy_curve": ["copy_curve"],
        "passkey": ["passkey"],
    }[stage]
    return any(k in out for k in keys)


class _EvalContext(CopyStages):
    """The pieces every evaluation stage of one run needs; one method per stage, each
    returning the keys it adds to eval.json."""

    def __init__(self, cfg, tcfg, model, tok, val_tokens, windows, deploy_window, progress):
        self.cfg, self.tcfg, self.model, self.tok = cfg, tcfg, model, tok
        self.val, self.windows, self.progress = val_tokens, windows, progress
        self.deploy_window = deploy_window
        self.ev = cfg.eval
        self.ep_cfg = episode_config(cfg, tcfg)

    def _episodes(self, model, lengths, samples, window, **kw) -> dict:
        res = episode_accuracy(
            model,
            self.tok,
            self.val,
            lengths,
            samples,
            self.ep_cfg,
            window=window,
            seed=self.ev.seed,
            progress=self.progress,
            batch_size=self.ev.batch_size,
            **kw,
        )
        return {str(k): v for k, v in res.items()}

    def recall(self) -> dict:
        lengths = [m * self.tcfg.seq_len for m in self.ev.length_multiples]
        return recall_by_window(
            self.model,
            self.tok,
            self.val,
            self.ep_cfg,
            lengths,
            self.ev.samples,
            self.windows,
            seed=self.ev.seed,
            batch_size=self.ev.batch_size,
            progress=self.progress,
        )

    def text_loss(self) -> dict:
        """Held-out text at the training length, with each evaluation window."""
        n = self.tcfg.seq_len + 1
        return {
            "text_loss": {
                label: float(
                    position_losses(
                        self.model, self.val, n, self.ev.text_samples, w, progress=False
                    ).mean()
                )
                for label, w in self.windows.items()
            }
        }

    def ppl(self) -> dict:
        edges = [m * self.tcfg.seq_len for m in self.ev.ppl_multiples]
        if len(self.val) < edges[-1]:
            return {"ppl_done": True}
        losses = position_losses(
            self.model,
            self.val,
            edges[-1],
            self.ev.ppl_samples,
            self.windows["long"],
            progress=self.progress,
        )
        return {"ppl": bucketize(losses, edges), "ppl_done": True}

    def curve(self) -> dict:
        """Recall (the run's own window) at every kept checkpoint: what it learned when."""
        lengths = [m * self.tcfg.seq_len for m in self.ev.curve_multiples]
        points = []
        per_step = self.tcfg.batch_size * self.tcfg.seq_len
        for ckpt in list_checkpoints(self.tcfg.run_dir):
            step = int(ckpt.name.split("_")[1])
            model = _checkpoint_model(self.model.config, ckpt)
            res = self._episodes(model, lengths, self.ev.curve_samples, self.deploy_window)
            points.append(
                {
                    "step": step,
                    "tokens": step * per_step,
                    "acc": {k: v["acc"] for k, v in res.items()},
                    "nll": {k: v["nll"] for k, v in res.items()},
                }
            )
        return {"curve": points}

    def probe(self) -> dict:
        """Recall at probe_multiple × the training length with the run's own window, with the
        window cut, with the recurrent state reset after the needle, and with both."""
        length = [self.ev.probe_multiple * self.tcfg.seq_len]
        cut = self.ev.probe_window or self.tcfg.window.short
        own = self.deploy_window
        n = self.ev.probe_samples
        out = {}
        for label, w, reset in (
            ("full", own, False),
            ("window_cut", cut, False),
            ("reset", own, True),
            ("both", cut, True),
        ):
            r = self._episodes(self.model, length, n, w, reset_recurrent=reset)[str(length[0])]
            out[label] = {"acc": r["acc"], "nll": r["nll"], "n": r["n"]}
        return {"probe": out, "probe_window": cut}

    def buckets(self) -> dict:
        """Recall by distance bucket of the run's windows (swax.probes.buckets), with the run's
        own window, the window cut to probe_window (default window.short) and the recurrent
        reset; the laziness verdict."""
        w, T = self.tcfg.window, self.tcfg.seq_len
        buckets = distance_buckets(w.short, w.long, T, tuple(self.ev.bucket_far))
        rows = recall_by_bucket(
            self.model,
            self.tok,
            self.val,
            self.ep_cfg,
            buckets,
            self.ev.bucket_samples,
            self.deploy_window,
            probe_window=self.ev.probe_window or w.short,
            seed=self.ev.seed,
            batch_size=self.ev.batch_size,
            progress=self.progress,
        )
        return {"buckets": rows, "laziness": verdict(rows, chance_of(self.ep_cfg), T)}

    def _checkpoints(self) -> list[tuple[int, object]]:
        """(step, a function loading its model) of every kept checkpoint, and of the final
        model when no checkpoint was kept at the last step."""
        models = [
            (int(c.name.split("_")[1]), lambda c=c: _checkpoint_model(self.model.config, c))
            for c in list_checkpoints(self.tcfg.run_dir)
        ]
        if not models or models[-1][0] < self.tcfg.steps:
            models.append((self.tcfg.steps, lambda: self.model))
        return models

    def emergence(self) -> dict:
        """Recall in (W_long, T] at every kept checkpoint and the final model, with the run's
        own window, the window cut and the recurrent reset: when the memory took over."""
        w, T = self.tcfg.window, self.tcfg.seq_len
        far = [b for b in distance_buckets(w.short, w.long, T, ()) if b.key == "long_T"]
        per_step = self.tcfg.batch_size * self.tcfg.seq_len
        points = []
        for step, load in self._checkpoints():
            row = recall_by_bucket(
                load(),
                self.tok,
                self.val,
                self.ep_cfg,
                far,
                self.ev.emergence_samples,
                self.deploy_window,
                probe_window=self.ev.probe_window or w.short,
                seed=self.ev.seed,
                batch_size=self.ev.batch_size,
            )[0]
            points.append(
                {
                    "step": step,
                    "tokens": step * per_step,
                    "n": row["n"],
                    "acc": row["acc"],
                    "cut": row["probes"]["window_cut"]["acc"],
                    "reset": row["probes"]["reset"]["acc"],
                }
            )
        return {"emergence": {"bucket": far[0].label if far else "", "points": points}}


def _checkpoint_model(config, ckpt: Path):
    """The model weights of a training checkpoint (safetensors), in a fresh SwaxLM."""
    model = SwaxLM(config)
    sd = {
        k: v
        for k, v in load_file(str(ckpt / "model.safetensors")).items()
        if not k.startswith("__rng__.")
    }
    model.load_state_dict(sd)
    return model.eval()


def all_jobs(cfg: SweepConfig, only: list[str] | None = None) -> list[tuple[str, int]]:
    """(name, seed) of every run to train and evaluate: the sweep's runs (each variant once
    before the second seed), then the grid points that are not sweep runs."""
    names = list(cfg.runs) if not only else only
    unknown = [n for n in names if n not in cfg.runs and n not in cfg.grid_runs]
    if unknown:
        raise ConfigError(
            f"unknown sweep run {unknown[0]!r}; the sweep has {', '.join(cfg.runs)}"
            + (f" and grid points {', '.join(cfg.grid_runs)}" if cfg.grid_runs else "")
        )
    jobs = [(n, s) for s in cfg.seeds for n in names if n in cfg.runs]
    grid = [n for n in cfg.grid_runs if not only or n in only]
    for s in grid_seeds(cfg):
        for n in grid:
            job = (cfg.aliases.get(n, n), s)  # a grid point equal to a run is that run
            if job not in jobs:
                jobs.append(job)
    return jobs


def _job(
    cfg: SweepConfig, name: str, seed: int, threads: int | None, worker: bool = False
) -> tuple[str, int, dict]:
    """Train (unless done) and evaluate one run; the unit of work of a parallel sweep."""
    if threads is not None:  # a worker of a parallel sweep; serial runs keep the command's
        set_threads(threads)
    kept = archive_path(cfg, name, seed)
    if kept is not None and kept.is_file():
        return name, seed, json.loads(kept.read_text())
    try:
        summary = _train_one(cfg, name, seed)
        out = evaluate_run(cfg, name, seed)
        if kept is not None:
            tcfg = train_config(cfg, name, seed)
            archive_result(kept, out, summary, episode_ids(tcfg), provenance(tcfg))
        return name, seed, out
    except KeyboardInterrupt as e:  # stopped by a signal (its checkpoint saved): a worker
        if not worker:  # process ends here, so that it starts no other run of the sweep
            raise
        print(f"swax sweep: {name} seed {seed}: {e or 'interrupted'}", file=sys.stderr, flush=True)
        os._exit(getattr(e, "exit_code", 130))


def run_sweep(
    cfg: SweepConfig, only: list[str] | None = None, progress: bool = True, jobs: int | None = None
) -> dict:
    """Train and evaluate every (variant, seed) and grid point; return {name: [eval dict per
    seed]} (grid points included, under their grid names). ``jobs`` (default cfg.jobs) runs
    that many at once, each in a fresh process."""
    todo = all_jobs(cfg, only)
    jobs = jobs or cfg.jobs
    # each worker process: the base's threads, else the command's choice split among the jobs
    # (auto watches the others' load once, here, before the workers add theirs)
    threads = cfg.base.get("threads") or None
    if jobs > 1 and threads in (None, "auto"):
        threads = auto_threads(jobs)[0] if last_setting() in (None, "auto") else applied_threads()
    t0 = time.perf_counter()
    done: dict[tuple[str, int], dict] = {}

    def report(i, name, seed, what):
        if progress:
            print(
                f"[{i}/{len(todo)}] {name} seed {seed} {what} | "
                f"{(time.perf_counter() - t0) / 60:.1f} min",
                flush=True,
            )

    if jobs <= 1:
        for i, (name, seed) in enumerate(todo, 1):
            cached = (run_dir(cfg, name, seed) / "eval.json").is_file()
            report(i, name, seed, "(cached, completing)" if cached else "started")
            done[(name, seed)] = _job(cfg, name, seed, None)[2]
    else:
        pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"))
        try:
            with _stop_raises():
                futures = {pool.submit(_job, cfg, n, s, threads, True): (n, s) for n, s in todo}
                for i, fut in enumerate(as_completed(futures), 1):
                    name, seed, out = fut.result()
                    done[(name, seed)] = out
                    report(i, name, seed, "done")
        except BaseException:
            _stop_workers(pool)
            raise
        pool.shutdown()
    names = [n for n in cfg.runs if not only or n in only]
    results = {n: [done[(n, s)] for s in cfg.seeds] for n in names}
    for name in cfg.grid_runs:  # a grid point equal to a sweep run reads that run
        if not only or name in only:
            src = cfg.aliases.get(name, name)
            results[name] = [done[(src, s)] for s in grid_seeds(cfg)]
    return results


class _stop_raises:  # noqa: N801
    """SIGTERM raises KeyboardInterrupt in the sweep's main process while the block runs (as
    Ctrl-C does), so that a scheduler's stop reaches the runs instead of orphaning them."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():

            def raise_stop(signum, frame):
                raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

            self.old = signal.signal(signal.SIGTERM, raise_stop)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


def _stop_workers(pool, grace: float = 300.0) -> None:
    """Stop a sweep's worker processes: no new run starts, each running one gets SIGTERM (it
    saves a checkpoint at its next step and stops, so the sweep resumes it), and any still
    alive after ``grace`` seconds is killed."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown clears it
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def run_script(main) -> None:
    """A study script's entry point: exit with ``main()``'s code; a SwaxError is one line
    (``error: ...``) and exit 2, an interruption one line and exit 130 (a sweep keeps its
    finished runs and the running ones' checkpoints, so the same command continues)."""
    try:
        sys.exit(main())
    except SwaxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:  # Ctrl-C, or a training run stopped by a signal
        if not getattr(e, "reported", False):  # a run's own stop line was printed already
            print(
                "interrupted: finished runs are kept; run the same command to continue",
                file=sys.stderr,
            )
        sys.exit(getattr(e, "exit_code", 130))

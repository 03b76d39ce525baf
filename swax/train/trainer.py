"""The training loop: fixed or stochastic windows, one CPU process or many GPUs via torchrun.

    from swax.train import load_train_config, train
    result = train(load_train_config("configs/tiny.yaml", ["steps=200"]))

Every step: the window schedule gives the step's window (identical on all ranks); each rank
runs its micro-batches (gradient accumulation) with the loss normalised by the *global* number
of target tokens, so any world size and accumulation gives the same update for the same global
batch; the gradient norm is clipped; AdamW steps. Rank 0 logs (progress bar or lines,
``metrics.jsonl``, TensorBoard when installed) and writes checkpoints and the final model.

The parts: :mod:`swax.train.build` makes the run (folder, data, model, optimizer, schedules,
the checkpoint it resumes from) as a :class:`~swax.train.build.RunState`;
:mod:`swax.train.step` is one optimizer step and the validation loss;
:mod:`swax.train.guard` the verdict on each step (step, skip, roll back, stop);
:mod:`swax.train.logger` the rank-0 output. This module runs the steps, acts on the guard's
verdicts, reports the steps, stops at a step boundary on a signal, and finishes the run (final
checkpoint, exported model, summary).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

import torch

from swax.core.errors import ConfigError
from swax.data import save_tokenizer
from swax.data.jsonl import json_safe
from swax.model import SwaxLM
from swax.train import distributed as D
from swax.train.build import RunState, param_groups, restore, setup_run
from swax.train.config import TrainConfig
from swax.train.guard import Verdict
from swax.train.logger import fmt_time
from swax.train.monitor import LazinessMonitor
from swax.train.runctl import RunLock, StopSignals, TrainingStopped
from swax.train.schedules import window_schedule
from swax.train.step import TrainingError, evaluate, train_step

__all__ = [
    "RunState",
    "TrainingError",
    "evaluate",
    "finish",
    "param_groups",
    "run_steps",
    "setup_run",
    "train",
    "train_step",
    "window_schedule",
]


def train(cfg: TrainConfig, on_step_end: Callable[[int, dict], None] | None = None) -> dict:
    """Run the training described by ``cfg``; return a summary (losses, tokens/s, paths;
    ``steps_run``: the optimizer steps this call took, steps that a guard rollback undid and
    trained again counted each time; 0 when it resumed a finished run).

    ``on_step_end(step, record)`` is called after every optimizer step (1-based step) with the
    step's metrics; an exception raised there stops the run like an interruption would.
    """
    info = D.setup(cfg.device, cfg.dist.backend, cfg.dist.timeout_s)
    lock = RunLock(cfg.run_dir)
    try:
        _lock_run_dir(lock, info)
        run = setup_run(cfg, info)
        try:
            with StopSignals() as run.stop:
                run_steps(run, on_step_end)
                return finish(run)
        finally:
            run.ckpts.settle()
            run.logger.close()
    finally:
        lock.release()
        D.teardown()


def _lock_run_dir(lock: RunLock, info: D.DistInfo) -> None:
    """Rank 0 takes the run folder's lock; every rank learns whether it got it, so that all
    stop with the same error instead of waiting for rank 0 at a barrier."""
    error = None
    if info.is_main:
        try:
            lock.acquire()
        except (ConfigError, OSError) as e:  # every rank must learn it, or they wait forever
            error = str(e)
    error = D.broadcast_object(error)
    if error is not None:
        raise ConfigError(error)


def _report_step(run: RunState, record: dict) -> None:
    """Progress output of a finished step; every log.every steps (and the first and last of
    this process) also throughput, MFU and ETA, added to the record."""
    cfg, done, clock, tokens_seen = run.cfg, record["step"], run.clock, run.progress.tokens_seen
    text = f"loss {record['loss']:.4f} | window {record['window']}"
    if not (done % cfg.log.every == 0 or done == cfg.steps or done == run.progress.start_step + 1):
        run.logger.progress(done, text, line=False)
        return
    now = time.perf_counter()
    dt = max(now - clock.t_last, 1e-9)
    tokens = tokens_seen - clock.tok_last if clock.tok_last else run.tokens_per_step
    tps = tokens / dt
    window = run.sched(done - 1)  # schedules are pure functions of the step
    achieved = run.net.raw.flops_per_token(cfg.seq_len, window) * tps
    run.out.peak.cover(achieved)
    mfu = achieved / run.out.peak.flops
    eta = (cfg.steps - done) * run.tokens_per_step / max(tps, 1e-9)
    record.update(tok_s=tps, mfu=mfu, elapsed=run.progress.elapsed0 + now - clock.t_start)
    run.logger.progress(
        done,
        f"{text} | lr {record['lr']:.2e} | {tps:,.0f} tok/s | MFU {mfu:.1%} | ETA {fmt_time(eta)}",
        line=True,
    )
    clock.t_last, clock.tok_last = now, tokens_seen
    auto = run.out.auto_threads
    changed = auto.check() if auto is not None else None
    if changed:
        run.logger.message(f"step {done}: {changed}")


def _start(run: RunState) -> None:
    """The loop's start: the validation loss before training (a fresh run), the clocks."""
    cfg, logger, summary = run.cfg, run.logger, run.progress.summary
    run.clock.t_start = time.perf_counter()
    run.progress.resumed_at = run.progress.start_step
    if run.progress.start_step == 0:
        summary["initial_val_loss"] = evaluate(run)
        if run.data.val_loader is not None:
            logger.message(f"validation loss before training: {summary['initial_val_loss']:.4f}")
            if cfg.data.synthetic.fraction >= 1:
                logger.message(
                    "note: the validation loss is on held-out text, and this run trains only on "
                    "retrieval episodes (data.synthetic.fraction = 1): it is expected to rise"
                )
        logger.write({"step": 0, "val_loss": summary["initial_val_loss"]})
    run.net.model.train()
    run.clock.t_last, run.clock.tok_last = time.perf_counter(), 0


def run_steps(run: RunState, on_step_end: Callable[[int, dict], None] | None = None) -> None:
    """Steps ``start_step`` … ``steps - 1``, with validation, metrics and checkpoints on their
    schedules; each step's guard verdict acted on (a skipped step is tried again, a rollback
    restores the newest checkpoint, a stop is a TrainingError). A SIGINT or SIGTERM
    (``run.stop``) stops the loop at the next step boundary with a checkpoint of the last
    finished step: see :func:`_stop_at`."""
    cfg, logger = run.cfg, run.logger
    _start(run)
    done = saved = run.progress.start_step
    while done < cfg.steps:
        if _stop_requested(run):
            _stop_at(run, done, saved)
        record, verdict = train_step(run, done)
        if verdict.skipped:
            _log_skipped(run, record, verdict)
        if verdict.action == "stop":
            raise TrainingError(verdict.why)
        if verdict.action == "rollback":
            done = saved = _roll_back(run, verdict)
        if verdict.action != "step":
            continue
        done = record["step"]
        run.progress.stepped += 1
        _report_step(run, record)
        if cfg.log.val_every and done % cfg.log.val_every == 0 and done < cfg.steps:
            record["val_loss"] = evaluate(run)
            logger.message(f"step {done}: validation loss {record['val_loss']:.4f}")
        if cfg.log.laziness_every and (done % cfg.log.laziness_every == 0 or done == cfg.steps):
            record.update(_laziness(run, done))
        logger.write(record)
        if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < cfg.steps:
            run.save(done)
            saved = done
        run.ckpts.poll()
        if on_step_end is not None:
            on_step_end(done, record)


def _log_skipped(run: RunState, record: dict, verdict: Verdict) -> None:
    """Log a skipped step (with its batch and why) and write its record."""
    run.logger.message(
        f"step {record['step']}: skipped batch {record['batch']} ({verdict.skipped}); "
        f"weights and optimizer untouched, {verdict.in_row} bad step(s) in a row"
    )
    run.logger.write({**record, "skipped": verdict.skipped})


def _roll_back(run: RunState, verdict: Verdict) -> int:
    """Back to the newest checkpoint (the guard has added the verdict's batches to its skip
    list); returns the step it resumes after."""
    run.ckpts.wait()
    elapsed = run.elapsed()
    run.net.optimizer.zero_grad(set_to_none=True)
    restore(run)  # the guard keeps this run's skip list and rollback count
    clock = run.clock
    run.progress.elapsed0 = elapsed - (time.perf_counter() - clock.t_start)
    clock.t_last, clock.tok_last = time.perf_counter(), run.progress.tokens_seen
    g, skip = run.cfg.guard, sorted(run.guard.skip)
    run.logger.message(
        f"{verdict.why}: rolled back to {run.ckpts.newest.name} ({run.guard.rollbacks} of "
        f"guard.max_rollbacks={g.max_rollbacks}); skipping batch(es) "
        f"{', '.join(map(str, verdict.batches))} from now on"
    )
    start = run.progress.start_step
    run.logger.write({"step": start, "rollback": verdict.why, "skip_batches": skip})
    return start


def _laziness(run: RunState, done: int) -> dict:
    """The laziness monitor's metrics at the long window, and one line saying what it saw."""
    if run.out.monitor is None:
        run.out.monitor = LazinessMonitor(run.cfg, run.data.loader.tokens, run.data.tok)
    out = run.out.monitor(run.net.raw, run.sched.long)

    def pct(key):  # NaN: no episode of that bucket fits seq_len
        return "n/a (no episode fits)" if out[key] != out[key] else f"{out[key]:.0f}%"

    run.logger.message(
        f"step {done}: recall inside the long window {pct('lazy/inside_long')}, beyond it "
        f"{pct('lazy/beyond_long')} ({pct('lazy/reset_beyond_long')} with the recurrent state "
        f"reset), beyond T {pct('lazy/beyond_T')}: {out['lazy/kind']}"
    )
    return out


def _stop_requested(run: RunState) -> bool:
    """Whether any rank received SIGINT/SIGTERM (one tiny all-reduce per step when
    distributed, so that every rank stops at the same step)."""
    local = run.stop.signum if run.stop is not None and run.stop.signum else 0
    if not run.info.distributed:
        return bool(local)
    flag = torch.tensor([float(local)], device=run.info.device)
    D.all_reduce_sum(flag)
    if flag.item() and run.stop is not None and not run.stop.signum:
        run.stop.signum = signal.SIGTERM  # another rank was signalled: stop as for SIGTERM
    return bool(flag.item())


def _stop_at(run: RunState, done: int, saved: int) -> None:
    """Checkpoint step ``done`` (unless that step is saved already) and raise TrainingStopped.
    The loop calls this between steps only, so the checkpoint's weights, optimizer moments, data
    position and RNG all belong to the same step and a resumed run trains exactly as an
    uninterrupted one would."""
    signum, name = run.stop.signum, run.stop.name or "signal"
    if done == 0:
        what = "no step had run, nothing saved"
    else:
        if done != saved:  # else that step's checkpoint is on disk already
            run.save(done)
        run.ckpts.wait()
        what = f"checkpoint step_{done:06d} saved; resume=true continues from it"
    run.logger.message(f"stopped by {name} after step {done}: {what}")
    stopped = TrainingStopped(f"stopped by {name} after step {done}: {what}", signum)
    stopped.reported = True  # rank 0 printed it: the command line does not print it again
    raise stopped


def finish(run: RunState) -> dict:
    """The end of a run: final validation, last checkpoint, the exported model (safetensors
    and tokenizer in run_dir/model) and summary.json. Returns the summary."""
    cfg, summary = run.cfg, run.progress.summary
    summary["final_val_loss"] = evaluate(run)
    steps_run = run.progress.stepped
    summary.update(steps=cfg.steps, tokens=run.progress.tokens_seen, elapsed=run.elapsed())
    summary["steps_run"] = steps_run
    if steps_run:  # else the run had finished before: keep the throughput it had then
        wall = max(time.perf_counter() - run.clock.t_start, 1e-9)
        summary["tok_s"] = steps_run * run.tokens_per_step / wall
    run.logger.write({"step": cfg.steps, "val_loss": summary["final_val_loss"]})
    run.save(cfg.steps)
    run.ckpts.wait()
    _export(run)
    return summary


def _export(run: RunState) -> None:
    """Gather the full weights (from every rank under FSDP) and, on rank 0, save them under
    the run's config with its tokenizer, and write summary.json."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    run.net.optimizer.state.clear()  # in the last checkpoint; its memory goes to the gather
    full = get_model_state_dict(
        run.net.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not run.info.is_main:
        return
    with torch.device("meta"):
        export = SwaxLM(run.net.mcfg)
    export.load_state_dict(full, assign=True)  # the gathered tensors themselves, no copy
    model_dir = run.run_dir / "model"
    export.save_pretrained(model_dir)
    save_tokenizer(run.data.tok, model_dir)
    summary, start = run.progress.summary, run.progress.resumed_at
    summary["model_dir"] = str(model_dir)
    val = (
        f"validation loss {summary.get('initial_val_loss', float('nan')):.4f} -> "
        f"{summary['final_val_loss']:.4f}"
        if run.data.val_loader is not None
        else "no validation data"
    )
    this = ""
    if start > 0:  # a resumed run: this invocation's share apart from the total
        this = (
            f" ({run.progress.stepped} steps in "
            f"{fmt_time(time.perf_counter() - run.clock.t_start)} this time)"
        )
    run.logger.message(
        f"done: {run.cfg.steps} steps, {run.progress.tokens_seen / 1e6:.2f}M tokens in "
        f"{fmt_time(summary['elapsed'])} in all{this} | {val} | model saved to {model_dir}"
    )
    (run.run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=1))

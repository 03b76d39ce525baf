"""Building a training run: the run folder, data, model, optimizer and schedules, restored
from its latest checkpoint when it resumes; :class:`RunState` holds them for the loop
(:mod:`swax.train.trainer`)."""

from __future__ import annotations

import logging
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from swax.config import SwaxConfig
from swax.core.errors import ConfigError
from swax.core.memory import map_large_allocations
from swax.core.progress import fmt_count
from swax.core.threads import AUTO, AutoThreads, last_setting, set_threads, threads_note
from swax.data import PackedLoader, build_datasets
from swax.data.loader import data_tokenizer
from swax.data.mqar import mqar_vocab_needed
from swax.model import SwaxLM
from swax.train import distributed as D
from swax.train.checkpoint import (
    Checkpoints,
    latest_checkpoint,
    list_checkpoints,
    load_init_weights,
)
from swax.train.config import TrainConfig, save_train_config
from swax.train.guard import Faults, StepGuard, faults_from_env
from swax.train.logger import RunLogger
from swax.train.monitor import LazinessMonitor
from swax.train.peak import Peak, peak_flops, slow_bf16_warning
from swax.train.runctl import StopSignals, remove_stale_files
from swax.train.schedules import lr_at, window_schedule

log = logging.getLogger("swax")


@dataclass
class RunData:
    """The run's tokens: its tokenizer, the training and validation loaders (the latter None
    without validation data) and the size of the training text."""

    tok: Any
    loader: PackedLoader
    val_loader: PackedLoader | None
    train_tokens: int


@dataclass
class Net:
    """The model as the steps train it."""

    mcfg: SwaxConfig
    """The model's config (its vocab_size may be raised above the run's: _build_data)."""
    raw: SwaxLM
    """The bare model (under FSDP, its modules hold the shards)."""
    model: torch.nn.Module
    """The model as trained: wrapped by DDP or FSDP under torchrun."""
    fwd: Callable
    """What the forward pass calls: ``model`` or its torch.compile."""
    optimizer: torch.optim.Optimizer
    amp_dtype: torch.dtype | None


@dataclass
class Progress:
    """Where the run stands: with the loader's position and the guard's state, what its
    checkpoints keep besides weights, optimizer and RNG (trainer.json)."""

    start_step: int = 0
    """The step the loop starts from: 0, or that of the checkpoint resumed or rolled back to."""
    plan_steps: int = 0
    """The steps the learning-rate and window schedules are laid over: the run's first
    ``steps`` (kept in its checkpoints). A resume that asks for more steps extends the run past
    its plan instead of re-stretching the schedules: the added steps keep the plan's last
    learning rate and window (long), so the learning rate never rises on an extension."""
    elapsed0: float = 0.0
    """Seconds spent by earlier processes of this run (restored from the checkpoint)."""
    tokens_seen: int = 0
    batches: int = 0
    """Global batches drawn so far, skipped ones included (the next batch's index)."""
    stepped: int = 0
    """Optimizer steps this process took, steps a rollback undid and trained again included
    (not kept in checkpoints: the summary's ``steps_run`` and tokens/s)."""
    resumed_at: int = 0
    """The step this process's loop started from (0 for a fresh run; a rollback does not
    change it)."""
    summary: dict = field(default_factory=dict)

    def state_dict(self, elapsed: float) -> dict:
        return {
            "elapsed": elapsed,
            "plan_steps": self.plan_steps,
            "tokens": self.tokens_seen,
            "batches": self.batches,
            "summary": self.summary,
        }

    def load_state_dict(self, state: dict, steps: int) -> None:
        """A checkpoint's trainer state (``steps``: this run's, the plan of checkpoints written
        before plans were kept, which re-stretched their schedules)."""
        self.start_step = state["step"]
        self.plan_steps = int(state.get("plan_steps") or steps)
        self.elapsed0 = state.get("elapsed", 0.0)
        self.tokens_seen = state.get("tokens", 0)
        self.batches = int(state.get("batches", self.start_step))  # older: one batch per step
        self.summary.update(state.get("summary", {}))


@dataclass
class Clock:
    """This process's clocks: when it started its steps (set again by
    :func:`swax.train.trainer.run_steps`), and the time and tokens of the last throughput line."""

    t_start: float = field(default_factory=time.perf_counter)
    t_last: float = 0.0
    tok_last: int = 0


@dataclass
class Reporting:
    """What the run prints and measures besides its steps: the rank-0 logger, the MFU reference,
    the automatic thread count (CPU), the laziness monitor (log.laziness_every)."""

    logger: RunLogger | None = None
    peak: Peak | None = None
    auto_threads: AutoThreads | None = None
    monitor: LazinessMonitor | None = None
    """Built at setup when log.laziness_every is set, so a misfit fails before the first step."""


@dataclass
class RunState:
    """A training run from setup through its steps to the end, by what each part holds: built
    by :func:`setup_run`, advanced by :func:`swax.train.step.train_step`, closed by
    :func:`swax.train.trainer.finish`."""

    cfg: TrainConfig
    info: D.DistInfo
    run_dir: Path
    data: RunData
    net: Net
    sched: Callable
    """The window schedule: a pure function of the step."""
    guard: StepGuard
    """Bad steps: the policy, the batches skipped, the rollbacks made (swax.train.guard)."""
    ckpts: Checkpoints
    """How the run writes its checkpoints, the save in flight, the newest one."""
    progress: Progress = field(default_factory=Progress)
    clock: Clock = field(default_factory=Clock)
    out: Reporting = field(default_factory=Reporting)
    stop: StopSignals | None = None
    """SIGINT / SIGTERM received by this process (set by :func:`swax.train.trainer.train`)."""
    faults: Faults | None = None
    """The guard tests' fault injector ($SWAX_TEST_FAULTS), None in a real run."""

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.cfg.seq_len

    @property
    def logger(self) -> RunLogger:
        return self.out.logger

    def elapsed(self) -> float:
        """Seconds of training of the whole run so far, over all its processes."""
        return self.progress.elapsed0 + time.perf_counter() - self.clock.t_start

    def trainer_state(self) -> dict:
        """The non-tensor part of a checkpoint: loader position, clocks, guard, summary, config."""
        return {
            "loader": self.data.loader.state_dict(),
            **self.progress.state_dict(self.elapsed()),
            "guard": self.guard.state_dict(),
            "config": self.cfg.to_dict(),
            "threads": torch.get_num_threads(),  # CPU sums depend on it: reused on resume
        }

    def save(self, step: int) -> None:
        """Checkpoint ``step`` (every rank calls it; :meth:`Checkpoints.save`)."""
        self.ckpts.save(step, self.net.model, self.net.optimizer, self.trainer_state())


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices; no decay for embeddings, norms, biases, gates' biases and 1-D params."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or "embed" in name or "conv" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _prepare_run_dir(cfg: TrainConfig, info: D.DistInfo) -> tuple[Path, Path | None]:
    """(run folder, checkpoint to resume from or None): what resume and overwrite ask of a
    folder that may hold a run already; leftovers of interrupted writes removed."""
    run_dir = Path(cfg.run_dir)
    ckpt = latest_checkpoint(run_dir)
    resume = cfg.resume is True or (cfg.resume == "auto" and ckpt is not None)
    if (
        cfg.resume == "auto"
        and ckpt is None
        and (list_checkpoints(run_dir) or (run_dir / "model").exists())
    ):
        raise ConfigError(
            f"resume=auto: {run_dir} holds a run but no intact checkpoint to resume from; "
            "pass overwrite=true to start over (deletes it), or another run_dir"
        )
    if resume:
        if ckpt is None:
            raise ConfigError(f"resume=true but {run_dir} holds no checkpoint to resume from")
    elif list_checkpoints(run_dir) or (run_dir / "model").exists():
        if not cfg.overwrite:
            raise ConfigError(
                f"run_dir {run_dir} already holds a run; pass resume=true to continue it, "
                f"overwrite=true to start over (deletes its checkpoints), or another run_dir"
            )
        if info.is_main:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            shutil.rmtree(run_dir / "model", ignore_errors=True)
            (run_dir / "metrics.jsonl").unlink(missing_ok=True)
        ckpt = None
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        for p in remove_stale_files(run_dir):
            log.info("removed %s, left by an interrupted write", p)
    return run_dir, ckpt if resume else None


def _build_data(cfg: TrainConfig, info: D.DistInfo) -> tuple[RunData, SwaxConfig]:
    """(the run's data, the model config: the run's, its vocabulary raised to the data's ids)."""
    tok = data_tokenizer(cfg.data)  # a shard set's own tokenizer, else data.tokenizer
    mcfg = cfg.model
    if mcfg.vocab_size < tok.vocab_size:  # e.g. a byte-level preset on GPT-2 tokens
        mcfg = mcfg.replace(vocab_size=128 * math.ceil(tok.vocab_size / 128))
        _warn_main(info)(
            f"note: model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
            f"vocabulary ({tok.name}: {tok.vocab_size}); the model has {mcfg.vocab_size}"
        )
    syn = cfg.data.synthetic
    if syn.task == "mqar" and syn.fraction > 0:  # the episode ids (after the tokenizer's)
        need = mqar_vocab_needed(syn, tok.vocab_size)
        if mcfg.vocab_size < need:
            grown = 64 * math.ceil(need / 64)
            _warn_main(info)(
                f"note: the MQAR episode ids run up to {need - 1} (after the tokenizer's "
                f"{tok.vocab_size} ids, so no text emits them); the model has {grown} ids"
            )
            mcfg = mcfg.replace(vocab_size=grown)
    train_ds, val_ds = build_datasets(cfg.data, tok, cfg.seq_len, cfg.seed)
    micro = cfg.micro_batch(info.world_size)
    loader = PackedLoader(
        train_ds,
        cfg.seq_len,
        micro,
        info.rank,
        info.world_size,
        cfg.seed,
        synthetic=cfg.data.synthetic,
        tokenizer=tok,
        doc_mask=cfg.data.doc_mask,
        vocab_size=mcfg.vocab_size,  # the ids checked here, not per forward
    )
    # validation batches are global batches (batch_size sequences), whatever the world size
    # and accumulation, so every run of a config is validated on the same sequences
    val_loader = None
    if val_ds is not None:
        per_rank = cfg.batch_size // info.world_size
        val_loader = PackedLoader(
            val_ds,
            cfg.seq_len,
            per_rank,
            info.rank,
            info.world_size,
            cfg.seed,
            doc_mask=cfg.data.doc_mask,
            vocab_size=mcfg.vocab_size,
        )
    return RunData(tok, loader, val_loader, train_ds.num_tokens), mcfg


def _build_model(cfg: TrainConfig, info: D.DistInfo, mcfg: SwaxConfig) -> Net:
    """The model, wrapped, maybe compiled, and its optimizer, on the run's device."""
    torch.manual_seed(cfg.seed)
    if info.distributed and cfg.dist.strategy == "fsdp":  # no rank holds the whole model
        if info.device.type == "cpu":  # FSDP on the CPU is for memory: freed blocks go back
            map_large_allocations()  # (costs some speed: benchmarks/README.md, fsdp.py)
        raw_model = model = D.build_sharded(mcfg, info, cfg.seed)
    else:
        raw_model = SwaxLM(mcfg).to(info.device)
        model = D.wrap_model(raw_model, info, cfg.dist.strategy)
    raw_model.check_ids = False  # the loaders checked the ids (no host sync per forward)
    if cfg.activation_checkpointing:
        raw_model.gradient_checkpointing = True
    fwd = torch.compile(model) if cfg.compile else model
    o = cfg.optim
    optimizer = torch.optim.AdamW(
        param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps
    )
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and info.device.type == "cuda")
    return Net(mcfg, raw_model, model, fwd, optimizer, torch.bfloat16 if bf16 else None)


def setup_run(cfg: TrainConfig, info: D.DistInfo) -> RunState:
    """Prepare the run folder, data, model and optimizer; restore a checkpoint when resuming;
    open the logger. Nothing is trained yet."""
    if cfg.threads:  # 0: the command's setting (swax.cli applied it)
        set_threads(cfg.threads)
    faults = faults_from_env()  # a malformed test hook fails before anything is touched
    run_dir, ckpt = _prepare_run_dir(cfg, info)
    if info.distributed:
        torch.distributed.barrier()
    data, mcfg = _build_data(cfg, info)
    net = _build_model(cfg, info, mcfg)
    run = RunState(
        cfg=cfg,
        info=info,
        run_dir=run_dir,
        data=data,
        net=net,
        sched=window_schedule(cfg, mcfg),
        guard=StepGuard(cfg.guard, cfg.checkpoint.every),
        ckpts=_checkpoints(cfg, info, run_dir),
        faults=faults,
    )
    n_params = net.raw.num_parameters()
    run.progress.summary.update(run_dir=str(run_dir), params=n_params)
    if cfg.log.laziness_every:  # fails now, not at its first evaluation
        run.out.monitor = LazinessMonitor(cfg, data.loader.tokens, data.tok)
        run.out.monitor.check(mcfg.vocab_size)
    if ckpt is None and cfg.init_from:
        load_init_weights(cfg.init_from, net.model)
    if ckpt is not None:
        restore(run)
        start = run.progress.start_step
        if cfg.steps < start:  # would save a checkpoint of a later step under its name
            raise ConfigError(
                f"steps={cfg.steps} is below the step {run.ckpts.newest.name} holds "
                f"({start}); resume with steps >= {start}"
            )
    run.progress.plan_steps = run.progress.plan_steps or cfg.steps
    run.out.logger = RunLogger(cfg, run_dir, info.is_main, run.progress.start_step)
    if info.is_main:
        save_train_config(cfg, run_dir / "config.yaml")
    run.out.peak = peak_flops(info.device, net.amp_dtype)  # of the dtype the run computes in
    if info.device.type == "cpu":
        run.out.auto_threads = AutoThreads()
    _announce(run, n_params, resumed=ckpt is not None)
    return run


def _checkpoints(cfg: TrainConfig, info: D.DistInfo, run_dir: Path) -> Checkpoints:
    """How the run writes its checkpoints: sharded or full, in the background or not
    (checkpoint.format, async_save)."""
    c = cfg.checkpoint
    fsdp = info.distributed and cfg.dist.strategy == "fsdp"
    sharded = fsdp if c.format == "auto" else c.format == "sharded"
    background = info.device.type == "cuda" if c.async_save == "auto" else bool(c.async_save)
    background = background and sharded
    if c.async_save is True and not sharded:
        _warn_main(info)(
            "note: checkpoint.async_save=true applies to sharded checkpoints "
            "(checkpoint.format=sharded, or auto under dist.strategy=fsdp); these are written "
            "in the foreground"
        )
    group = None
    if background and info.distributed:  # every rank makes it, in the same order
        group = torch.distributed.new_group(backend="gloo")
    return Checkpoints(run_dir, c.keep, info.is_main, sharded, background, group)


def restore(run: RunState) -> None:
    """Weights, optimizer, RNG, data position, clocks and summary from the run's latest intact
    checkpoint; the schedules laid over the steps the run was planned with."""
    cfg, info, progress = run.cfg, run.info, run.progress
    state = run.ckpts.restore(run.net.model, run.net.optimizer, _warn_main(info))
    progress.load_state_dict(state, cfg.steps)
    if progress.plan_steps != cfg.steps:
        run.sched = window_schedule(cfg, run.net.mcfg, progress.plan_steps)
    run.data.loader.load_state_dict(state["loader"])
    used, at = state.get("threads"), progress.start_step  # auto may pick another count now:
    if used and last_setting() == AUTO and info.device.type == "cpu":  # keep the run's, pinned
        set_threads(int(used), why=f"threads=auto: the run's count at step {at}")
        _warn_main(info)(
            f"note: threads=auto: resuming with the {used} thread(s) the run used "
            f"at step {at}, so that it continues bit-exactly"
        )
    run.guard.load_state_dict(state.get("guard", {}))


def _announce(run: RunState, n_params: int, resumed: bool) -> None:
    """The run's header lines (model, processes, tokens, window schedule, data, threads; what
    MFU is measured against), and what an extended or too-short run should know."""
    cfg, info, data, plan = run.cfg, run.info, run.data, run.progress.plan_steps
    run.logger.message(
        f"swax train: {run.net.mcfg.layer_types} {n_params / 1e6:.2f}M params | "
        f"{info.world_size} process(es) on {info.device} | {cfg.steps} steps × "
        f"{cfg.batch_size} × {cfg.seq_len} = {fmt_count(cfg.steps * run.tokens_per_step)} "
        f"tokens | window {run.sched.describe()} | {fmt_count(data.train_tokens)} training "
        f"tokens ({data.tok.name})"
        + (f" | resumed from {run.ckpts.newest.name}" if resumed else "")
        + (f" | weights from {cfg.init_from}" if cfg.init_from and not resumed else "")
        + (f" | {threads_note()}" if info.device.type == "cpu" else "")
    )
    run.logger.message(f"MFU: the model's FLOP/s over {run.out.peak.describe()}")
    slow = slow_bf16_warning(info.device, run.net.amp_dtype)
    if slow:
        _warn_main(info)(slow)
    o = cfg.optim
    if cfg.steps > plan:
        final = lr_at(
            plan - 1, plan, o.lr, o.warmup_steps, o.schedule, o.min_lr_ratio, o.decay_frac
        )
        run.logger.message(
            f"extending the run past its plan of {plan} steps: steps {plan + 1}-{cfg.steps} "
            f"keep its last learning rate ({final:.3g}) and long window; the schedules are not "
            "re-stretched"
        )
    if cfg.steps < plan:
        at = lr_at(
            cfg.steps - 1, plan, o.lr, o.warmup_steps, o.schedule, o.min_lr_ratio, o.decay_frac
        )
        _warn_main(info)(
            f"warning: steps={cfg.steps} is shorter than the run's plan of {plan} steps: it "
            f"stops at step {cfg.steps} with the plan's learning rate there ({at:.3g}), before "
            "its decay (and the long-window phase) ends; the schedules are not re-planned "
            f"(resume with steps={plan} to finish the plan)"
        )
    if o.warmup_steps >= cfg.steps and not resumed:
        _warn_main(info)(
            f"warning: optim.warmup_steps={o.warmup_steps} >= steps={cfg.steps}: the learning "
            f"rate only rises, to {o.lr * cfg.steps / o.warmup_steps:.3g} (optim.lr={o.lr:g}), "
            "and never decays; lower optim.warmup_steps for a run this short"
        )


def _warn_main(info: D.DistInfo) -> Callable[[str], None]:
    """A warning printer that writes on rank 0 only."""
    return lambda text: print(text, file=sys.stderr, flush=True) if info.is_main else None

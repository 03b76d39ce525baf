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
from swax.core.threads import AUTO, AutoThreads, last_setting, set_threads, threads_note
from swax.data import PackedLoader, build_datasets
from swax.data.loader import data_tokenizer
from swax.data.mqar import mqar_vocab_needed
from swax.model import SwaxLM
from swax.train import distributed as D
from swax.train.checkpoint import (
    PendingSave,
    latest_checkpoint,
    list_checkpoints,
    load_init_weights,
    load_latest_checkpoint,
    save_checkpoint,
)
from swax.train.config import TrainConfig, save_train_config
from swax.train.guard import StepGuard
from swax.train.logger import RunLogger
from swax.train.monitor import LazinessMonitor
from swax.train.peak import Peak, peak_flops
from swax.train.runctl import StopSignals, remove_stale_files
from swax.train.schedules import lr_at, window_schedule

log = logging.getLogger("swax")


@dataclass
class RunState:
    """Everything a training run carries from setup through its steps to the end: built by
    :func:`setup_run`, advanced by :func:`swax.train.step.train_step`, closed by
    :func:`swax.train.trainer.finish`."""

    cfg: TrainConfig
    info: D.DistInfo
    run_dir: Path
    ckpt: Path | None
    tok: Any
    mcfg: SwaxConfig
    train_tokens: int
    loader: PackedLoader
    val_loader: PackedLoader | None
    model: torch.nn.Module
    """The model as trained: wrapped by DDP or FSDP under torchrun."""
    raw_model: SwaxLM
    fwd: Callable
    """What the forward pass calls: ``model`` or its torch.compile."""
    optimizer: torch.optim.Optimizer
    sched: Callable
    amp_dtype: torch.dtype | None
    n_params: int
    start_step: int = 0
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
    guard: StepGuard | None = None
    """Bad steps: the batches skipped, the rollbacks made (swax.train.guard)."""
    sharded: bool = False
    """Checkpoints written shard by shard (checkpoint.format; swax.train.sharded)."""
    background: bool = False
    """Sharded checkpoints written in the background (checkpoint.async_save)."""
    save_group: Any = None
    """The process group background saves talk on (their own, next to the steps')."""
    pending: PendingSave | None = None
    """The background save being written, if any."""
    summary: dict = field(default_factory=dict)
    logger: RunLogger | None = None
    peak: Peak | None = None
    auto_threads: AutoThreads | None = None
    t_start: float = field(default_factory=time.perf_counter)
    """When this process started its steps (set again by :func:`swax.train.trainer.run_steps`)."""
    t_last: float = 0.0
    tok_last: int = 0
    """Time and tokens at the last throughput line."""
    stop: StopSignals | None = None
    """SIGINT / SIGTERM received by this process (set by :func:`swax.train.trainer.train`)."""
    monitor: LazinessMonitor | None = None
    """The laziness monitor (log.laziness_every), built at its first use."""

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.cfg.seq_len

    def elapsed(self) -> float:
        """Seconds of training of the whole run so far, over all its processes."""
        return self.elapsed0 + time.perf_counter() - self.t_start

    def trainer_state(self) -> dict:
        """The non-tensor part of a checkpoint: loader position, clocks, summary, config."""
        return {
            "loader": self.loader.state_dict(),
            "elapsed": self.elapsed(),
            "plan_steps": self.plan_steps,
            "tokens": self.tokens_seen,
            "batches": self.batches,
            "guard": self.guard.state_dict(),
            "summary": self.summary,
            "config": self.cfg.to_dict(),
            "threads": torch.get_num_threads(),  # CPU sums depend on it: reused on resume
        }

    def save(self, step: int) -> None:
        """Checkpoint ``step`` (every rank calls it). A background save returns at once; the
        one before it is waited for first, so at most one is being written."""
        self.wait_save()
        out = save_checkpoint(
            self.run_dir,
            step,
            self.model,
            self.optimizer,
            self.trainer_state(),
            self.cfg.checkpoint.keep,
            self.info.is_main,
            sharded=self.sharded,
            background=self.background,
            group=self.save_group,
        )
        if isinstance(out, PendingSave):
            self.pending = out

    def poll_save(self) -> None:
        """Complete a background save whose shards are all written (rank 0 renames it)."""
        if self.pending is not None and self.pending.done():
            self.pending.wait()
            self.pending = None

    def settle_save(self) -> None:
        """On the way out after an error: complete a background save whose shards get written
        (no collective, so a dead rank cannot hang it); one that fails stays absent."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.wait()
            except Exception as e:  # noqa: BLE001 - the error already leaving wins
                log.warning("the background checkpoint %s was not completed: %s", pending.final, e)

    def wait_save(self) -> None:
        """Wait for a background save to be complete on every rank."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
        if self.background and self.info.distributed:
            torch.distributed.barrier()


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


def _build_data(cfg: TrainConfig, info: D.DistInfo):
    """(tokenizer, model config, training tokens, train loader, validation loader or None)."""
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
            val_ds, cfg.seq_len, per_rank, info.rank, info.world_size, cfg.seed,
            doc_mask=cfg.data.doc_mask, vocab_size=mcfg.vocab_size,
        )  # fmt: skip
    return tok, mcfg, train_ds.num_tokens, loader, val_loader


def _build_model(cfg: TrainConfig, info: D.DistInfo, mcfg: SwaxConfig):
    """(raw model, wrapped model, forward callable, optimizer) on the run's device."""
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
    return raw_model, model, fwd, optimizer


def setup_run(cfg: TrainConfig, info: D.DistInfo) -> RunState:
    """Prepare the run folder, data, model and optimizer; restore a checkpoint when resuming;
    open the logger. Nothing is trained yet."""
    if cfg.threads:  # 0: the command's setting (swax.cli applied it)
        set_threads(cfg.threads)
    run_dir, ckpt = _prepare_run_dir(cfg, info)
    if info.distributed:
        torch.distributed.barrier()
    tok, mcfg, train_tokens, loader, val_loader = _build_data(cfg, info)
    raw_model, model, fwd, optimizer = _build_model(cfg, info, mcfg)
    bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and info.device.type == "cuda")
    run = RunState(
        cfg=cfg,
        info=info,
        run_dir=run_dir,
        ckpt=ckpt,
        tok=tok,
        mcfg=mcfg,
        train_tokens=train_tokens,
        loader=loader,
        val_loader=val_loader,
        model=model,
        raw_model=raw_model,
        fwd=fwd,
        optimizer=optimizer,
        sched=window_schedule(cfg, mcfg),
        amp_dtype=torch.bfloat16 if bf16 else None,
        n_params=raw_model.num_parameters(),
        summary={"run_dir": str(run_dir), "params": raw_model.num_parameters()},
        guard=StepGuard(cfg.guard),
    )
    _checkpoint_mode(run)
    if cfg.log.laziness_every:  # fails now, not at its first evaluation
        run.monitor = LazinessMonitor(cfg, loader.tokens, tok)
        run.monitor.check(mcfg.vocab_size)
    if ckpt is None and cfg.init_from:
        load_init_weights(cfg.init_from, model)
    if ckpt is not None:
        restore(run)
        if cfg.steps < run.start_step:  # would save a checkpoint of a later step under its name
            raise ConfigError(
                f"steps={cfg.steps} is below the step {run.ckpt.name} holds "
                f"({run.start_step}); resume with steps >= {run.start_step}"
            )
    run.plan_steps = run.plan_steps or cfg.steps
    run.logger = RunLogger(cfg, run_dir, info.is_main, run.start_step)
    if info.is_main:
        save_train_config(cfg, run_dir / "config.yaml")
    run.peak = peak_flops(info.device)
    if info.device.type == "cpu":
        run.auto_threads = AutoThreads()
    _announce(run)
    return run


def _checkpoint_mode(run: RunState) -> None:
    """Sharded or full checkpoints, in the background or not (checkpoint.format, async_save)."""
    c, info = run.cfg.checkpoint, run.info
    fsdp = info.distributed and run.cfg.dist.strategy == "fsdp"
    run.sharded = fsdp if c.format == "auto" else c.format == "sharded"
    background = info.device.type == "cuda" if c.async_save == "auto" else bool(c.async_save)
    run.background = background and run.sharded
    if c.async_save is True and not run.sharded:
        _warn_main(info)(
            "note: checkpoint.async_save=true applies to sharded checkpoints "
            "(checkpoint.format=sharded, or auto under dist.strategy=fsdp); these are written "
            "in the foreground"
        )
    if run.background and info.distributed:  # every rank makes it, in the same order
        run.save_group = torch.distributed.new_group(backend="gloo")


def restore(run: RunState) -> None:
    """Weights, optimizer, RNG, data position, clocks and summary from the run's latest intact
    checkpoint; the schedules laid over the steps the run was planned with."""
    cfg, info = run.cfg, run.info
    run.ckpt, state = load_latest_checkpoint(
        run.run_dir, run.model, run.optimizer, _warn_main(info), info.is_main
    )
    run.start_step = state["step"]
    run.plan_steps = int(state.get("plan_steps") or cfg.steps)  # older: re-stretched
    if run.plan_steps != cfg.steps:
        run.sched = window_schedule(cfg, run.mcfg, run.plan_steps)
    run.loader.load_state_dict(state["loader"])
    used = state.get("threads")  # auto may pick another count now: keep the run's, pinned
    if used and last_setting() == AUTO and info.device.type == "cpu":
        set_threads(int(used), why=f"threads=auto: the run's count at step {run.start_step}")
        _warn_main(info)(f"note: threads=auto: resuming with the {used} thread(s) the run used "
                         f"at step {run.start_step}, so that it continues bit-exactly")  # fmt: skip
    run.elapsed0 = state.get("elapsed", 0.0)
    run.tokens_seen = state.get("tokens", 0)
    run.batches = int(state.get("batches", run.start_step))  # older: one batch per step
    run.guard.load_state_dict(state.get("guard", {}))
    run.summary.update(state.get("summary", {}))


def _announce(run: RunState) -> None:
    """The run's header lines (model, processes, tokens, window schedule, data, threads; what
    MFU is measured against), and what an extended or too-short run should know."""
    cfg, info, ckpt = run.cfg, run.info, run.ckpt
    run.logger.message(
        f"swax train: {run.mcfg.layer_types} {run.n_params / 1e6:.2f}M params | "
        f"{info.world_size} process(es) on {info.device} | {cfg.steps} steps × "
        f"{cfg.batch_size} × {cfg.seq_len} = {cfg.steps * run.tokens_per_step / 1e6:.1f}M "
        f"tokens | window {run.sched.describe()} | {run.train_tokens / 1e6:.2f}M training "
        f"tokens ({run.tok.name})"
        + (f" | resumed from {ckpt.name}" if ckpt else "")
        + (f" | weights from {cfg.init_from}" if cfg.init_from and not ckpt else "")
        + (f" | {threads_note()}" if info.device.type == "cpu" else "")
    )
    run.logger.message(f"MFU: the model's FLOP/s over {run.peak.describe()}")
    o = cfg.optim
    if cfg.steps > run.plan_steps:
        final = lr_at(run.plan_steps - 1, run.plan_steps, o.lr, o.warmup_steps, o.schedule,
                      o.min_lr_ratio, o.decay_frac)  # fmt: skip
        run.logger.message(
            f"extending the run past its plan of {run.plan_steps} steps: steps "
            f"{run.plan_steps + 1}-{cfg.steps} keep its last learning rate ({final:.3g}) and "
            "long window; the schedules are not re-stretched"
        )
    if cfg.steps < run.plan_steps:
        at = lr_at(cfg.steps - 1, run.plan_steps, o.lr, o.warmup_steps, o.schedule,
                   o.min_lr_ratio, o.decay_frac)  # fmt: skip
        _warn_main(info)(
            f"warning: steps={cfg.steps} is shorter than the run's plan of {run.plan_steps} "
            f"steps: it stops at step {cfg.steps} with the plan's learning rate there "
            f"({at:.3g}), before its decay (and the long-window phase) ends; the schedules are "
            f"not re-planned (resume with steps={run.plan_steps} to finish the plan)"
        )
    if o.warmup_steps >= cfg.steps and ckpt is None:
        _warn_main(info)(
            f"warning: optim.warmup_steps={o.warmup_steps} >= steps={cfg.steps}: the learning "
            f"rate only rises, to {o.lr * cfg.steps / o.warmup_steps:.3g} (optim.lr={o.lr:g}), "
            "and never decays; lower optim.warmup_steps for a run this short"
        )


def _warn_main(info: D.DistInfo) -> Callable[[str], None]:
    """A warning printer that writes on rank 0 only."""
    return lambda text: print(text, file=sys.stderr, flush=True) if info.is_main else None

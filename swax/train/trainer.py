"""The training loop: fixed or stochastic windows, one CPU process or many GPUs via torchrun.

    from swax.train import load_train_config, train
    result = train(load_train_config("configs/tiny.yaml", ["steps=200"]))

Every step: the window schedule gives the step's window (identical on all ranks); each rank
runs its micro-batches (gradient accumulation) with the loss normalised by the *global* number
of target tokens, so any world size and accumulation gives the same update for the same global
batch; the gradient norm is clipped; AdamW steps. Rank 0 logs (progress bar or lines,
``metrics.jsonl``, TensorBoard when installed) and writes checkpoints and the final model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from swax.config import SwaxConfig
from swax.core.errors import ConfigError, SwaxError
from swax.core.paths import writing
from swax.core.threads import AutoThreads, set_threads, threads_note
from swax.data import IGNORE_INDEX, PackedLoader, build_datasets, save_tokenizer
from swax.data.jsonl import json_safe
from swax.data.loader import data_tokenizer
from swax.model import SwaxLM
from swax.train import distributed as D
from swax.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
)
from swax.train.config import TrainConfig, save_train_config
from swax.train.monitor import LazinessMonitor
from swax.train.peak import Peak, peak_flops
from swax.train.runctl import RunLock, StopSignals, TrainingStopped, remove_stale_files
from swax.train.schedules import lr_at, window_schedule

log = logging.getLogger("swax")


class TrainingError(SwaxError):
    """The run cannot continue (e.g. a non-finite loss); the last good checkpoint is kept."""


# ------------------------------------------------------------------------------ helpers


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


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _window_label(window) -> str:
    if isinstance(window, tuple):
        return "/".join(str(w) for w in window if w is not None)
    return str(window)


def _start_wandb(cfg: TrainConfig, run_dir: Path):
    """A W&B run for this training run (log.wandb offline or online), or None with a warning
    when the wandb package is not installed. The W&B run id is kept in run_dir, so a resumed
    run logs into the same W&B run."""
    try:
        import wandb
    except ImportError:
        print(
            f"warning: log.wandb={cfg.log.wandb} but the wandb package is not installed "
            "(pip install wandb); logging to metrics.jsonl only",
            file=sys.stderr,
        )
        return None
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else wandb.util.generate_id()
    id_file.write_text(run_id + "\n")
    return wandb.init(
        project=cfg.log.wandb_project,
        name=run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        mode=cfg.log.wandb,
        config=cfg.to_dict(),
    )


class _Logger:
    """Rank-0 output: progress bar or plain lines, metrics.jsonl, TensorBoard."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, enabled: bool, start_step: int):
        self.enabled = enabled
        self.cfg = cfg
        self.bar = None
        self.tb = None
        self.wandb = None
        self.metrics_path = run_dir / "metrics.jsonl"
        if not enabled:
            return
        if self.metrics_path.exists():  # resuming: drop lines beyond the checkpoint's step
            self._trim_metrics(start_step)
        self.fh = self.metrics_path.open("a")
        if cfg.log.progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.steps,
                initial=start_step,
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
            )
        if cfg.log.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:
                self.tb = None
        if cfg.log.wandb != "off":
            self.wandb = _start_wandb(cfg, run_dir)

    def _trim_metrics(self, start_step: int) -> None:
        """Keep the lines up to the resumed step; a line that is not JSON (a partial last line
        after a crash or a full disk) is dropped with a warning naming the file and line."""
        keep = []
        lines = self.metrics_path.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, ln in enumerate(lines, 1):
            if not ln.strip():
                continue
            try:
                step = json.loads(ln).get("step", 0)
            except (json.JSONDecodeError, AttributeError):
                self.message(f"warning: {self.metrics_path}:{i} is not a JSON record; dropped")
                continue
            if isinstance(step, int) and step <= start_step:
                keep.append(ln)
        tmp = self.metrics_path.with_name(self.metrics_path.name + ".tmp")
        tmp.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")
        tmp.replace(self.metrics_path)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with writing("the metrics", self.metrics_path):
            self.fh.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
            self.fh.flush()
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, record["step"])
        if self.wandb is not None:
            scalars = {k: v for k, v in json_safe(record).items() if k != "step" and v is not None}
            self.wandb.log(scalars, step=record["step"])

    def progress(self, step: int, text: str, line: bool) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix_str(text, refresh=True)
        elif line:
            print(f"step {step}/{self.cfg.steps} | {text}", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        self.fh.close()


# ------------------------------------------------------------------------------ the run state


@dataclass
class RunState:
    """Everything a training run carries from setup through its steps to the end: built by
    :func:`setup_run`, advanced by :func:`train_step`, closed by :func:`finish`."""

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
    summary: dict = field(default_factory=dict)
    logger: _Logger | None = None
    peak: Peak | None = None
    auto_threads: AutoThreads | None = None
    t_start: float = field(default_factory=time.perf_counter)
    """When this process started its steps (set again by :func:`run_steps`)."""
    t_last: float = 0.0
    tok_last: int = 0
    """Time and tokens at the last throughput line."""
    stop: StopSignals | None = None
    """SIGINT / SIGTERM received by this process (set by :func:`train`)."""
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
            "summary": self.summary,
            "config": self.cfg.to_dict(),
        }

    def save(self, step: int) -> None:
        save_checkpoint(
            self.run_dir,
            step,
            self.model,
            self.optimizer,
            self.trainer_state(),
            self.cfg.checkpoint.keep,
            self.info.is_main,
        )


# ------------------------------------------------------------------------------ the loop


def train(cfg: TrainConfig, on_step_end: Callable[[int, dict], None] | None = None) -> dict:
    """Run the training described by ``cfg``; return a summary (losses, tokens/s, paths;
    ``steps_run``: the steps this call trained, 0 when it resumed a finished run).

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


def _prepare_run_dir(cfg: TrainConfig, info: D.DistInfo) -> tuple[Path, Path | None]:
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
    )
    # validation batches are global batches (batch_size sequences), whatever the world size
    # and accumulation, so every run of a config is validated on the same sequences
    val_loader = None
    if val_ds is not None:
        per_rank = cfg.batch_size // info.world_size
        val_loader = PackedLoader(
            val_ds, cfg.seq_len, per_rank, info.rank, info.world_size, cfg.seed,
            doc_mask=cfg.data.doc_mask,
        )  # fmt: skip
    return tok, mcfg, train_ds.num_tokens, loader, val_loader


def _build_model(cfg: TrainConfig, info: D.DistInfo, mcfg: SwaxConfig):
    """(raw model, wrapped model, forward callable, optimizer) on the run's device."""
    torch.manual_seed(cfg.seed)
    raw_model = SwaxLM(mcfg).to(info.device)
    if cfg.activation_checkpointing:
        raw_model.gradient_checkpointing = True
    model = D.wrap_model(raw_model, info, cfg.dist.strategy)
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
    )
    if ckpt is not None:
        ckpt, state = load_latest_checkpoint(
            run_dir, model, optimizer, _warn_main(info), info.is_main
        )
        run.ckpt = ckpt
        run.start_step = state["step"]
        run.plan_steps = int(state.get("plan_steps") or cfg.steps)  # older: re-stretched
        if run.plan_steps != cfg.steps:
            run.sched = window_schedule(cfg, mcfg, run.plan_steps)
        loader.load_state_dict(state["loader"])
        run.elapsed0 = state.get("elapsed", 0.0)
        run.tokens_seen = state.get("tokens", 0)
        run.summary.update(state.get("summary", {}))
    run.plan_steps = run.plan_steps or cfg.steps
    run.logger = _Logger(cfg, run_dir, info.is_main, run.start_step)
    if info.is_main:
        save_train_config(cfg, run_dir / "config.yaml")
    run.peak = peak_flops(info.device)
    if info.device.type == "cpu":
        run.auto_threads = AutoThreads()
    run.logger.message(
        f"swax train: {mcfg.layer_types} {run.n_params / 1e6:.2f}M params | {info.world_size} "
        f"process(es) on {info.device} | {cfg.steps} steps × {cfg.batch_size} × {cfg.seq_len} "
        f"= {cfg.steps * run.tokens_per_step / 1e6:.1f}M tokens | window {run.sched.describe()} | "
        f"{train_tokens / 1e6:.2f}M training tokens ({tok.name})"
        + (f" | resumed from {ckpt.name}" if ckpt else "")
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
    if o.warmup_steps >= cfg.steps and ckpt is None:
        _warn_main(info)(
            f"warning: optim.warmup_steps={o.warmup_steps} >= steps={cfg.steps}: the learning "
            f"rate only rises, to {o.lr * cfg.steps / o.warmup_steps:.3g} (optim.lr={o.lr:g}), "
            "and never decays; lower optim.warmup_steps for a run this short"
        )
    return run


def _warn_main(info: D.DistInfo) -> Callable[[str], None]:
    """A warning printer that writes on rank 0 only."""
    return lambda text: print(text, file=sys.stderr, flush=True) if info.is_main else None


def _cross_entropy_sum(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Summed (not averaged) token cross-entropy in float32, each target times its weight when
    ``weights`` is given; IGNORE_INDEX targets count 0."""
    if weights is None:
        return F.cross_entropy(
            logits.float().flatten(0, 1),
            targets.flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
    ce = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return (ce * weights.flatten().float()).sum()


def _target_weight(y: torch.Tensor, w: torch.Tensor | None) -> float:
    """The loss's denominator of one micro-batch: its target tokens, or their summed weight."""
    mask = y != IGNORE_INDEX
    return float(mask.sum()) if w is None else float(w.double()[mask].sum())


def evaluate(run: RunState) -> float:
    """Mean validation loss per target token with the long window, over all ranks (NaN when
    the run has no validation data: data.val_fraction=0 and no data.val_source)."""
    if run.val_loader is None:
        return float("nan")
    dev = run.info.device
    run.model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dev)  # (loss sum, target tokens)
    with torch.no_grad(), _autocast(dev, run.amp_dtype):
        for x, y, *doc in run.val_loader.eval_batches(run.cfg.log.val_batches):
            x, y = x.to(dev), y.to(dev)
            extra = {"doc_ids": doc[0].to(dev)} if doc else {}
            logits = run.fwd(x, window=run.sched.long, **extra)
            total[0] += _cross_entropy_sum(logits, y).double()
            total[1] += (y != IGNORE_INDEX).sum()
    D.all_reduce_sum(total)
    run.model.train()
    return (total[0] / total[1].clamp(min=1)).item()


def _forward_backward(run: RunState, batches: list, window) -> float:
    """Accumulate the gradients of the step's micro-batches; return the step's mean loss per
    target token over all ranks. Each micro-batch's summed loss is scaled by world_size / (all
    target tokens of the step), so after DDP/FSDP average the gradients over ranks the update is
    that of the mean loss over the global batch, whatever the split."""
    info, dev = run.info, run.info.device
    # a batch is (x, y), with loss weights (data.synthetic.answer_weight) (x, y, w), with
    # data.doc_mask (x, y, w, doc_ids)
    ntok = torch.tensor(
        [sum(_target_weight(b[1], b[2] if len(b) > 2 else None) for b in batches)],
        dtype=torch.float64,
        device=dev,
    )
    D.all_reduce_sum(ntok)
    scale = info.world_size / ntok.item()
    loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
    last = len(batches) - 1
    for j, (x, y, *rest) in enumerate(batches):
        x, y = x.to(dev), y.to(dev)
        w = rest[0].to(dev) if rest else None
        extra = {"doc_ids": rest[1].to(dev)} if len(rest) > 1 else {}
        sync = contextlib.nullcontext()
        if info.distributed and run.cfg.dist.strategy == "ddp" and j < last:
            sync = run.model.no_sync()  # all-reduce the gradients once, after the last one
        with sync, _autocast(dev, run.amp_dtype):
            ce = _cross_entropy_sum(run.fwd(x, window=window, **extra), y, w)
            (ce * scale).backward()
        loss_sum += ce.detach().double()
    D.all_reduce_sum(loss_sum)
    return loss_sum.item() / ntok.item()


def train_step(run: RunState, step: int) -> dict:
    """Optimizer step ``step`` (0-based): window and learning rate of the step, forward and
    backward over its micro-batches, clipping, AdamW. Returns the step's record (1-based
    ``step``). A non-finite loss raises TrainingError before the weights change."""
    o = run.cfg.optim
    window = run.sched(step)
    # past the plan (an extended run), the plan's last step's rate: never re-stretched
    lr = lr_at(
        min(step, run.plan_steps - 1), run.plan_steps, o.lr, o.warmup_steps, o.schedule,
        o.min_lr_ratio, o.decay_frac,
    )  # fmt: skip
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    batches = [run.loader.next_batch() for _ in range(o.grad_accum)]
    loss = _forward_backward(run, batches, window)
    if not math.isfinite(loss):
        last = latest_checkpoint(run.run_dir)
        raise TrainingError(
            f"loss is {loss} at step {step + 1}; stopping. Last good checkpoint: "
            f"{last if last else 'none'} (lower optim.lr or check the data)"
        )
    gnorm = _grad_norm(run.model, o.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.tokens_seen += run.tokens_per_step
    return {
        "step": step + 1,
        "loss": loss,
        "lr": lr,
        "window": _window_label(window),
        "grad_norm": gnorm,
        "tokens": run.tokens_seen,
    }


def _grad_norm(model: torch.nn.Module, clip: float) -> float:
    """The global gradient norm, clipped to ``clip`` when it is > 0; measured (and logged)
    without clipping too, without touching the gradients."""
    params = [p for p in model.parameters() if p.grad is not None]
    if clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    elif hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, math.inf)  # scales by exactly 1
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _report_step(run: RunState, record: dict) -> None:
    """Progress output of a finished step; every log.every steps (and the first and last of
    this process) also throughput, MFU and ETA, added to the record."""
    cfg, done = run.cfg, record["step"]
    text = f"loss {record['loss']:.4f} | window {record['window']}"
    if not (done % cfg.log.every == 0 or done == cfg.steps or done == run.start_step + 1):
        run.logger.progress(done, text, line=False)
        return
    now = time.perf_counter()
    dt = max(now - run.t_last, 1e-9)
    tokens = run.tokens_seen - run.tok_last if run.tok_last else run.tokens_per_step
    tps = tokens / dt
    window = run.sched(done - 1)  # schedules are pure functions of the step
    achieved = run.raw_model.flops_per_token(cfg.seq_len, window) * tps
    run.peak.cover(achieved)
    mfu = achieved / run.peak.flops
    eta = (cfg.steps - done) * run.tokens_per_step / max(tps, 1e-9)
    record.update(tok_s=tps, mfu=mfu, elapsed=run.elapsed0 + now - run.t_start)
    run.logger.progress(
        done,
        f"{text} | lr {record['lr']:.2e} | {tps:,.0f} tok/s | MFU {mfu:.1%} | ETA {_fmt_time(eta)}",
        line=True,
    )
    run.t_last, run.tok_last = now, run.tokens_seen
    changed = run.auto_threads.check() if run.auto_threads is not None else None
    if changed:
        run.logger.message(f"step {done}: {changed}")


def run_steps(run: RunState, on_step_end: Callable[[int, dict], None] | None = None) -> None:
    """Steps ``start_step`` … ``steps - 1``, with validation, metrics and checkpoints on their
    schedules. A SIGINT or SIGTERM (``run.stop``) stops the loop at the next step boundary
    with a checkpoint of the last finished step: see :func:`_stop_at`."""
    cfg, logger = run.cfg, run.logger
    run.t_start = time.perf_counter()
    if run.start_step == 0:
        run.summary["initial_val_loss"] = evaluate(run)
        if run.val_loader is not None:
            logger.message(
                f"validation loss before training: {run.summary['initial_val_loss']:.4f}"
            )
            if cfg.data.synthetic.fraction >= 1:
                logger.message(
                    "note: the validation loss is on held-out text, and this run trains only on "
                    "retrieval episodes (data.synthetic.fraction = 1): it is expected to rise"
                )
        logger.write({"step": 0, "val_loss": run.summary["initial_val_loss"]})
    run.model.train()
    run.t_last, run.tok_last = time.perf_counter(), 0
    done = saved = run.start_step
    for step in range(run.start_step, cfg.steps):
        if _stop_requested(run):
            _stop_at(run, done, saved)
        record = train_step(run, step)
        done = record["step"]
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
        if on_step_end is not None:
            on_step_end(done, record)


def _laziness(run: RunState, done: int) -> dict:
    """The laziness monitor's metrics at the long window, and one line saying what it saw."""
    if run.monitor is None:
        run.monitor = LazinessMonitor(run.cfg, run.loader.tokens, run.tok)
    out = run.monitor(run.raw_model, run.sched.long)

    def pct(key):
        return "–" if out[key] != out[key] else f"{out[key]:.0f}%"  # NaN: an empty bucket

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
        what = f"checkpoint step_{done:06d} saved; resume=true continues from it"
    run.logger.message(f"stopped by {name} after step {done}: {what}")
    raise TrainingStopped(f"stopped by {name} after step {done}: {what}", signum)


def finish(run: RunState) -> dict:
    """The end of a run: final validation, last checkpoint, the exported model (safetensors
    and tokenizer in run_dir/model) and summary.json. Returns the summary."""
    cfg, summary = run.cfg, run.summary
    summary["final_val_loss"] = evaluate(run)
    steps_run = cfg.steps - run.start_step
    summary.update(steps=cfg.steps, tokens=run.tokens_seen, elapsed=run.elapsed())
    summary["steps_run"] = steps_run
    if steps_run:  # else the run had finished before: keep the throughput it had then
        wall = max(time.perf_counter() - run.t_start, 1e-9)
        summary["tok_s"] = steps_run * run.tokens_per_step / wall
    run.logger.write({"step": cfg.steps, "val_loss": summary["final_val_loss"]})
    run.save(cfg.steps)
    _export(run)
    return summary


def _export(run: RunState) -> None:
    """Gather the full weights (from every rank under FSDP) and, on rank 0, save them under
    the run's config with its tokenizer, and write summary.json."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        run.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not run.info.is_main:
        return
    with torch.device("meta"):
        export = SwaxLM(run.mcfg)
    export = export.to_empty(device="cpu")
    export.load_state_dict(full)
    model_dir = run.run_dir / "model"
    export.save_pretrained(model_dir)
    save_tokenizer(run.tok, model_dir)
    summary = run.summary
    summary["model_dir"] = str(model_dir)
    val = (
        f"validation loss {summary.get('initial_val_loss', float('nan')):.4f} -> "
        f"{summary['final_val_loss']:.4f}"
        if run.val_loader is not None
        else "no validation data"
    )
    this = ""
    if run.start_step > 0:  # a resumed run: this invocation's share apart from the total
        this = (
            f" ({run.cfg.steps - run.start_step} steps in "
            f"{_fmt_time(time.perf_counter() - run.t_start)} this time)"
        )
    run.logger.message(
        f"done: {run.cfg.steps} steps, {run.tokens_seen / 1e6:.2f}M tokens in "
        f"{_fmt_time(summary['elapsed'])} in all{this} | {val} | model saved to {model_dir}"
    )
    (run.run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=1))


def _autocast(device: torch.device, dtype):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)

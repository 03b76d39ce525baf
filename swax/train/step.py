"""One optimizer step of a training run, and its validation loss.

The loss of a step is normalised by the *global* number of target tokens (or their summed
weights), so any world size and gradient accumulation give the same update for the same
global batch; the gradient norm is clipped; AdamW steps. A bad step (a non-finite gradient
norm, or a loss spike) is skipped before the weights change and returned as such; a
non-finite loss raises :class:`BadLoss` before the weights change (the loop rolls back:
:mod:`swax.train.guard`).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from swax.core.errors import SwaxError
from swax.data import IGNORE_INDEX
from swax.train import distributed as D
from swax.train.build import RunState
from swax.train.checkpoint import latest_checkpoint
from swax.train.logger import window_label
from swax.train.schedules import lr_at


class TrainingError(SwaxError):
    """The run cannot continue (e.g. a non-finite loss); the last good checkpoint is kept."""


class BadLoss(TrainingError):
    """A step's loss was not finite (nothing was updated): the loop rolls back."""

    def __init__(self, message: str, step: int, batch: int):
        super().__init__(message)
        self.step, self.batch = step, batch


def next_batches(run: RunState) -> tuple[int, list]:
    """The batch the next step trains on: (its global index, its micro-batches on this rank).
    Batches in the guard's skip list are drawn and dropped, so the data after them is where it
    would be without the skip."""
    while True:
        index = run.batches
        batches = [run.loader.next_batch() for _ in range(run.cfg.optim.grad_accum)]
        run.batches += 1
        if index not in run.guard.skip:
            return index, batches


def _poison_gradients(model: torch.nn.Module) -> None:
    """The fault injector: one gradient made NaN (on every rank, so the global norm is NaN)."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.fill_(float("nan"))
            return


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
    ``step``, the global index of its ``batch``). A bad step (non-finite gradient norm, or a
    loss spike under guard.spike_z) leaves weights and optimizer untouched and returns its
    record with ``skipped`` (the reason); a non-finite loss raises :class:`BadLoss`, also
    before anything changes."""
    o, g = run.cfg.optim, run.cfg.guard
    window = run.sched(step)
    # past the plan (an extended run), the plan's last step's rate: never re-stretched
    lr = lr_at(
        min(step, run.plan_steps - 1), run.plan_steps, o.lr, o.warmup_steps, o.schedule,
        o.min_lr_ratio, o.decay_frac,
    )  # fmt: skip
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    index, batches = next_batches(run)
    loss = _forward_backward(run, batches, window)
    if index in g.inject_nan_loss:
        loss = float("nan")
    if not math.isfinite(loss):
        run.optimizer.zero_grad(set_to_none=True)
        last = latest_checkpoint(run.run_dir)
        raise BadLoss(
            f"loss is {loss} at step {step + 1} (batch {index}); last good checkpoint: "
            f"{last if last else 'none'}",
            step + 1,
            index,
        )
    if index in g.inject_nan_grad:
        _poison_gradients(run.model)
    gnorm = _grad_norm(run.model, o.grad_clip)
    record = {
        "step": step + 1,
        "loss": loss,
        "lr": lr,
        "window": window_label(window),
        "grad_norm": gnorm,
        "batch": index,
    }
    why = None
    if not math.isfinite(gnorm):
        why = f"gradient norm {gnorm}"
    elif (z := run.guard.spike(loss)) is not None:
        why = (
            f"loss spike: {loss:.4f} is {z:.1f} standard deviations above the last "
            f"{g.spike_window} steps' mean"
        )
    if why:
        run.optimizer.zero_grad(set_to_none=True)
        return {**record, "skipped": why}
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.tokens_seen += run.tokens_per_step
    return {**record, "tokens": run.tokens_seen}


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


def _autocast(device: torch.device, dtype):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)

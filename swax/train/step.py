"""One optimizer step of a training run, and its validation loss.

The loss of a step is normalised by the *global* number of target tokens (or their summed
weights), so any world size and gradient accumulation give the same update for the same global
batch; the gradient norm is clipped; the guard (:class:`swax.train.guard.StepGuard`) judges the
step's record, and AdamW steps only on its ``"step"`` verdict: any other verdict leaves weights
and optimizer untouched, and the loop (:mod:`swax.train.trainer`) acts on it.
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
from swax.train.guard import Verdict
from swax.train.logger import window_label
from swax.train.schedules import lr_at


class TrainingError(SwaxError):
    """The run cannot continue (e.g. a guard's stop); the last good checkpoint is kept."""


def next_batches(run: RunState) -> tuple[int, list]:
    """The batch the next step trains on: (its global index, its micro-batches on this rank).
    Batches in the guard's skip list are drawn and dropped, so the data after them is where it
    would be without the skip."""
    progress, loader = run.progress, run.data.loader
    while True:
        index = progress.batches
        batches = [loader.next_batch() for _ in range(run.cfg.optim.grad_accum)]
        progress.batches += 1
        if index not in run.guard.skip:
            return index, batches


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
    if run.data.val_loader is None:
        return float("nan")
    dev, net = run.info.device, run.net
    net.model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dev)  # (loss sum, target tokens)
    with torch.no_grad(), _autocast(dev, net.amp_dtype):
        for x, y, *doc in run.data.val_loader.eval_batches(run.cfg.log.val_batches):
            x, y = x.to(dev), y.to(dev)
            extra = {"doc_ids": doc[0].to(dev)} if doc else {}
            logits = net.fwd(x, window=run.sched.long, **extra)
            total[0] += _cross_entropy_sum(logits, y).double()
            total[1] += (y != IGNORE_INDEX).sum()
    D.all_reduce_sum(total)
    net.model.train()
    return (total[0] / total[1].clamp(min=1)).item()


def _forward_backward(run: RunState, batches: list, window) -> float:
    """Accumulate the gradients of the step's micro-batches; return the step's mean loss per
    target token over all ranks. Each micro-batch's summed loss is scaled by world_size / (all
    target tokens of the step), so after DDP/FSDP average the gradients over ranks the update is
    that of the mean loss over the global batch, whatever the split."""
    info, dev, net = run.info, run.info.device, run.net
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
            sync = net.model.no_sync()  # all-reduce the gradients once, after the last one
        with sync:
            with _autocast(dev, net.amp_dtype):  # the forward; the backward follows its dtypes
                ce = _cross_entropy_sum(net.fwd(x, window=window, **extra), y, w)
            (ce * scale).backward()
        loss_sum += ce.detach().double()
    D.all_reduce_sum(loss_sum)
    return loss_sum.item() / ntok.item()


def train_step(run: RunState, step: int) -> tuple[dict, Verdict]:
    """Optimizer step ``step`` (0-based): window and learning rate of the step, forward and
    backward over its micro-batches, the gradient norm (clipped), the guard's verdict, and
    AdamW when the verdict is ``"step"``; any other verdict leaves weights and optimizer
    untouched. Returns the step's record (1-based ``step``, the global index of its ``batch``,
    ``tokens`` when it trained) and the verdict."""
    o, net = run.cfg.optim, run.net
    window = run.sched(step)
    # past the plan (an extended run), the plan's last step's rate: never re-stretched
    plan = run.progress.plan_steps
    lr = lr_at(
        min(step, plan - 1), plan, o.lr, o.warmup_steps, o.schedule, o.min_lr_ratio, o.decay_frac
    )
    for group in net.optimizer.param_groups:
        group["lr"] = lr
    index, batches = next_batches(run)
    loss = _forward_backward(run, batches, window)
    if run.faults is not None:  # the guard tests' fault injector ($SWAX_TEST_FAULTS)
        loss = run.faults(index, loss, net.model)
    record = {
        "step": step + 1,
        "loss": loss,
        "lr": lr,
        "window": window_label(window),
        "grad_norm": _grad_norm(net.model, o.grad_clip),
        "batch": index,
    }
    verdict = run.guard.judge(record, run.ckpts.newest)
    if verdict.action == "step":
        net.optimizer.step()
        run.progress.tokens_seen += run.tokens_per_step
        record["tokens"] = run.progress.tokens_seen
    net.optimizer.zero_grad(set_to_none=True)
    return record, verdict


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
    """bfloat16 autocast (dtype=bfloat16; None: float32, no autocast). The weights stay float32
    masters: autocast casts each to bfloat16 once per forward (its weight cache) and the
    gradients flow back to the float32 weights; the ops take bfloat16 tiles and keep gates,
    states and normalisers in float32 (swax.ops.precision), the loss is float32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)

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
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data import PackedLoader, build_datasets, load_tokenizer, save_tokenizer
from ..errors import ConfigError, SwaxError
from ..model import SwaxLM
from . import distributed as D
from .checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from .config import TrainConfig, save_train_config
from .schedules import FixedWindow, StochasticWindow, lr_at

log = logging.getLogger("swax")


class TrainingError(SwaxError):
    """The run cannot continue (e.g. a non-finite loss); the last good checkpoint is kept."""


# ------------------------------------------------------------------------------ helpers


def measure_peak_flops(device: torch.device) -> float:
    """Measured matmul FLOP/s of this device now (float32 on CPU, bfloat16 on CUDA): the
    denominator of the MFU estimate."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (2048, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 5
    for _ in range(reps):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


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


def window_schedule(cfg: TrainConfig, n_layers: int, layer_types: str):
    w = cfg.window
    if w.kind == "fixed":
        return FixedWindow(w.fixed or w.long)
    n_swa = layer_types.count("S")
    sched = StochasticWindow(
        w.short,
        w.long,
        w.p_short,
        w.anneal_frac,
        cfg.steps,
        cfg.seed,
        per_layer=n_swa if (w.per_layer and n_swa > 1) else None,
    )
    if sched.per_layer is None:
        return sched

    def per_layer(step):  # spread the S layers' draws over the layer positions
        draws = iter(sched(step))
        return tuple(next(draws) if k == "S" else w.long for k in layer_types)

    per_layer.long = w.long
    return per_layer


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _window_label(window) -> str:
    if isinstance(window, tuple):
        return "/".join(str(w) for w in window if w is not None)
    return str(window)


class _Logger:
    """Rank-0 output: progress bar or plain lines, metrics.jsonl, TensorBoard."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, enabled: bool, start_step: int):
        self.enabled = enabled
        self.cfg = cfg
        self.bar = None
        self.tb = None
        self.metrics_path = run_dir / "metrics.jsonl"
        if not enabled:
            return
        if self.metrics_path.exists():  # resuming: drop lines beyond the checkpoint's step
            keep = [
                ln
                for ln in self.metrics_path.read_text().splitlines()
                if ln.strip() and json.loads(ln).get("step", 0) <= start_step
            ]
            self.metrics_path.write_text("".join(ln + "\n" for ln in keep))
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

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, record["step"])

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
        self.fh.close()


# ------------------------------------------------------------------------------ the loop


def train(cfg: TrainConfig, on_step_end: Callable[[int, dict], None] | None = None) -> dict:
    """Run the training described by ``cfg``; return a summary (losses, tokens/s, paths).

    ``on_step_end(step, record)`` is called after every optimizer step (1-based step) with the
    step's metrics; an exception raised there stops the run like an interruption would.
    """
    info = D.setup(cfg.device, cfg.dist.backend)
    try:
        return _train(cfg, info, on_step_end)
    finally:
        D.teardown()


def _prepare_run_dir(cfg: TrainConfig, info: D.DistInfo) -> tuple[Path, Path | None]:
    run_dir = Path(cfg.run_dir)
    ckpt = latest_checkpoint(run_dir)
    if cfg.resume:
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
    return run_dir, ckpt if cfg.resume else None


def _train(cfg: TrainConfig, info: D.DistInfo, on_step_end) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_dir, ckpt = _prepare_run_dir(cfg, info)
    if info.distributed:
        torch.distributed.barrier()
    micro = cfg.micro_batch(info.world_size)
    accum = cfg.optim.grad_accum

    # -- data
    tok = load_tokenizer(cfg.data.tokenizer)
    mcfg = cfg.model_config()
    if "vocab_size" not in cfg.model and mcfg.vocab_size < tok.vocab_size:
        mcfg = mcfg.replace(vocab_size=128 * math.ceil(tok.vocab_size / 128))
    if mcfg.vocab_size < tok.vocab_size:
        raise ConfigError(
            f"model.vocab_size={mcfg.vocab_size} is smaller than the tokenizer's "
            f"vocabulary ({tok.name}: {tok.vocab_size})"
        )
    train_ds, val_ds = build_datasets(cfg.data, tok, cfg.seq_len, cfg.seed)
    loader = PackedLoader(
        train_ds,
        cfg.seq_len,
        micro,
        info.rank,
        info.world_size,
        cfg.seed,
        synthetic=cfg.data.synthetic,
        tokenizer=tok,
    )
    # validation batches are global batches (batch_size sequences), whatever the world size
    # and accumulation, so every run of a config is validated on the same sequences
    val_loader = (
        None
        if val_ds is None
        else PackedLoader(
            val_ds,
            cfg.seq_len,
            cfg.batch_size // info.world_size,
            info.rank,
            info.world_size,
            cfg.seed,
        )
    )

    # -- model and optimizer
    torch.manual_seed(cfg.seed)
    model = SwaxLM(mcfg).to(info.device)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing = True
    raw_model = model
    n_params = model.num_parameters()
    model = D.wrap_model(model, info, cfg.dist.strategy)
    fwd = torch.compile(model) if cfg.compile else model
    o = cfg.optim
    optimizer = torch.optim.AdamW(
        param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps
    )
    sched = window_schedule(cfg, mcfg.n_layers, mcfg.layer_types)
    amp_dtype = (
        torch.bfloat16
        if (cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and info.device.type == "cuda"))
        else None
    )

    start_step, elapsed0, tokens_seen = 0, 0.0, 0
    summary: dict = {"run_dir": str(run_dir), "params": n_params}
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, optimizer)
        start_step = state["step"]
        loader.load_state_dict(state["loader"])
        elapsed0 = state.get("elapsed", 0.0)
        tokens_seen = state.get("tokens", 0)
        summary.update(state.get("summary", {}))
    logger = _Logger(cfg, run_dir, info.is_main, start_step)
    if info.is_main:
        save_train_config(cfg, run_dir / "config.yaml")
    peak = measure_peak_flops(info.device)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    logger.message(
        f"swax train: {mcfg.layer_types} {n_params / 1e6:.2f}M params | {info.world_size} "
        f"process(es) on {info.device} | {cfg.steps} steps × {cfg.batch_size} × {cfg.seq_len} "
        f"= {cfg.steps * tokens_per_step / 1e6:.1f}M tokens | window {sched!r} | "
        f"{train_ds.num_tokens / 1e6:.2f}M training tokens ({tok.name})"
        + (f" | resumed from {ckpt.name}" if ckpt else "")
    )

    def evaluate() -> float:
        if val_loader is None:  # data.val_fraction=0 and no data.val_source
            return float("nan")
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=info.device)
        with torch.no_grad(), _autocast(info.device, amp_dtype):
            for x, y in val_loader.eval_batches(cfg.log.val_batches):
                x, y = x.to(info.device), y.to(info.device)
                logits = fwd(x, window=sched.long if hasattr(sched, "long") else cfg.window.long)
                total[0] += F.cross_entropy(
                    logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum"
                ).double()
                total[1] += (y != -100).sum()
        D.all_reduce_sum(total)
        model.train()
        return (total[0] / total[1].clamp(min=1)).item()

    def trainer_state(step):
        return {
            "loader": loader.state_dict(),
            "elapsed": elapsed0 + time.perf_counter() - t_start,
            "tokens": tokens_seen,
            "summary": summary,
            "config": cfg.to_dict(),
        }

    t_start = time.perf_counter()
    if start_step == 0:
        summary["initial_val_loss"] = evaluate()
        logger.message(f"validation loss before training: {summary['initial_val_loss']:.4f}")
        logger.write({"step": 0, "val_loss": summary["initial_val_loss"]})

    model.train()
    t_last, tok_last = time.perf_counter(), 0
    step = start_step
    try:
        for step in range(start_step, cfg.steps):
            window = sched(step)
            lr = lr_at(
                step, cfg.steps, o.lr, o.warmup_steps, o.schedule, o.min_lr_ratio, o.decay_frac
            )
            for g in optimizer.param_groups:
                g["lr"] = lr
            batches = [loader.next_batch() for _ in range(accum)]
            ntok = torch.tensor(
                [float(sum(int((y != -100).sum()) for _, y in batches))],
                dtype=torch.float64,
                device=info.device,
            )
            D.all_reduce_sum(ntok)
            scale = info.world_size / ntok.item()
            loss_sum = torch.zeros((), dtype=torch.float64, device=info.device)
            for j, (x, y) in enumerate(batches):
                x, y = x.to(info.device), y.to(info.device)
                sync = contextlib.nullcontext()
                if info.distributed and cfg.dist.strategy == "ddp" and j < accum - 1:
                    sync = model.no_sync()
                with sync, _autocast(info.device, amp_dtype):
                    logits = fwd(x, window=window)
                    ce = F.cross_entropy(
                        logits.float().flatten(0, 1),
                        y.flatten(),
                        ignore_index=-100,
                        reduction="sum",
                    )
                    (ce * scale).backward()
                loss_sum += ce.detach().double()
            D.all_reduce_sum(loss_sum)
            loss = loss_sum.item() / ntok.item()
            if not math.isfinite(loss):
                last = latest_checkpoint(run_dir)
                raise TrainingError(
                    f"loss is {loss} at step {step + 1}; stopping. Last good checkpoint: "
                    f"{last if last else 'none'} (lower optim.lr or check the data)"
                )
            gnorm = float("nan")
            if o.grad_clip > 0:
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
                gnorm = float(gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens_seen += tokens_per_step
            done = step + 1

            record = {
                "step": done,
                "loss": loss,
                "lr": lr,
                "window": _window_label(window),
                "grad_norm": gnorm,
                "tokens": tokens_seen,
            }
            now = time.perf_counter()
            if done % cfg.log.every == 0 or done == cfg.steps or done == start_step + 1:
                dt = max(now - t_last, 1e-9)
                tps = (tokens_seen - tok_last) / dt if tok_last else tokens_per_step / dt
                mfu = raw_model.flops_per_token(cfg.seq_len, window) * tps / peak
                eta = (cfg.steps - done) * tokens_per_step / max(tps, 1e-9)
                record.update(tok_s=tps, mfu=mfu, elapsed=elapsed0 + now - t_start)
                logger.progress(
                    done,
                    f"loss {loss:.4f} | window {_window_label(window)} | lr "
                    f"{lr:.2e} | {tps:,.0f} tok/s | MFU {mfu:.1%} | ETA "
                    f"{_fmt_time(eta)}",
                    line=True,
                )
                t_last, tok_last = now, tokens_seen
            else:
                logger.progress(
                    done, f"loss {loss:.4f} | window {_window_label(window)}", line=False
                )
            if cfg.log.val_every and done % cfg.log.val_every == 0 and done < cfg.steps:
                record["val_loss"] = evaluate()
                logger.message(f"step {done}: validation loss {record['val_loss']:.4f}")
            logger.write(record)
            if cfg.checkpoint.every and done % cfg.checkpoint.every == 0 and done < cfg.steps:
                save_checkpoint(
                    run_dir,
                    done,
                    model,
                    optimizer,
                    trainer_state(done),
                    cfg.checkpoint.keep,
                    info.is_main,
                )
            if on_step_end is not None:
                on_step_end(done, record)
    except KeyboardInterrupt:
        if not info.distributed and step > start_step:
            logger.message(
                f"interrupted: saving a checkpoint at step {step} (resume=true continues)"
            )
            save_checkpoint(
                run_dir,
                step,
                model,
                optimizer,
                trainer_state(step),
                cfg.checkpoint.keep,
                info.is_main,
            )
        logger.close()
        raise

    # -- the end: validation, checkpoint, export
    summary["final_val_loss"] = evaluate()
    elapsed = elapsed0 + time.perf_counter() - t_start
    summary.update(
        steps=cfg.steps,
        tokens=tokens_seen,
        elapsed=elapsed,
        tok_s=(tokens_seen - start_step * tokens_per_step)
        / max(time.perf_counter() - t_start, 1e-9),
    )
    logger.write({"step": cfg.steps, "val_loss": summary["final_val_loss"]})
    save_checkpoint(
        run_dir,
        cfg.steps,
        model,
        optimizer,
        trainer_state(cfg.steps),
        cfg.checkpoint.keep,
        info.is_main,
    )
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if info.is_main:
        with torch.device("meta"):  # the gathered weights, saved under the run's config
            export = SwaxLM(mcfg)
        export = export.to_empty(device="cpu")
        export.load_state_dict(full)
        export.save_pretrained(run_dir / "model")
        save_tokenizer(tok, run_dir / "model")
        summary["model_dir"] = str(run_dir / "model")
        logger.message(
            f"done: {cfg.steps} steps, {tokens_seen / 1e6:.2f}M tokens in {_fmt_time(elapsed)} | "
            f"validation loss {summary.get('initial_val_loss', float('nan')):.4f} -> "
            f"{summary['final_val_loss']:.4f} | model saved to {run_dir / 'model'}"
        )
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    logger.close()
    return summary


def _autocast(device: torch.device, dtype):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)

"""Rank-0 output of a training run: a progress bar or plain lines, ``metrics.jsonl``,
TensorBoard (when installed) and Weights & Biases (log.wandb); and how they write a time and a
window."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from swax.core.paths import writing
from swax.data.jsonl import json_safe
from swax.train.config import TrainConfig


def fmt_time(s: float) -> str:
    """Seconds for a person: ``4m05s``, ``1h02m``."""
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def window_label(window) -> str:
    """A step's window as the metrics name it: ``32``, or per-layer draws ``8/32`` (the
    windowed layers' windows, in layer order)."""
    if isinstance(window, tuple):
        return "/".join(str(w) for w in window if w is not None)
    return str(window)


def start_wandb(cfg: TrainConfig, run_dir: Path):
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


class RunLogger:
    """Rank-0 output: progress bar or plain lines, metrics.jsonl, TensorBoard, W&B (on other
    ranks every method does nothing)."""

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
            self.wandb = start_wandb(cfg, run_dir)

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

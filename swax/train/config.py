"""TrainConfig: the dataclass tree of a training run, loaded from YAML with key=value overrides.

    swax train configs/tiny.yaml optim.lr=3e-4 window.p_short=0.75

Top-level keys kept stable for scripts: run_dir, steps, seq_len, batch_size, seed, resume,
window.kind, window.short, window.long, window.p_short, window.anneal_frac, checkpoint.every.
Unknown keys and wrong types are errors naming the dotted key; the resolved config is written
to ``run_dir/config.yaml``. The model section is a SwaxConfig, written as a ``preset`` and the
fields that override it (``model: {preset: tiny, layer_pattern: SD}``); a run's config.yaml
holds every field of its model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from swax.config import PRESETS, SwaxConfig, WindowConfig
from swax.core.configs import (
    SEED_BOUNDS,
    bounded,
    check_fields,
    config_keys,
    field_type,
    from_dict,
    load_yaml_mapping,
    parse_text,
    to_dict,
)
from swax.core.errors import ConfigError
from swax.data import DataConfig


@dataclass
class OptimConfig:
    """AdamW with decay/no-decay groups, warmup, and cosine or warmup-stable-decay schedules."""

    lr: float = bounded(3e-3, "(0, inf)")
    """Peak learning rate."""
    min_lr_ratio: float = bounded(0.1, "[0, 1]")
    """Final learning rate as a fraction of lr."""
    schedule: Literal["cosine", "wsd", "constant"] = "cosine"
    """cosine: warmup then cosine to min_lr; wsd: warmup, constant, linear decay over the last
    decay_frac of steps; constant: warmup then constant."""
    warmup_steps: int = bounded(50, "[0, inf)")
    """Linear warmup steps from 0."""
    decay_frac: float = bounded(0.2, "[0, 1]")
    """wsd: fraction of steps spent decaying."""
    weight_decay: float = bounded(0.1, "[0, inf)")
    """AdamW weight decay of matrices (embeddings, norms, biases and gates' biases: none)."""
    beta1: float = bounded(0.9, "[0, 1)")
    """AdamW beta1."""
    beta2: float = bounded(0.95, "[0, 1)")
    """AdamW beta2."""
    eps: float = bounded(1e-8, "(0, inf)")
    """AdamW epsilon."""
    grad_clip: float = bounded(1.0, "[0, inf)")
    """Clip the global gradient norm to this (0 = off)."""
    grad_accum: int = bounded(1, "[1, inf)")
    """Micro-batches per optimizer step (per rank)."""


@dataclass
class CheckpointConfig:
    """Resumable checkpoints under run_dir/checkpoints/."""

    every: int = bounded(100, "[0, inf)")
    """Save every N steps (0 = only at the end)."""
    keep: int = bounded(2, "[1, inf)")
    """Keep the last K checkpoints."""
    format: Literal["auto", "full", "sharded"] = "auto"
    """full: one safetensors file of the whole model and one of the optimizer, gathered on rank
    0; sharded: each rank writes its own shard with torch.distributed.checkpoint, nothing
    gathered; auto: sharded under dist.strategy=fsdp, else full. Either loads into any world
    size (a sharded checkpoint of 2 ranks resumes on 1 or 4)."""
    async_save: bool | Literal["auto"] = "auto"
    """Write sharded checkpoints in the background while the steps go on (each rank holds a
    staged copy of its shard meanwhile); auto: on CUDA only (on the CPU the copy costs as much
    memory as the shard and the write competes with the steps for the cores)."""


@dataclass
class GuardConfig:
    """What a bad step does (the policy: swax.train.guard.StepGuard). A step is bad when its
    gradient norm is not finite, or (spike_z > 0) its loss lies more than spike_z standard
    deviations above the mean of the last spike_window good steps: it is skipped (weights and
    optimizer state untouched) and the same step is tried again on the next batch. After
    max_bad_in_row bad steps in a row, or at once on a non-finite loss, the run rolls back to its
    last checkpoint and skips the batches that caused it; after max_rollbacks rollbacks it
    stops."""

    max_bad_in_row: int = bounded(3, "[1, inf)")
    """Bad steps in a row that make the run roll back (K)."""
    max_rollbacks: int = bounded(3, "[0, inf)")
    """Rollbacks a run may make before it stops (0: stop at the first)."""
    spike_z: float = bounded(0.0, "[0, inf)")
    """The loss-spike rule: a loss above mean + spike_z · std of the last spike_window good
    steps is a bad step; 0 = off."""
    spike_window: int = bounded(100, "[2, inf)")
    """Good steps the loss-spike rule's mean and standard deviation are taken over (it acts once
    that many have run)."""
    skip_batches: list[int] = bounded(bounds="[0, inf)", default_factory=list)
    """Global batch indices (0-based: the n-th batch the run draws) that are drawn and not
    trained on. A rollback adds the batches it skips to the run's own list (kept in its
    checkpoints); set here, it reproduces a run that never saw them."""


@dataclass
class LogConfig:
    """Progress output and metrics."""

    every: int = bounded(10, "[1, inf)")
    """Write a metrics.jsonl line (and a log line when not on a terminal) every N steps."""
    val_every: int = bounded(100, "[0, inf)")
    """Validation loss every N steps (and at the start and the end); 0 = only start and end."""
    val_batches: int = bounded(16, "[1, inf)")
    """Batches (of batch_size sequences) of the validation stream per evaluation."""
    tensorboard: bool = True
    """Also write TensorBoard events when the tensorboard package is installed."""
    laziness_every: int = bounded(0, "[0, inf)")
    """The laziness monitor (swax.train.monitor): every N steps and at the end, recall of
    data.synthetic's episodes by distance bucket (inside the long window, beyond it, beyond
    the training length) and with the recurrent state reset, logged as the lazy/* metrics and
    drawn by swax plot-run; 0 = off."""
    laziness_samples: int = bounded(32, "[1, inf)")
    """Episodes per distance bucket of the laziness monitor."""
    wandb: Literal["off", "offline", "online"] = "off"
    """Also log the metrics to Weights & Biases (needs ``pip install wandb``): offline writes
    the run under run_dir/wandb with no network (``wandb sync`` uploads it later); online
    logs as it trains. A resumed run continues the same W&B run."""
    wandb_project: str = "swax"
    """W&B project name."""
    progress: bool = True
    """A progress bar on a terminal (plain log lines otherwise)."""


@dataclass
class DistConfig:
    """Distributed training (launched with torchrun; ignored in a single process)."""

    strategy: Literal["ddp", "fsdp"] = "ddp"
    """ddp: replicated model; fsdp: FSDP2 fully_shard per block."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend; auto = nccl on CUDA, gloo on CPU."""
    timeout_s: float = bounded(1800.0, "(0, inf)")
    """Seconds a collective (or the ranks' connection at start) may take before it fails
    (torch's default, 30 min). A failure ends the workers, so ``torchrun --max-restarts`` can
    restart the job; lower it for small models to recover sooner from a rank that hangs."""


@dataclass
class TrainConfig:
    """A training run."""

    run_dir: str = "runs/tiny"
    """Folder of the run: config.yaml, metrics.jsonl, checkpoints/, model/."""
    steps: int = bounded(400, "[1, inf)")
    """Optimizer steps."""
    seq_len: int = bounded(512, "[1, inf)")
    """Training sequence length in tokens."""
    batch_size: int = bounded(16, "[1, inf)")
    """Global batch in sequences per optimizer step (over all ranks and micro-batches)."""
    seed: int = bounded(0, SEED_BOUNDS)
    """Seed of initialisation, data order and window draws."""
    resume: bool | Literal["auto"] = False
    """true: continue from the newest intact checkpoint in run_dir (an error if there is none);
    auto: continue when run_dir holds one, else start a fresh run (what a job that is restarted
    by torchrun --max-restarts or SLURM --requeue wants: one command for both). From the
    command line either reads the run's config.yaml; keys given again must agree with it,
    except RESUME_MAY_CHANGE."""
    model: SwaxConfig = field(default_factory=SwaxConfig, metadata={"flatten": False})
    """The model: any SwaxConfig field, and `preset` (a name of swax.config.PRESETS, default
    tiny) whose fields the others override. Its `window` (the default of evaluation and of
    `swax generate`) is window.long: left out, it is set to window.long; set to another value,
    it is an error naming both. A vocab_size below the tokenizer's vocabulary is raised to it
    (rounded up to a multiple of 128) in the model the run trains, with a note."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data."""
    window: WindowConfig = field(default_factory=WindowConfig)
    """Window schedule."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser and learning-rate schedule."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """Bad steps: skip, roll back, stop."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Distributed settings."""
    device: str = "auto"
    """auto (cuda when available), cpu or cuda."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Autocast dtype: auto = bfloat16 on CUDA, float32 on CPU (runs stay comparable).
    bfloat16 on a CPU pays only with bfloat16 matrix units (AMX, AVX-512 BF16); without them the
    run warns that it is slower (docs/training.md, "bfloat16 on a CPU")."""
    compile: bool = False
    """torch.compile the model."""
    activation_checkpointing: bool = False
    """Recompute each block in the backward pass to save memory."""
    threads: int | Literal["auto"] = 0
    """CPU threads for torch: 0 keeps the command's setting (--threads, $SWAX_THREADS, else
    auto); auto = the CPUs this process may use less what other processes use on them now; N
    = N threads."""
    overwrite: bool = False
    """Allow starting a fresh run in a run_dir that already holds checkpoints (deletes them)."""
    init_from: str | None = None
    """Start from the weights of this swax model folder (e.g. one `swax import xlstm --add-swa`
    wrote) instead of random ones: its config.json is the model, model.* keys given (not
    model.preset) override fields that keep the weights' shapes, and the folder's window is the
    run's window.long unless the run sets one. The optimizer and schedules start fresh; a resumed
    run continues from its checkpoint."""

    def __post_init__(self) -> None:
        if self.threads != "auto" and (isinstance(self.threads, bool) or self.threads < 0):
            raise ConfigError(f"threads must be auto or an integer >= 0, got {self.threads!r}")
        syn = self.data.synthetic
        if syn.far_share is not None and syn.far_from is None:  # near/far of the long window
            syn.far_from = self.window.long
        self.validate()

    @classmethod
    def expand_keys(cls, data: dict, prefix: str = "") -> dict:
        """Plain data whose model section does not set ``window`` gets the run's window.long
        there (the model's window is the long window). (:func:`swax.core.configs.from_dict`
        calls this first; the model section's ``preset`` is SwaxConfig's.) With ``init_from``
        the model section starts from that folder's config.json (:func:`init_model_section`)."""
        data = init_model_section(data)
        model = data.get("model", {})
        if not isinstance(model, dict) or "window" in model:
            return data
        section = data.get("window", {})
        long = section.get("long", WindowConfig.long) if isinstance(section, dict) else None
        if isinstance(long, float) and long.is_integer():
            long = int(long)
        if isinstance(long, bool) or not isinstance(long, int) or long < 1:
            return data  # the window section's own check names it
        return {**data, "model": {**model, "window": long}}

    def validate(self) -> None:
        """Every field against its declared bounds (:func:`swax.core.configs.check_fields`, the
        data section included), then what relates fields to each other."""
        check_fields(self)
        w = self.window
        for name in ("short", "long", "fixed"):
            v = getattr(w, name)
            if v is not None and v > self.seq_len:
                raise ConfigError(
                    f"window.{name}={v} is larger than seq_len={self.seq_len}; a window can be "
                    f"at most the training sequence length"
                )
        if w.kind == "stochastic" and w.short > w.long:
            raise ConfigError(f"window.short={w.short} must not exceed window.long={w.long}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if not isinstance(self.model, SwaxConfig):
            raise ConfigError(f"model must be a SwaxConfig, got {type(self.model).__name__}")
        if self.model.window != w.long:
            raise ConfigError(
                f"model.window={self.model.window} differs from window.long={w.long}: the "
                f"model's window is the run's long window (of the anneal phase and evaluation); "
                f"leave model.window out, or set both to the same value"
            )

    def micro_batch(self, world_size: int) -> int:
        """Sequences per rank per micro-batch; the global batch must divide evenly."""
        denom = world_size * self.optim.grad_accum
        if self.batch_size % denom:
            raise ConfigError(
                f"batch_size={self.batch_size} is not divisible by world_size × grad_accum = "
                f"{world_size} × {self.optim.grad_accum}"
            )
        return self.batch_size // denom

    def to_dict(self) -> dict:
        return to_dict(self)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def init_model_section(data: dict) -> dict:
    """Plain data with ``init_from: FOLDER``: its model section is FOLDER's config.json (less
    its window, which becomes the run's window.long unless the run sets one) with the
    section's own keys on top; a ``preset`` there is an error. A complete model section (a
    resumed run's config.yaml) is kept as it is."""
    src, model = data.get("init_from"), data.get("model", {})
    if not src or not isinstance(src, str) or not isinstance(model, dict):
        return data
    if "preset" in model:
        raise ConfigError(
            f"model.preset={model['preset']!r} cannot be combined with init_from: the model is "
            f"{src}'s config.json (model.* keys may change its other fields)"
        )
    if set(model) >= set(SwaxConfig.__dataclass_fields__):
        return data
    folder = Path(src)
    if not (folder / "config.json").is_file() and (folder / "model" / "config.json").is_file():
        folder = folder / "model"  # a training run's folder stands for its model/
    try:
        base = SwaxConfig.load(folder / "config.json").to_dict()
    except ConfigError as e:
        raise ConfigError(f"init_from={src}: {e}") from None
    window = base.pop("window")
    data = {**data, "model": {**base, **model}}
    return data if "window" in model else _folder_window(data, window, src)


def _folder_window(data: dict, window: int, src: str) -> dict:
    """``data`` whose window.long, unless it sets one, is ``window``: the init_from folder's
    own (an import's --window). One the run cannot train at is an error naming where it is from."""
    section = data.get("window", {})
    if not isinstance(section, dict) or "long" in section:
        return data  # set by the run (or a bad section, which its own check names)
    seq_len = data.get("seq_len", TrainConfig.seq_len)
    short = section.get("short", WindowConfig.short)
    why = None
    if isinstance(seq_len, int) and window > seq_len:
        why = f"larger than seq_len={seq_len}"
    elif section.get("kind", WindowConfig.kind) == "stochastic" and isinstance(short, int):
        why = f"shorter than window.short={short}" if short > window else None
    if why:
        raise ConfigError(
            f"init_from={src}: its window {window} (the run's window.long unless set) is {why}; "
            "set window.long (and window.short) to the windows to train at"
        )
    return {**data, "window": {**section, "long": window}}


# ------------------------------------------------------------------------------ loading


def parse_override(text: str, cls: type | None = None) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value). The value is read by the type of the field it
    sets in dataclass ``cls`` (default :class:`TrainConfig`; :func:`swax.core.configs.
    parse_text`): ``seed=010`` is 10, ``run_dir=010`` the string "010", ``log.wandb=off`` the
    string "off", ``resume=false`` false, a list in YAML flow style; a key of no known field
    is read as YAML (its error comes from the config: "unknown config key ...")."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. optim.lr=3e-4)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    path = key.split(".")
    return path, parse_text(raw, field_type(cls or TrainConfig, path), key)


def _set(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a section")
        node = nxt
    node[path[-1]] = value


RESUME_MAY_CHANGE = (
    "steps",
    "threads",
    "resume",
    "device",
    "log",
    "guard",
    "checkpoint.every",
    "checkpoint.keep",
    "checkpoint.format",
    "checkpoint.async_save",
    "dist",
)
"""Keys (or sections) a resumed run may set differently from its config.yaml: how long it runs,
where and how fast, and what it logs; everything that shapes the model, the data order or the
optimisation must stay as the run started."""


def load_train_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """A TrainConfig from a YAML file (None: the defaults = the tiny run) and key=value
    overrides. Errors name the file or the dotted key. With ``resume`` true or auto and a
    ``config.yaml`` in the run folder (the resolved config a run writes at its start), that
    config is the base: the keys given here must equal it, except those in RESUME_MAY_CHANGE,
    which replace its values."""
    data: dict = {}
    if path is not None:
        data = load_yaml_mapping(path, "config file")
    for text in overrides:
        keys, value = parse_override(text)
        _set(data, keys, value)
    saved = Path(data.get("run_dir", TrainConfig.run_dir)) / "config.yaml"
    if data.get("resume", False) in (True, "auto") and saved.is_file():
        data = _resumed_config(data, saved)
    return from_dict(TrainConfig, data)


RETIRED_KEYS = {"guard": ("inject_nan_grad", "inject_nan_loss")}
"""Keys earlier versions wrote into every run's config.yaml that are config keys no more (the
fault injector is the test hook SWAX_TEST_FAULTS now): dropped when a saved config.yaml is read,
so those runs still resume; given in a config or on the command line, an unknown key."""


def _without_retired(saved: dict) -> dict:
    out = dict(saved)
    for section, keys in RETIRED_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


def _resumed_config(data: dict, saved_path: Path) -> dict:
    """The saved run's config with the given keys that may change; a given key that differs
    from the saved run and may not change is one ConfigError naming it and both values."""
    saved = from_dict(
        TrainConfig, _without_retired(load_yaml_mapping(saved_path, "the run's config.yaml"))
    )
    out = saved.to_dict()
    theirs = _flat(out)
    given, origin = _given_keys(data)
    for key, value in given.items():
        changeable = any(key == k or key.startswith(k + ".") for k in RESUME_MAY_CHANGE)
        if changeable or key == "run_dir":
            _set(out, key.split("."), value)
        elif key not in theirs or theirs[key] != value:
            raise ConfigError(
                f"{key}={value!r}{origin.get(key, '')} differs from the run being resumed "
                f"({saved_path} has {key}={theirs.get(key)!r}); a resumed run keeps its "
                f"settings except {', '.join(RESUME_MAY_CHANGE)}: drop the key, or use another "
                f"run_dir"
            )
    return out


def _given_keys(data: dict) -> tuple[dict, dict]:
    """({dotted key: value} of the keys given, {key: where its value comes from}): a model
    section's ``preset`` stands for the fields the preset sets (window aside: the model's
    window is the run's long window unless given), so that a preset given again is compared
    field by field with the run's model (a config.yaml holds the model's every field)."""
    model = data.get("model")
    if not isinstance(model, dict) or "preset" not in model:
        return _flat(data), {}
    expanded = SwaxConfig.expand_keys(model, "model.")
    implied = [k for k in expanded if k not in model and k != "window"]
    keep = {k: v for k, v in expanded.items() if k in model or k in implied}
    given = _flat({**data, "model": keep})
    origin = {f"model.{k}": f" (of model.preset={model['preset']})" for k in implied}
    return given, origin


def _flat(tree: dict, prefix: str = "") -> dict:
    """{dotted key: value} of the leaves of a nested dict (a dict value of the model section
    counts as its keys)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def train_config_keys() -> list[tuple[str, str, str]]:
    """(dotted key, default, first sentence of its docstring) of every key a training config
    takes (:func:`swax.core.configs.config_keys`); in place of ``model``, ``model.preset`` and
    the model's fields (whose defaults are the tiny preset's)."""
    rows = config_keys(TrainConfig)
    i = next(j for j, r in enumerate(rows) if r[0] == "model")
    preset = (
        "model.preset",
        "tiny",
        f"Named preset, one of {', '.join(PRESETS)}; the model.* keys given override its fields",
    )
    return [*rows[:i], preset, *config_keys(SwaxConfig, "model."), *rows[i + 1 :]]


def save_train_config(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def anneal_start(total_steps: int, anneal_frac: float) -> int:
    """First step of the anneal phase: the final ceil(anneal_frac · total) steps."""
    return total_steps - math.ceil(anneal_frac * total_steps)

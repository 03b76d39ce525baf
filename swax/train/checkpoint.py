"""Resumable training checkpoints, written atomically, in safetensors + JSON (never pickle).

Layout of ``run_dir/checkpoints/step_000100/``:

- ``model.safetensors``: the full (unsharded) model state dict;
- ``optimizer.safetensors`` + ``optimizer.json``: AdamW moments keyed by parameter name, and
  the param groups;
- ``rng.safetensors``: rank 0's RNG state (the same file in both formats; checkpoints written
  before it existed kept it in ``model.safetensors`` under ``__rng__.*`` keys, and still load);
- ``trainer.json``: step, data-loader position, elapsed time, metrics, config, the SHA-256 of
  the files above (written last: a directory without it is incomplete and ignored).

A checkpoint is written to ``step_000100.tmp/`` and renamed when complete, so a run killed
mid-write leaves the previous checkpoint intact. The last ``keep`` checkpoints are kept.
Works for plain, DDP and FSDP2 models through ``torch.distributed.checkpoint.state_dict``.

Under FSDP2 checkpoints are **sharded** instead (:mod:`swax.train.sharded`): each rank writes its
own shard with ``torch.distributed.checkpoint``, nothing is gathered, and the save can run in
the background (:class:`PendingSave`) while the steps go on. Either format loads into any world
size; the one a checkpoint has is read from its files. :class:`Checkpoints` is a run's view of
them: how it writes them, the save in flight, the newest one it can go back to.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from swax.core.errors import CheckpointError, CorruptCheckpointError
from swax.core.integrity import checksums, match_umask, verify_checksums
from swax.core.paths import writing
from swax.model import state_dict_mismatch
from swax.train import sharded as S

log = logging.getLogger("swax")
STEP_RE = re.compile(r"^step_(\d+)$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir() and (p / "trainer.json").is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


RNG_FILE = "rng.safetensors"
"""Where a checkpoint of either format keeps rank 0's RNG state."""
LEGACY_RNG = "__rng__."
"""The prefix under which full checkpoints written before ``rng.safetensors`` kept the RNG
state, inside ``model.safetensors``."""
DATA_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json", RNG_FILE)
"""The files of a checkpoint whose SHA-256 ``trainer.json`` records (under ``checksums``)."""


def _write_files(tmp: Path, model_sd: dict, optim_sd: dict, trainer_state: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model_sd.items()}, str(tmp / "model.safetensors"))
    by_param, meta = S.split_optimizer(optim_sd)
    tensors = {
        f"{fqn}::{name}": value.detach().contiguous().cpu()
        for fqn, st in by_param.items()
        for name, value in st.items()
    }
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "optimizer.json").write_text(json.dumps(meta))
    for name in DATA_FILES:
        match_umask(tmp / name)
    state = {**trainer_state, "checksums": checksums(tmp, list(DATA_FILES))}
    (tmp / "trainer.json").write_text(json.dumps(state, indent=1))


def weights_finite(model) -> bool:
    """Whether every weight of ``model`` is finite, on every rank (each checks its own shard)."""
    bad = torch.zeros(1)
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if not torch.isfinite(local.detach()).all():
            bad += 1
            break
    if dist.is_initialized():
        bad = bad.to(next(model.parameters()).device)
        dist.all_reduce(bad)
    return not bool(bad.item())


class PendingSave:
    """A checkpoint being written in the background (``checkpoint.async_save``): its shards are
    staged (copied) already, so the steps may change the weights; once every rank's shard is
    written, rank 0 completes it (side files, checksums, trainer.json, rename), also in the
    background. :meth:`wait` blocks until that is done and raises what went wrong."""

    def __init__(self, future, finalize: Callable[[], None], final: Path):
        self.future, self._finalize, self.final = future, finalize, final

    def done(self) -> bool:
        return self.future.done()

    def wait(self) -> Path:
        self.future.result()  # raises what the writer raised
        if self._finalize is not None:
            self._finalize()
            self._finalize = None
        return self.final


def _write_rng(folder: Path) -> None:
    """This process's RNG state (torch, and CUDA when present) into ``folder/rng.safetensors``."""
    from safetensors.torch import save_file

    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_file(rng, str(folder / RNG_FILE))


def _read_rng(path: Path, model_sd: dict | None = None) -> dict:
    """The RNG state of checkpoint ``path``: its ``rng.safetensors``, or in a full checkpoint
    written before that file, the ``__rng__.*`` entries of ``model_sd`` (its model.safetensors,
    from which they are removed)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    keys = [k for k in (model_sd or {}) if k.startswith(LEGACY_RNG)]
    legacy = {k[len(LEGACY_RNG) :]: model_sd.pop(k) for k in keys}
    if legacy and not (path / RNG_FILE).exists():
        return legacy
    try:
        return load_file(str(path / RNG_FILE))
    except (SafetensorError, OSError) as e:
        raise CorruptCheckpointError(f"checkpoint {path} has no readable RNG state: {e}") from None


def _promote(tmp: Path, final: Path, run_dir, keep: int) -> None:
    """Rename the complete ``tmp`` to ``final`` (swapping out an older save of the same step),
    then drop all but the last ``keep`` checkpoints."""
    if final.exists():  # re-saving a step (e.g. after a resume): swap, then delete the old
        old = final.with_name(final.name + ".old")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    for stale in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)


@dataclass
class Checkpoints:
    """A run's checkpoints: how it writes them (the folder, how many it keeps, this process's
    part, the format) and where it stands with them (the background save being written, the
    newest checkpoint written or restored). Under torch.distributed every rank holds one and
    calls :meth:`save` alike."""

    run_dir: Path
    keep: int = 2
    """The last K checkpoints are kept (checkpoint.keep)."""
    is_main: bool = True
    """This process writes the files every rank shares (rank 0)."""
    sharded: bool = False
    """Each rank writes its shard (checkpoint.format; swax.train.sharded)."""
    background: bool = False
    """Sharded checkpoints are written in the background (checkpoint.async_save)."""
    group: Any = None
    """The process group background saves talk on (their own, next to the steps')."""
    pending: PendingSave | None = None
    """The background save being written, if any."""
    newest: Path | None = None
    """The newest checkpoint written or restored: what a rollback goes back to."""

    def write(self, step: int, model, optimizer, state: dict) -> Path | PendingSave | None:
        """Write checkpoint ``step`` of ``model`` and ``optimizer`` with the trainer state
        ``state`` (collective under torch.distributed: every rank calls it). Weights that are
        not finite are never saved: a CheckpointError, the older checkpoints kept. A background
        write returns a :class:`PendingSave`; else the checkpoint's path (None off rank 0)."""
        if not weights_finite(model):
            raise CheckpointError(
                f"not saving step {step}: the weights hold non-finite values; the checkpoints "
                f"before it are kept in {checkpoint_dir(self.run_dir)}"
            )
        if self.sharded:
            return self._write_sharded(step, model, optimizer, {**state, "step": step})
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
        final = checkpoint_dir(self.run_dir) / f"step_{step:06d}"
        if self.is_main:
            tmp = final.with_name(final.name + ".tmp")
            if tmp.exists():
                shutil.rmtree(tmp)
            with writing(f"checkpoint {final.name}", tmp, cleanup=[tmp]):
                tmp.mkdir(parents=True)
                _write_rng(tmp)
                _write_files(tmp, model_sd, optim_sd, {**state, "step": step})
            _promote(tmp, final, self.run_dir, self.keep)
        if dist.is_initialized():
            dist.barrier()
        return final if self.is_main else None

    def _write_sharded(self, step: int, model, optimizer, state: dict):
        from torch.distributed.checkpoint import FileSystemWriter

        final = checkpoint_dir(self.run_dir) / f"step_{step:06d}"
        tmp = final.with_name(final.name + ".tmp")
        if self.is_main:
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / S.SHARDS).mkdir(parents=True)
        if dist.is_initialized():
            dist.barrier()
        tensors, meta = S.split_state(model, optimizer)
        if self.is_main:  # the RNG as it is now, not when the background write ends
            _write_rng(tmp)

        def finalize() -> None:  # rank 0, once every rank's shard is on disk
            with writing(f"checkpoint {final.name}", tmp, cleanup=[tmp]):
                S.write_side_files(tmp, meta)
                names = [*S.shard_files(tmp), *S.SHARDED_FILES]
                for name in names:
                    match_umask(tmp / name)
                done = {**state, "format": "sharded", "checksums": checksums(tmp, names)}
                (tmp / "trainer.json").write_text(json.dumps(done, indent=1))
            _promote(tmp, final, self.run_dir, self.keep)

        writer = FileSystemWriter(str(tmp / S.SHARDS))
        if self.background:
            return self._write_in_background(tensors, writer, finalize, final)
        from torch.distributed.checkpoint import save

        with writing(f"checkpoint {final.name}", tmp, cleanup=[tmp] if self.is_main else []):
            with S.quiet():
                save(tensors, storage_writer=writer, **S.single_process(save))
        if self.is_main:
            finalize()
        if dist.is_initialized():
            dist.barrier()
        return final if self.is_main else None

    def _write_in_background(self, tensors, writer, finalize, final: Path) -> PendingSave:
        from torch.distributed.checkpoint import async_save

        with S.quiet():
            out = async_save(
                tensors,
                storage_writer=writer,
                process_group=self.group,
                **S.single_process(async_save),
            )
        written = getattr(out, "upload_completion", out)
        is_main = self.is_main

        def complete() -> None:  # in the background too: rank 0 hashes and renames
            written.result()
            if is_main:
                finalize()

        pool = ThreadPoolExecutor(1, thread_name_prefix="swax-checkpoint")
        future = pool.submit(complete)
        pool.shutdown(wait=False)
        return PendingSave(future, None, final)

    # ------------------------------------------------------------------ the run's saves
    def save(self, step: int, model, optimizer, state: dict) -> None:
        """Checkpoint ``step``. A background save returns at once; the one before it is waited
        for first, so at most one is being written."""
        self.wait()
        out = self.write(step, model, optimizer, state)
        if isinstance(out, PendingSave):
            self.pending = out
        self.newest = checkpoint_dir(self.run_dir) / f"step_{step:06d}"

    def poll(self) -> None:
        """Complete a background save whose shards are all written (rank 0 renames it)."""
        if self.pending is not None and self.pending.done():
            self.pending.wait()
            self.pending = None

    def settle(self) -> None:
        """On the way out after an error: complete a background save whose shards get written
        (no collective, so a dead rank cannot hang it); one that fails stays absent."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.wait()
            except Exception as e:  # noqa: BLE001 - the error already leaving wins
                log.warning("the background checkpoint %s was not completed: %s", pending.final, e)

    def wait(self) -> None:
        """Wait for a background save to be complete on every rank."""
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
        if self.background and dist.is_initialized():
            dist.barrier()

    def restore(self, model, optimizer, warn: Callable[[str], None]) -> dict:
        """Load the newest intact checkpoint (:func:`load_latest_checkpoint`) into ``model``,
        ``optimizer`` and the RNG; it becomes :attr:`newest`. Returns its trainer state."""
        self.newest, state = load_latest_checkpoint(
            self.run_dir, model, optimizer, warn, self.is_main
        )
        return state


def load_latest_checkpoint(
    run_dir: str | Path, model, optimizer, warn: Callable[[str], None], is_main: bool = True
) -> tuple[Path, dict]:
    """Restore the newest checkpoint of ``run_dir`` that reads back intact: a corrupt one
    (checksum, truncated or unparsable file) is skipped with ``warn`` naming it, renamed
    ``step_N.corrupt`` (kept for inspection, no longer a checkpoint of the run) on rank 0, and
    the one before it is tried.
    Returns (checkpoint path, trainer state). A checkpoint that does not match the model is an
    error at once: the older ones would not match either."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise CheckpointError(f"{run_dir} holds no checkpoint to resume from")
    skipped = []
    for path in reversed(ckpts):
        try:
            return path, load_checkpoint(path, model, optimizer)
        except CorruptCheckpointError as e:
            skipped.append(path.name)
            warn(f"warning: skipping {path.name} (renamed {path.name}.corrupt): {e}")
            if is_main:
                os.replace(path, path.with_name(path.name + ".corrupt"))
    raise CheckpointError(
        f"no intact checkpoint in {checkpoint_dir(run_dir)} (all of {', '.join(skipped)} are "
        f"corrupt); start over with overwrite=true or restore a copy"
    )


def read_trainer_state(path: str | Path) -> dict:
    try:
        return json.loads((Path(path) / "trainer.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"checkpoint {path} is unreadable: {e}") from None


def _check_model_matches(path: Path, state: dict, model, model_sd: dict) -> None:
    """A CheckpointError saying how the checkpoint's tensors differ from ``model``'s and which
    model settings it was trained with, before anything is loaded."""

    # names and global shapes from the unwrapped module (DDP's .module; FSDP2 keeps the names
    # and its DTensors report the full shape): the same on every rank and nothing gathered, so
    # every rank reaches the same verdict
    raw = model.module if hasattr(model, "module") else model
    problem = state_dict_mismatch(raw.state_dict(), model_sd)
    if problem is None:
        return
    saved = (state.get("config") or {}).get("model")
    raise CheckpointError(
        f"checkpoint {path} does not match this model: {problem}"
        + (f"; it was trained with model={saved}" if saved is not None else "")
    )


def load_checkpoint(path: str | Path, model, optimizer) -> dict:
    """Restore model, optimizer and RNG from ``path``; return the trainer state."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    state = read_trainer_state(path)
    if "checksums" in state:  # checkpoints from before checksums load without the check
        verify_checksums(path, state["checksums"], f"checkpoint {path}")
    if (path / S.SHARDS).is_dir():
        rng = _read_rng(path)
        _load_sharded(path, state, model, optimizer)
        _set_rng(rng)
        return state
    try:
        model_sd = load_file(str(path / "model.safetensors"))
        optim_t = load_file(str(path / "optimizer.safetensors"))
        optim_meta = json.loads((path / "optimizer.json").read_text())
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt: {e}") from None
    rng = _read_rng(path, model_sd)
    by_param: dict[str, dict] = {}
    for key, value in optim_t.items():
        fqn, name = key.split("::", 1)
        by_param.setdefault(fqn, {})[name] = value
    _check_model_matches(path, state, model, model_sd)
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=model_sd,
            optim_state_dict=S.join_optimizer(by_param, optim_meta),
            options=_options(),
        )
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {path} does not match this model/optimizer: {str(e).splitlines()[0]}"
        ) from None
    _set_rng(rng)
    return state


def load_init_weights(folder: str | Path, model) -> Path:
    """The weights of the swax model folder ``folder`` (a training run's folder stands for its
    model/) into ``model`` (plain, DDP or FSDP: every rank reads the file), for ``init_from``;
    checked against the model first (CheckpointError saying how they differ). Returns the
    weights file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    from swax.core.integrity import verify_checksum_file
    from swax.model import WEIGHTS_NAME, resolve_model_dir

    folder = resolve_model_dir(folder)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise CheckpointError(f"init_from={folder}: no {WEIGHTS_NAME} there")
    verify_checksum_file(folder, [WEIGHTS_NAME])
    try:
        sd = load_file(str(weights))
    except (SafetensorError, OSError) as e:
        raise CorruptCheckpointError(f"init_from: {weights} is corrupt: {e}") from None
    raw = model.module if hasattr(model, "module") else model
    problem = state_dict_mismatch(raw.state_dict(), sd)
    if problem:
        raise CheckpointError(f"init_from={folder}: its weights do not fit the model: {problem}")
    set_model_state_dict(model, sd, options=_options())
    return weights


def _set_rng(rng: dict) -> None:
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def _load_sharded(path: Path, state: dict, model, optimizer) -> None:
    """Weights and optimizer from a sharded checkpoint, into this world size."""
    import pickle

    from safetensors import SafetensorError

    try:
        saved = S.saved_model_shapes(path)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError) as e:
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt: {e}") from None
    _check_model_matches(path, state, model, saved)
    try:
        S.load_sharded(path, model, optimizer)
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt: {e}") from None
    except (RuntimeError, KeyError, ValueError) as e:  # DCP's CheckpointException among them
        raise CheckpointError(
            f"checkpoint {path} does not match this model/optimizer: {str(e).splitlines()[0]}"
        ) from None

"""Run control: one writer per run folder, and stopping cleanly on SIGINT / SIGTERM.

- :class:`RunLock` holds an exclusive ``flock`` on ``run_dir/.swax.lock`` for the life of a
  training process, so a second ``swax train`` on the same folder stops at once with an error
  naming the holder, instead of interleaving its metrics and checkpoints with the first. The
  kernel drops the lock when the holder exits, however it exits (``kill -9`` included): there is
  no stale lock to remove by hand. (``flock`` is advisory and local: two machines writing one
  folder on a network file system are not stopped by it.)
- :class:`~swax.core.signals.StopSignals` turns the first SIGINT (Ctrl-C) or SIGTERM (what SLURM
  and most schedulers send before preemption) into a request that the training loop honours at the
  next step boundary: it saves a checkpoint of that step and exits, so that ``resume=true``
  continues exactly where it stopped. A second signal stops at once (the last complete
  checkpoint is kept; a checkpoint being written is abandoned, never half-renamed).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from swax.core.errors import ConfigError
from swax.core.signals import Stopped, StopSignals

__all__ = ["RunLock", "StopSignals", "TrainingStopped", "remove_stale_files"]

LOCK_NAME = ".swax.lock"
log = logging.getLogger("swax")


class RunLock:
    """An exclusive, non-blocking lock on a run folder (a no-op where ``fcntl`` is missing)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks; run folders are not guarded
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file: flock works read-only too
            fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # a file system without flock (NFS without a lock daemon, some Lustre mounts)
                os.close(fd)
                log.warning("run_dir %s cannot be locked (%s); not guarded", self.path.parent, e)
                return
            holder = os.read(fd, 4096).decode(errors="replace").strip()
            os.close(fd)
            raise ConfigError(
                f"run_dir {self.path.parent} is in use by another swax train "
                f"({_describe(holder)}); "
                f"wait for it to finish, stop it, or use another run_dir"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        with contextlib.suppress(OSError):  # read-only descriptor: the holder stays unnamed
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(holder).encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _describe(holder: str) -> str:
    try:
        h = json.loads(holder)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"]))
        return f"pid {h['pid']} on {h['host']}, started {started}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def remove_stale_files(run_dir: Path) -> list[Path]:
    """Remove what an interrupted writer of this run left behind (``checkpoints/*.tmp`` and
    ``*.old`` folders, ``model/*.tmp`` files); only safe while holding the run's lock. Returns
    the removed paths."""
    stale = []
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir():
        _recover_half_renamed(ckpts)
        stale += [p for p in ckpts.iterdir() if p.suffix in (".tmp", ".old")]
    model = run_dir / "model"
    if model.is_dir():
        stale += [p for p in model.iterdir() if p.suffix == ".tmp" or p.name.startswith(".tmp")]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return stale


def _recover_half_renamed(ckpts: Path) -> None:
    """A re-save of step N renames step_N to step_N.old, then step_N.tmp to step_N; killed in
    between, step_N is missing: put back the complete one (the new if it is complete)."""
    for p in sorted(ckpts.glob("step_*.old")) + sorted(ckpts.glob("step_*.tmp")):
        final = p.with_suffix("")
        if not final.exists() and (p / "trainer.json").is_file():
            if p.suffix == ".old" and (p.with_suffix(".tmp") / "trainer.json").is_file():
                continue  # the new one, complete, is put back instead
            os.replace(p, final)


class TrainingStopped(Stopped):
    """Training stopped on a signal after saving a checkpoint (exit 130 for SIGINT, 143 for
    SIGTERM)."""

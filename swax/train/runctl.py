"""Run control: one writer per run folder, and stopping cleanly on SIGINT / SIGTERM.

- :class:`RunLock` holds an exclusive lock on ``run_dir/.swax.lock`` (the ``filelock``
  library's ``FileLock``: ``flock`` on Unix, a Windows file lock on Windows) for the life of a
  training process, so a second ``swax train`` on the same folder stops at once with an error
  naming the holder (pid, host, start time, kept in ``run_dir/.swax.lock.holder`` while the
  lock is held), instead of interleaving its metrics and checkpoints with the first. The kernel
  drops the lock when the holder exits, however it exits (``kill -9`` included): there is no
  stale lock to remove by hand. (``flock`` is advisory and local: two machines writing one
  folder on a network file system are not stopped by it.)
- :class:`~swax.core.signals.StopSignals` turns the first SIGINT (Ctrl-C) or SIGTERM (what SLURM
  and most schedulers send before preemption) into a request that the training loop honours at the
  next step boundary: it saves a checkpoint of that step and exits, so that ``resume=true``
  continues exactly where it stopped. A second signal stops at once (the last complete
  checkpoint is kept; a checkpoint being written is abandoned, never half-renamed).
"""

from __future__ import annotations

import contextlib
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
HOLDER_NAME = ".swax.lock.holder"
log = logging.getLogger("swax")


class RunLock:
    """An exclusive, non-blocking lock on a run folder."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.holder = Path(run_dir) / HOLDER_NAME
        self.lock = None

    def acquire(self) -> None:
        """Take the lock, or raise a ConfigError naming its holder. Where the file system
        cannot lock (NFS without a lock daemon, some Lustre mounts, a lock file of another
        user), warn and go on unguarded."""
        from filelock import FileLock, Timeout

        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path)
        try:
            lock.acquire(timeout=0)
        except Timeout:  # a TimeoutError, hence an OSError: before the clause below
            raise ConfigError(
                f"run_dir {self.path.parent} is in use by another swax train "
                f"({_describe(self.holder)}); "
                f"wait for it to finish, stop it, or use another run_dir"
            ) from None
        except (OSError, NotImplementedError) as e:
            log.warning("run_dir %s cannot be locked (%s); not guarded", self.path.parent, e)
            return
        self.lock = lock
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        tmp = self.holder.with_name(self.holder.name + ".tmp")
        with contextlib.suppress(OSError):  # the holder then stays unnamed
            tmp.write_text(json.dumps(holder))
            os.replace(tmp, self.holder)

    def release(self) -> None:
        if self.lock is not None:
            with contextlib.suppress(OSError):  # before the lock: never a new holder's name
                self.holder.unlink(missing_ok=True)
            self.lock.release()
            self.lock = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _describe(holder: Path) -> str:
    try:
        h = json.loads(holder.read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"]))
        return f"pid {h['pid']} on {h['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
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

"""The host side of the sandbox, before and around a run: the programs' texts, the run's
environment, resource limits and folder, the uid's reach, and starting, waiting for and
stopping the launcher.

Like :mod:`swax.eval.sandbox.host`, it imports only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

# The two programs (swax/eval/sandbox/launcher.py and the runner), each run by a fresh
# interpreter that gets its text on the command line: the launcher, started by the evaluating
# process as `python -I -S -B -c`, and the runner, which the launcher execs as `python -I -B -c`.
# The runner's text is its three files joined in this order (runner.py, last, calls main).
# They import nothing from swax.
_HERE = Path(__file__).parent
_LAUNCHER = (_HERE / "launcher.py").read_text(encoding="utf-8")
_RUNNER_FILES = ("runner_guard.py", "runner_audit.py", "runner.py")
_RUNNER = "\n".join((_HERE / name).read_text(encoding="utf-8") for name in _RUNNER_FILES)

_SANDBOX_UID = 65534  # nobody
_GRACE = 30.0  # seconds the evaluating process waits beyond the timeout for the launcher


def _clean_env(tmp: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": tmp,
        "TMPDIR": tmp,
        "OMP_NUM_THREADS": "1",
    }


def _limits(timeout: float, memory_mb: int | None, max_file_mb: int) -> dict[str, int | None]:
    """The resource limits set before the program's interpreter starts (RLIMIT_NPROC is set
    by the runner itself, after it started the program's thread, where seccomp is missing)."""
    return {
        "RLIMIT_AS": None if memory_mb is None else int(memory_mb) * 2**20,
        "RLIMIT_CPU": int(timeout) + 2,
        "RLIMIT_FSIZE": int(max_file_mb) * 2**20,
        "RLIMIT_NOFILE": 256,
        "RLIMIT_CORE": 0,
    }


def _proc_mounts() -> list[str]:
    """Where procfs is mounted (/proc and any other mount of it), from /proc/self/mountinfo."""
    mounts = {"/proc"}
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if right.split()[:1] == ["proc"] and len(fields) > 4:
                    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                    mounts.add(point)
    except OSError:
        pass
    return sorted(mounts)


def _others_can_enter(path: str) -> bool:
    """Whether every directory down to ``path`` can be traversed by an unrelated uid."""
    p = os.path.realpath(path)
    while True:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if p == os.path.dirname(p):
            return True
        p = os.path.dirname(p)


def _sandbox_parent() -> str | None:
    """A folder for the temporary folders that the sandbox uid can reach."""
    for d in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(d) and _others_can_enter(d):
            return d
    return None


def _wait_exited(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the child ``pid`` to exit, without reaping it (its
    process group stays reserved until then)."""
    try:
        pfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pfd = None
    if pfd is not None:
        try:
            select.select([pfd], [], [], max(0.0, timeout))
        finally:
            os.close(pfd)
    else:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
            time.sleep(0.02)
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _write_program(tmp: str, program: str, uid_mode: str | None) -> str:
    """Write ``program`` to ``tmp/program.py``; both belong to the sandbox uid if it runs as
    that. Returns the file's path."""
    prog_path = os.path.join(tmp, "program.py")
    with open(prog_path, "w", encoding="utf-8") as f:
        f.write(program)
    if uid_mode:
        os.chown(tmp, _SANDBOX_UID, _SANDBOX_UID)
        os.chown(prog_path, _SANDBOX_UID, _SANDBOX_UID)
    return prog_path


def _send(fd: int, cfg: dict) -> None:
    """Write ``cfg`` (JSON) to the pipe ``fd`` and close it."""
    try:
        os.write(fd, json.dumps(cfg).encode())  # small: fits in the pipe
    finally:
        os.close(fd)


def _start_launcher(cfg: dict, tmp: str, out: IO[bytes], fds: tuple[int, ...]) -> subprocess.Popen:
    """Start the launcher with its configuration ``cfg`` on the command line, in ``tmp``, in a
    new session, with the minimal environment; it inherits the pipe ends ``fds``, closed here
    once it started."""
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _LAUNCHER, json.dumps(cfg)],
            cwd=tmp,
            env=_clean_env(tmp),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
            start_new_session=True,
        )
    finally:
        for fd in fds:
            os.close(fd)


def _stop_launcher(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for the launcher, kill what is left of its process group and reap it. Returns
    whether the backstop fired (the launcher itself hung past the timeout and the grace)."""
    backstop = False
    if not _wait_exited(proc.pid, timeout + _GRACE):
        backstop = True  # the launcher itself hangs: kill its whole process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    # The launcher has exited but is not reaped, so its process group id is still its own:
    # whatever is left in the group (where the launcher had no subreaper) dies here.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return backstop

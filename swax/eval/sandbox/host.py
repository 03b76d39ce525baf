"""The host side of the sandbox: run a program in it and read the verdict.

:func:`run_program` writes the program to a fresh temporary folder, starts the launcher
(``launcher.py``) with a minimal environment in a new session, waits for it (the launcher runs
the runner, ``runner.py``, which runs the program) and turns the reports of both into an
:class:`ExecResult`. The guards, and what is not guarded: docs/sandbox.md.

This module imports only the standard library (``tests/test_sandbox.py`` runs it on its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["ExecResult", "run_program", "run_programs", "landlock_abi"]


@dataclass
class ExecResult:
    """Outcome of one :func:`run_program` call."""

    passed: bool
    """The program ran to its end without an exception, signal, timeout or limit."""
    status: str
    """``passed``, ``failed`` (exception, signal, exit) or ``timeout``."""
    detail: str
    """The exception (``AssertionError: ...``), the signal, or "timed out after N s"."""
    returncode: int | None
    seconds: float
    landlock_abi: int
    """Landlock ABI version applied to the program (0: not available / not applied)."""
    output: str = ""
    """The last 2000 characters the program printed (stdout and stderr)."""
    uid: int | None = None
    """The uid the program ran as (65534 when the evaluating process is root)."""
    guards: tuple[str, ...] = field(default_factory=tuple)
    """The guards that applied to this run (see docs/sandbox.md): ``separate-uid``,
    ``cap-dac-read-search``, ``landlock-write``, ``landlock-proc``, ``landlock-tcp``,
    ``landlock-scope``, ``seccomp``, ``rlimits``, ``rlimit-nproc``, ``subreaper``,
    ``audit-hook``, ``python-guard``."""

    def to_dict(self) -> dict:
        return asdict(self)


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
_LAYERS = frozenset({"uid", "landlock", "seccomp", "nproc", "subreaper", "audit", "guard"})


def _read_available(fd: int) -> bytes:
    """Everything already written to the pipe ``fd`` (without waiting for a writer that a
    stray process might still hold open); closes ``fd``."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            try:
                b = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _json_line(data: bytes) -> dict:
    """The last line of ``data`` that is a JSON object ({} if none)."""
    for line in reversed(data.decode("utf-8", "replace").splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return {}


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


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


_UID_LOCK = threading.Lock()
_UID_MODES: dict[str, str | None] = {}


def _uid_mode(python: str) -> str | None:
    """How to run programs under another uid, found once per interpreter: None (not root, not
    Linux, or setuid refused), "plain" (uid/gid 65534, no capability), or "read-all" (the same,
    keeping CAP_DAC_READ_SEARCH, for an interpreter that uid 65534 cannot read, e.g. in /root)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None
    with _UID_LOCK:
        if python not in _UID_MODES:
            mode, why = None, []
            if _sandbox_parent() is None:
                why.append("no temporary folder that other uids can enter")
            for m in ("plain", "read-all") if not why else ():
                probe = f"import os\nassert os.getuid() == os.geteuid() == {_SANDBOX_UID}\n"
                res = _launch(probe, 60.0, None, 16, True, python, frozenset(), m)
                if res.passed:
                    mode = m
                    break
                why.append(f"{m}: {res.status} {res.detail}")
            if mode is None:
                warnings.warn(
                    f"sandbox: running as root, but programs cannot run as uid {_SANDBOX_UID} "
                    f"with {python} ({'; '.join(why)}); they run as root, without the separate "
                    "uid (see ExecResult.guards)",
                    RuntimeWarning,
                    stacklevel=4,
                )
            _UID_MODES[python] = mode
        return _UID_MODES[python]


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


def _guard_names(launched: dict, setup: dict) -> tuple[str, ...]:
    g = launched.get("guards", {})
    names = []
    if g.get("uid") not in (None, 0) and g.get("uid") != os.getuid():
        names.append("separate-uid")
    if g.get("read_all"):
        names.append("cap-dac-read-search")
    for key, name in (
        ("landlock_write", "landlock-write"),
        ("landlock_proc", "landlock-proc"),
        ("landlock_tcp", "landlock-tcp"),
        ("landlock_scope", "landlock-scope"),
        ("seccomp", "seccomp"),
        ("rlimits", "rlimits"),
    ):
        if g.get(key):
            names.append(name)
    if setup.get("nproc"):
        names.append("rlimit-nproc")
    if launched.get("subreaper"):
        names.append("subreaper")
    if setup.get("audit_hook"):
        names.append("audit-hook")
    if setup.get("python_guard"):
        names.append("python-guard")
    return tuple(names)


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


def _tail(out: IO[bytes], n: int = 2000) -> str:
    """The last ``n`` bytes written to ``out``, decoded."""
    out.seek(0, os.SEEK_END)
    out.seek(max(0, out.tell() - n))
    return out.read().decode("utf-8", "replace")


def _verdict(
    launched: dict,
    setup: dict,
    lines: list[str],
    tokens: tuple[str, str],
    *,
    backstop: bool,
    launcher_status: int | None,
    timeout: float,
    seconds: float,
    output: str,
) -> ExecResult:
    """The :class:`ExecResult` of a run, from the launcher's report (``launched``), the
    runner's ``setup`` report and its result ``lines`` (with the pass and fail ``tokens``)."""
    pass_token, fail_token = tokens
    guards = launched.get("guards", {})
    abi = int(guards.get("landlock", 0) or 0)
    uid = guards.get("uid")
    names = _guard_names(launched, setup)
    rc = launched.get("rc")

    def result(passed: bool, status: str, detail: str) -> ExecResult:
        return ExecResult(passed, status, detail, rc, seconds, abi, output, uid, names)

    if backstop or launched.get("timeout"):
        return result(False, "timeout", f"timed out after {timeout:g} s")
    if not launched:
        return result(False, "failed", f"the sandbox launcher failed (status {launcher_status})")
    if guards.get("error"):
        return result(False, "failed", f"the sandbox could not start: {guards['error']}")
    if rc == 0 and f"passed {pass_token}" in lines:
        return result(True, "passed", "")
    prefix = f"failed {fail_token} "
    failures = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    if failures:
        detail = failures[-1]
    elif rc is not None and rc < 0:
        detail = f"killed by {_signal_name(-rc)}"
    else:
        detail = f"exited with status {rc} before the end of the program"
    return result(False, "failed", detail)


def _launch(
    program: str,
    timeout: float,
    memory_mb: int | None,
    max_file_mb: int,
    landlock: bool,
    python: str,
    disable: frozenset[str],
    uid_mode: str | None,
) -> ExecResult:
    """Run ``program`` once: a fresh folder, the launcher, the runner; collect the verdict."""
    pass_token, fail_token = secrets.token_hex(16), secrets.token_hex(16)
    parent = _sandbox_parent() if uid_mode else None
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(
            prefix="swax-exec-", dir=parent, ignore_cleanup_errors=True
        ) as tmp_dir,
        tempfile.TemporaryFile() as out,
    ):
        tmp = os.path.realpath(tmp_dir)
        prog_path = _write_program(tmp, program, uid_mode)
        mounts = _proc_mounts()
        runner_cfg = {
            "pass_token": pass_token,
            "fail_token": fail_token,
            "program": prog_path,
            "tmp": tmp,
            "disable": sorted(disable),
            "proc_mounts": mounts,
        }
        cfg_r, cfg_w = os.pipe()
        setup_r, setup_w = os.pipe()
        result_r, result_w = os.pipe()
        report_r, report_w = os.pipe()
        _send(cfg_w, runner_cfg)
        launcher_cfg = {
            "timeout": timeout,
            "python": python,
            "runner": _RUNNER,
            "runner_fds": [cfg_r, setup_w, result_w],
            "report_fd": report_w,
            "tmp": tmp,
            "limits": _limits(timeout, memory_mb, max_file_mb),
            "landlock": bool(landlock),
            "landlock_proc": True,
            "proc_mounts": mounts,
            "uid": _SANDBOX_UID if uid_mode else None,
            "gid": _SANDBOX_UID if uid_mode else None,
            "read_all": uid_mode == "read-all",
            "disable": sorted(disable),
        }
        proc = _start_launcher(launcher_cfg, tmp, out, (cfg_r, setup_w, result_w, report_w))
        backstop = _stop_launcher(proc, timeout)
        launched = _json_line(_read_available(report_r))
        setup = _json_line(_read_available(setup_r))
        lines = _read_available(result_r).decode("utf-8", "replace").splitlines()
        output = _tail(out)
    return _verdict(
        launched,
        setup,
        lines,
        (pass_token, fail_token),
        backstop=backstop,
        launcher_status=proc.returncode,
        timeout=timeout,
        seconds=time.perf_counter() - start,
        output=output,
    )


def _execute(
    program: str,
    *,
    timeout: float = 10.0,
    memory_mb: int | None = 1024,
    max_file_mb: int = 16,
    landlock: bool = True,
    python: str | None = None,
    disable: Collection[str] = (),
) -> ExecResult:
    """:func:`run_program` with some guards switched off (``disable``: names from
    ``_LAYERS``), so that tests can check each guard on its own. Not for evaluation."""
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    disable = frozenset(disable)
    if disable - _LAYERS:
        raise ValueError(f"unknown guards {sorted(disable - _LAYERS)}; known: {sorted(_LAYERS)}")
    python = python or sys.executable
    uid_mode = None if "uid" in disable else _uid_mode(python)
    return _launch(program, timeout, memory_mb, max_file_mb, landlock, python, disable, uid_mode)


def run_program(
    program: str,
    *,
    timeout: float = 10.0,
    memory_mb: int | None = 1024,
    max_file_mb: int = 16,
    landlock: bool = True,
    python: str | None = None,
) -> ExecResult:
    """Run ``program`` (Python source: solution + tests) in a sandboxed subprocess.

    Args:
        timeout: wall-clock seconds before the program and everything it started are killed
            (status ``timeout``).
        memory_mb: address-space limit (RLIMIT_AS) in MiB; None = no limit.
        max_file_mb: largest file the program may write (RLIMIT_FSIZE), MiB.
        landlock: apply the Landlock rules where the kernel supports them.
        python: interpreter to use (default: this one).

    See docs/sandbox.md for what the sandbox does and does not guard against;
    :attr:`ExecResult.guards` says which guards applied.
    """
    return _execute(
        program,
        timeout=timeout,
        memory_mb=memory_mb,
        max_file_mb=max_file_mb,
        landlock=landlock,
        python=python,
    )


def run_programs(
    programs: Sequence[str],
    *,
    timeout: float = 10.0,
    memory_mb: int | None = 1024,
    max_file_mb: int = 16,
    landlock: bool = True,
    workers: int | None = None,
    on_done: Callable[[int, ExecResult], None] | None = None,
) -> list[ExecResult]:
    """:func:`run_program` for each program, ``workers`` at a time (default: the CPU count);
    results in input order. ``on_done(index, result)`` is called as each one finishes."""
    workers = max(1, workers or os.cpu_count() or 1)
    results: list[ExecResult | None] = [None] * len(programs)

    def one(i: int) -> None:
        res = run_program(
            programs[i],
            timeout=timeout,
            memory_mb=memory_mb,
            max_file_mb=max_file_mb,
            landlock=landlock,
        )
        results[i] = res
        if on_done is not None:
            on_done(i, res)

    if workers == 1 or len(programs) <= 1:
        for i in range(len(programs)):
            one(i)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for fut in [pool.submit(one, i) for i in range(len(programs))]:
                fut.result()
    return results  # type: ignore[return-value]


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers to an unprivileged process (0: none)."""
    res = run_program("pass", timeout=30, memory_mb=None)
    return res.landlock_abi

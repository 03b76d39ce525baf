"""The host side of the sandbox: run a program in it and read the verdict.

:func:`run_program` writes the program to a fresh temporary folder, starts the launcher
(``launcher.py``) with a minimal environment in a new session, waits for it (the launcher runs
the runner, ``runner.py``, which runs the program) and turns the reports of both into an
:class:`ExecResult`. The guards, and what is not guarded: docs/sandbox.md.

The host side is three modules: this one (one run, the uid mode, :func:`run_program`,
:func:`run_programs`, :func:`landlock_abi`), :mod:`~swax.eval.sandbox.host_process` (the
programs' texts, the run's environment, limits and folder, the launcher's process) and
:mod:`~swax.eval.sandbox.host_verdict` (:class:`ExecResult` and the reports). They import only
the standard library and each other (``tests/eval/test_sandbox.py`` runs them from a copy of the
package).
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

from swax.eval.sandbox.host_process import (
    _RUNNER,
    _SANDBOX_UID,
    _limits,
    _proc_mounts,
    _sandbox_parent,
    _send,
    _start_launcher,
    _stop_launcher,
    _write_program,
)
from swax.eval.sandbox.host_verdict import ExecResult, _json_line, _read_available, _tail, _verdict

__all__ = ["ExecResult", "run_program", "run_programs", "landlock_abi"]

_LAYERS = frozenset({"uid", "landlock", "seccomp", "nproc", "subreaper", "audit", "guard"})

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

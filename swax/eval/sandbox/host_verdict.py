"""The host side of the sandbox, after a run: the reports of the launcher and the runner read
from their pipes and turned into an :class:`ExecResult`.

Like :mod:`swax.eval.sandbox.host`, it imports only the standard library.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field
from typing import IO


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

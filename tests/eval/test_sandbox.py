"""Sandboxed execution of model-written code (swax.eval.sandbox)."""

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from swax.eval.sandbox import host, landlock_abi, run_program, run_programs

README = Path(__file__).resolve().parents[2] / "README.md"
LANDLOCK = landlock_abi()

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"


def test_correct_solution_passes_wrong_one_fails():
    ok = run_program(SOLUTION + TESTS)
    assert ok.passed and ok.status == "passed" and ok.returncode == 0
    bad = run_program("def add(a, b):\n    return a - b\n" + TESTS)
    assert not bad.passed and bad.status == "failed"
    assert bad.detail.startswith("AssertionError")
    syntax = run_program("def add(a, b) return a\n" + TESTS)
    assert not syntax.passed and "SyntaxError" in syntax.detail


def test_infinite_loop_is_killed_by_the_timeout():
    res = run_program(SOLUTION + "while True:\n    pass\n" + TESTS, timeout=1.5)
    assert res.status == "timeout" and not res.passed  # no wall-clock bound: load varies
    res = run_program("import time\ntime.sleep(60)\n", timeout=1.0)
    assert res.status == "timeout"


def test_memory_bomb_is_stopped():
    res = run_program("x = bytearray(16 * 2**30)\n", memory_mb=512)
    assert not res.passed and "MemoryError" in res.detail
    res = run_program("x = [0] * 10**9\n", memory_mb=512)
    assert not res.passed and "MemoryError" in res.detail


def test_exiting_early_is_not_a_pass():
    for early in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "exit()\n"):
        res = run_program(SOLUTION + early + TESTS)
        assert not res.passed, early


@pytest.mark.parametrize("landlock", [True, False], ids=["landlock", "python-guard-only"])
def test_cannot_touch_files_outside_its_folder(tmp_path, landlock):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    sentinel = repo / "sentinel.txt"
    sentinel.write_text("keep me")
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    readme = README.read_bytes()
    attacks = [
        f"open({str(README)!r}, 'a').write('pwned')",
        f"open({str(sentinel)!r}, 'w').write('pwned')",
        f"import pathlib; pathlib.Path({str(sentinel)!r}).write_text('pwned')",
        f"import os; os.remove({str(sentinel)!r})",
        f"import os; os.unlink({str(sentinel)!r})",
        f"import os; os.rename({str(sentinel)!r}, 'stolen.txt')",
        f"import shutil; shutil.move({str(sentinel)!r}, 'stolen.txt')",
        f"import shutil; shutil.rmtree({str(repo / 'pkg')!r})",
        f"import os; os.truncate({str(sentinel)!r}, 0)",
        f"import os; os.chmod({str(sentinel)!r}, 0)",
        f"import os; os.mkdir({str(repo / 'new')!r})",
        f"import os; fd = os.open({str(sentinel)!r}, os.O_WRONLY | os.O_TRUNC)",
        f"import io; io.FileIO({str(sentinel)!r}, 'w')",
        f"import posix; posix.unlink({str(sentinel)!r})",
        f"import os; os.symlink({str(sentinel)!r}, 'link'); open('link', 'w').write('pwned')",
        f"import os; os.link({str(sentinel)!r}, 'hard'); open('hard', 'w').write('pwned')",
        f"import os; os.chdir({str(repo)!r}); open('sentinel.txt', 'w')",
        f"import os; d = os.open({str(repo)!r}, os.O_RDONLY); os.unlink('sentinel.txt', dir_fd=d)",
        f"import subprocess; subprocess.run(['rm', '-f', {str(sentinel)!r}])",
        f"import os; os.system('rm -f {sentinel}')",
        "import os; os.fork()",
        "import ctypes",
    ]
    results = run_programs([a + "\n" for a in attacks], workers=2, landlock=landlock)
    for attack, res in zip(attacks, results):
        assert not res.passed, attack
    assert sentinel.read_text() == "keep me"
    assert (repo / "pkg" / "mod.py").read_text() == "x = 1\n"
    assert not (repo / "new").exists()
    assert oct(sentinel.stat().st_mode & 0o777) != "0o0"
    assert README.read_bytes() == readme
    assert sorted(p.name for p in repo.iterdir()) == ["pkg", "sentinel.txt"]


@pytest.mark.skipif(LANDLOCK == 0, reason="Landlock is not available on this kernel")
def test_landlock_blocks_writes_from_c_code(tmp_path):
    """sqlite3 creates its file in C, below the Python guard: only the kernel rule stops it."""
    target = tmp_path / "evil.db"
    res = run_program(
        f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')\n"
    )
    assert not res.passed and res.landlock_abi == LANDLOCK
    assert not target.exists()


def test_writes_inside_its_folder_work():
    program = """
import os, shutil, tempfile, pathlib
open('a.txt', 'w').write('hello')
assert open('a.txt').read() == 'hello'
pathlib.Path('d/e').mkdir(parents=True)
pathlib.Path('d/e/f.txt').write_text('x')
os.rename('a.txt', 'd/b.txt')
shutil.copy('d/b.txt', 'c.txt')
shutil.rmtree('d')
os.remove('c.txt')
fd, name = tempfile.mkstemp()
os.close(fd)
os.unlink(name)
with tempfile.TemporaryDirectory() as t:
    open(os.path.join(t, 'x'), 'w').write('y')
print('some output')
"""
    res = run_program(program)
    assert res.passed, res.detail


def test_runs_in_a_fresh_folder_with_a_minimal_environment(monkeypatch):
    monkeypatch.setenv("SWAX_TEST_SECRET", "s3cret")
    program = f"""
import os, sys, tempfile
assert 'SWAX_TEST_SECRET' not in os.environ, 'environment leaked'
cwd = os.getcwd()
assert cwd != {os.getcwd()!r}
assert os.listdir('.') == ['program.py'], os.listdir('.')
assert os.environ['HOME'] == cwd and tempfile.gettempdir() == cwd
"""
    res = run_program(program)
    assert res.passed, res.detail
    first = run_program("open('left.txt', 'w').write('x')\n")
    second = run_program("import os\nassert not os.path.exists('left.txt')\n")
    assert first.passed and second.passed


def test_run_programs_keeps_order():
    programs = [f"assert {i} % 2 == 0\n" for i in range(6)]
    seen = []
    results = run_programs(programs, workers=3, on_done=lambda i, r: seen.append(i))
    assert [r.passed for r in results] == [True, False, True, False, True, False]
    assert sorted(seen) == list(range(6))
    assert os.path.exists(README)


# ------------------------------------------------------------------- guards, one claim per test
# `host._execute(..., disable=...)` switches other guards off so that each test checks one
# guard on its own; the programs undo the Python guard themselves (`del sys.modules['posix']`).

LINUX = sys.platform.startswith("linux")
ROOT = LINUX and os.geteuid() == 0
BASELINE = run_program("pass")
SECCOMP = "seccomp" in BASELINE.guards
CLEAN_ENV = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "OMP_NUM_THREADS"}
BYPASS = 'import sys\ndel sys.modules["posix"]\nimport posix\n'
WRONG = "def add(a, b):\n    return a - b\n"

needs_root = pytest.mark.skipif(not ROOT, reason="the uid change applies to a root evaluator")
needs_landlock = pytest.mark.skipif(LANDLOCK == 0, reason="Landlock is not available")
needs_linux = pytest.mark.skipif(not LINUX, reason="Linux only (/proc, prctl)")


def _param(id_, disable, *marks, landlock=True):
    return pytest.param(tuple(disable), landlock, id=id_, marks=marks)


ENVIRON_SCAN = """
import os
readable = {}
pids = {int(p) for p in os.listdir("/proc") if p.isdigit()} | {os.getppid(), EVALUATOR}
for pid in pids - {os.getpid()}:
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            data = f.read()
    except OSError:
        continue
    readable[pid] = {kv.split(b"=")[0].decode() for kv in data.split(b"\\0") if kv}
leaks = {pid: sorted(names - CLEAN) for pid, names in readable.items() if names - CLEAN}
assert not leaks, leaks
"""


def _environ_scan(evaluator: int) -> str:
    return f"EVALUATOR = {evaluator}\nCLEAN = set({sorted(CLEAN_ENV)!r})\n" + ENVIRON_SCAN


@needs_linux
@pytest.mark.parametrize(
    "disable, landlock",
    [
        _param(
            "all-guards",
            (),
            pytest.mark.skipif(not (ROOT or LANDLOCK), reason="needs root or Landlock"),
        ),
        _param("separate-uid-only", ("landlock", "audit", "guard"), needs_root, landlock=False),
        _param("landlock-only", ("uid", "audit", "guard"), needs_landlock),
    ],
)
def test_program_cannot_read_other_processes_environ(disable, landlock):
    """Hole 1: `open('/proc/%d/environ' % os.getppid())` returned the evaluator's environment
    (the old runner's parent was the evaluating process). Scans every process's environ."""
    res = host._execute(_environ_scan(os.getpid()), disable=disable, landlock=landlock)
    assert res.passed, res.detail + res.output


@needs_linux
def test_launcher_environment_is_minimal():
    """With no uid change and no Landlock, the program's parent (the launcher) still holds only
    the minimal environment."""
    program = f"""
import os
with open("/proc/%d/environ" % os.getppid(), "rb") as f:
    names = {{kv.split(b"=")[0].decode() for kv in f.read().split(b"\\0") if kv}}
assert names == set({sorted(CLEAN_ENV)!r}), sorted(names)
"""
    disable = ("uid", "landlock", "audit", "guard")
    res = host._execute(program, disable=disable, landlock=False)
    assert res.passed, res.detail + res.output


@needs_root
def test_runs_as_nobody_when_root():
    program = """
import os
assert os.getuid() == os.geteuid() == 65534 and os.getgid() == os.getegid() == 65534
assert os.getgroups() == []
assert os.stat(".").st_uid == 65534
"""
    res = run_program(program)
    assert res.passed, res.detail
    assert res.uid == 65534 and "separate-uid" in res.guards


@needs_root
def test_keeps_no_capability_when_uid_65534_can_run_the_interpreter(tmp_path):
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python >= 3.10 that uid 65534 can run")
    private = tmp_path / "root-only.txt"
    private.write_text("secret")
    private.chmod(0o600)
    program = f"""
import os
assert os.getuid() == 65534
try:
    open({str(private)!r}).read()
except PermissionError:
    pass
else:
    raise AssertionError("read a root-only file")
"""
    res = run_program(program, python=python)
    assert res.passed, res.detail + res.output
    assert "separate-uid" in res.guards and "cap-dac-read-search" not in res.guards


SPAWN = (
    BYPASS
    + """
import os
refused = 0
for _ in range(30):
    try:
        pid = posix.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        posix._exit(0)
    posix.waitpid(pid, 0)
assert refused == 30, "forked %d times" % (30 - refused)
for start in (
    lambda: posix.system("touch spawned-1"),
    lambda: posix.posix_spawn("/bin/touch", ["touch", "spawned-2"], {}),
    lambda: sys.modules.pop("_posixsubprocess", None) and __import__("_posixsubprocess"),
    lambda: __import__("subprocess").run(["/bin/touch", "spawned-3"]),
):
    try:
        start()
    except (OSError, ImportError):
        pass
assert [n for n in os.listdir(".") if n.startswith("spawned")] == []
"""
)


@pytest.mark.parametrize(
    "disable, landlock",
    [
        _param("all-guards", ()),
        _param(
            "seccomp-only",
            ("uid", "nproc", "audit", "guard"),
            pytest.mark.skipif(not SECCOMP, reason="no seccomp filter on this platform"),
        ),
        _param(
            "rlimit-nproc-only",
            ("seccomp", "audit", "guard"),
            pytest.mark.skipif(
                not LINUX or BASELINE.uid == 0, reason="RLIMIT_NPROC binds only uids other than 0"
            ),
        ),
        _param("audit-hook-only", ("uid", "seccomp", "nproc", "guard")),
    ],
)
def test_processes_cannot_be_started(disable, landlock):
    """Hole 2: as root, `posix.fork()` (the guard undone) forked 30 times and `/bin/sh -c id`
    ran. Each of seccomp, RLIMIT_NPROC under uid 65534, and the audit hook refuses it alone."""
    res = host._execute(SPAWN, disable=disable, landlock=landlock, timeout=60)
    assert res.passed, res.detail + res.output


@pytest.mark.skipif(not SECCOMP, reason="threads stay possible only with the seccomp filter")
def test_threads_work_and_the_program_is_its_own_main_module():
    program = """
import asyncio, threading, __main__
def add(a, b):
    return a + b
assert __main__.add is add and __name__ == "__candidate__"
out = []
t = threading.Thread(target=lambda: out.append(add(1, 2)))
t.start()
t.join()
assert out == [3]
async def f():
    await asyncio.sleep(0)
    return 4
assert asyncio.run(f()) == 4
"""
    res = run_program(program)
    assert res.passed, res.detail + res.output


def _sleepers(tag: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read() == b"sleep\0" + tag.encode() + b"\0":
                        found.append(int(name))
            except OSError:
                pass
    return found


GRANDCHILD = (
    BYPASS
    + """
r, w = posix.pipe()
pid = posix.fork()
if pid == 0:
    posix.setsid()
    er, ew = posix.pipe()  # close-on-exec: EOF on er once the grandchild is sleep
    grandchild = posix.fork()
    if grandchild == 0:
        posix.close(er)
        posix.execv("/bin/sleep", ["sleep", "TAG"])
    posix.close(ew)
    while posix.read(er, 1):
        pass
    posix.write(w, str(grandchild).encode())
    posix._exit(0)
posix.waitpid(pid, 0)
print("grandchild", posix.read(r, 64).decode(), flush=True)
"""
)
SPAWNING = ("uid", "seccomp", "nproc", "audit")  # what would stop the program from forking


def _run_grandchild(tail: str, timeout: float, disable: tuple[str, ...]):
    tag = f"45.{secrets.randbelow(10**8)}"
    try:
        program = GRANDCHILD.replace("TAG", tag) + tail
        res = host._execute(program, timeout=timeout, disable=disable)
        # the grandchild really was started, and was already `sleep TAG` before the program
        # printed its pid (a scan of /proc before its exec would find nothing on a busy machine)
        started = re.search(r"grandchild (\d+)", res.output)
        assert started, res.detail + res.output
        return res, _sleepers(tag)
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif("subreaper" not in BASELINE.guards, reason="no PR_SET_CHILD_SUBREAPER")
@pytest.mark.parametrize("ending", ["program-ends", "timeout"])
def test_setsid_grandchildren_are_killed(ending):
    """Hole 3: a grandchild that called setsid outlived the program (`sleep 45` re-parented to
    PID 1). The launcher, as subreaper, kills it when the program ends and at the timeout."""
    tail = "" if ending == "program-ends" else "import time\ntime.sleep(120)\n"
    res, alive = _run_grandchild(tail, 60.0 if ending == "program-ends" else 20.0, SPAWNING)
    assert res.status == ("passed" if ending == "program-ends" else "timeout"), res.detail
    assert alive == []


@pytest.mark.skipif("subreaper" not in BASELINE.guards, reason="no PR_SET_CHILD_SUBREAPER")
def test_setsid_grandchildren_escape_without_the_subreaper():
    """The control for the test above (and the fallback where there is no subreaper): killing
    the process group does not reach a setsid'd grandchild."""
    res, alive = _run_grandchild("", 60.0, SPAWNING + ("subreaper",))
    assert res.passed and len(alive) == 1, res.detail


FORGE_SCAN = r"""
import gc, os, re, sys
HEX = rb"([0-9a-f]{16}|[0-9a-f]{32})(?![0-9a-f])"
found, seen = [], set()
def take(value, hint=""):
    if isinstance(value, str):
        value = value.encode("utf-8", "replace")
    if isinstance(value, (bytes, bytearray)):
        for m in re.finditer(rb"(passed |nonce\W+|token\W+)?" + HEX, bytes(value), re.I):
            if m.group(2) not in seen:
                seen.add(m.group(2))
                likely = bool(m.group(1)) or "nonce" in hint.lower() or "token" in hint.lower()
                found.append((likely, m.group(2)))
def walk(frame):
    while frame is not None:
        for space in (frame.f_locals, frame.f_globals):
            for k, v in list(space.items()):
                take(v, str(k))
                if isinstance(v, dict):
                    for k2, v2 in list(v.items()):
                        take(v2, str(k2))
        frame = frame.f_back
def mem():
    with open("/proc/self/maps") as f:
        maps = [line.split() for line in f]
    with open("/proc/self/mem", "rb", 0) as m:
        for fields in maps:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if "r" in fields[1] and hi - lo < 2**28:
                try:
                    m.seek(lo)
                    take(m.read(hi - lo))
                except OSError:
                    pass
routes = []
for name, fn in [
    ("argv", lambda: [take(a) for a in sys.argv]),
    ("environ", lambda: [take(v, k) for k, v in os.environ.items()]),
    ("modules", lambda: [take(v, k) for m in list(sys.modules.values())
                         for k, v in list(getattr(m, "__dict__", {}).items())]),
    ("own-frames", lambda: walk(sys._getframe())),
    ("other-threads", lambda: [walk(f) for f in sys._current_frames().values()]),
    ("gc", lambda: [take(v, str(k)) for o in gc.get_objects() if isinstance(o, dict)
                    for k, v in list(o.items())]),
    ("memory", mem),
]:
    try:
        fn()
        routes.append(name + ":ok")
    except Exception as e:
        routes.append(name + ":" + type(e).__name__)
found.sort(key=lambda t: t[0])  # the likeliest last: the old runner took the last line
print(routes, len(found), flush=True)
for fd in range(3, 64):
    for _, token in found:
        try:
            os.write(fd, b"\npassed " + token + b"\n")
        except OSError:
            break
os._exit(0)
"""


@pytest.mark.parametrize(
    "attack, landlock",
    [
        pytest.param(
            'import os, __main__\n__main__.report("passed " + __main__.NONCE)\nos._exit(0)\n',
            True,
            id="main-report-nonce",
        ),
        pytest.param(
            "import json, os, sys\ncfg = json.loads(sys.argv[1])\n"
            'os.write(cfg["result_fd"], ("passed %s\\n" % cfg["nonce"]).encode())\nos._exit(0)\n',
            True,
            id="argv-nonce",
        ),
        pytest.param(FORGE_SCAN, True, id="scan-everything"),
        pytest.param(FORGE_SCAN, False, id="scan-everything-audit-hook-only"),
        pytest.param(
            "import sys, time\n"
            "sys._getframe(1).f_locals['done'].release()  # wake the main thread early\n"
            "time.sleep(2)\n",
            True,
            id="wake-the-main-thread",
        ),
    ],
)
def test_verdict_cannot_be_forged(attack, landlock):
    """Hole 4: `__main__.report("passed " + __main__.NONCE); os._exit(0)` before a failing
    assert was scored as a pass (the nonce was in `sys.argv[1]` too). The scan looks for any
    token in argv, the environment, modules, frames, other threads, gc and /proc/self/mem and
    writes it to every descriptor."""
    res = run_program(WRONG + attack + TESTS, landlock=landlock, timeout=60)
    assert not res.passed and res.status == "failed", res.output
    if attack is FORGE_SCAN:
        assert "argv:ok" in res.output  # the scan did run
        for route in ("other-threads", "gc", "memory"):
            assert f"{route}:ok" not in res.output, res.output


def test_audit_hook_denies():
    """The audit hook alone (no uid change, Landlock, seccomp, RLIMIT_NPROC or Python guard)."""
    program = (
        BYPASS
        + """
import gc, os
def reimport(name):
    sys.modules.pop(name, None)
    return __import__(name)
def refused(fn):
    try:
        fn()
    except (PermissionError, ImportError):
        return True
    return False
os.symlink("/proc/%d" % os.getppid(), "parent")
resource_module = sys.modules["resource"]
# the hook uses only what it bound before the program ran
os.readlink = posix.readlink = lambda *a, **k: "/tmp"
os.lstat = posix.lstat = lambda *a, **k: os.stat("/tmp")
import builtins
builtins.isinstance = lambda *a: False
checks = {
    "fork": lambda: posix.fork() == 0 and posix._exit(0),
    "system": lambda: posix.system("true"),
    "exec": lambda: posix.execv("/bin/true", ["true"]),
    "kill": lambda: posix.kill(posix.getpid(), 0),
    "current_frames": sys._current_frames,
    "gc.get_objects": gc.get_objects,
    "gc.get_referrers": lambda: gc.get_referrers(sys),
    "gc.get_referents": lambda: gc.get_referents(sys),
    "setrlimit": lambda: resource_module.setrlimit(resource_module.RLIMIT_CPU, (10**6, 10**6)),
    "settrace": lambda: sys.settrace(None),
    "setprofile": lambda: sys.setprofile(None),
    "ctypes": lambda: __import__("ctypes"),
    "_posixsubprocess": lambda: reimport("_posixsubprocess"),
    "resource": lambda: reimport("resource"),
    "/proc/self/mem": lambda: open("/proc/self/mem", "rb"),
    "/proc/<ppid>/environ": lambda: open("/proc/%d/environ" % os.getppid(), "rb"),
    "via a symlink": lambda: open("parent/environ", "rb"),
    "/dev/fd/../mem": lambda: os.open("/dev/fd/../mem", os.O_RDONLY),
}
allowed = [name for name, fn in checks.items() if not refused(fn)]
assert not allowed, allowed
"""
    )
    disable = ("uid", "landlock", "seccomp", "nproc", "guard")
    res = host._execute(program, disable=disable, landlock=False)
    assert res.passed, res.detail + res.output
    assert "audit-hook" in res.guards and "seccomp" not in res.guards


@needs_linux
@pytest.mark.parametrize(
    "disable, landlock",
    [
        _param("all-guards", ()),
        _param("separate-uid-only", ("landlock", "audit", "guard"), needs_root, landlock=False),
        _param(
            "landlock-only",
            ("uid", "audit", "guard"),
            pytest.mark.skipif(LANDLOCK < 6, reason="Landlock signal scoping needs ABI 6"),
        ),
    ],
)
def test_signals_to_the_parent_are_refused(disable, landlock):
    program = (
        BYPASS
        + f"""
for pid in (posix.getppid(), {os.getpid()}):
    try:
        posix.kill(pid, 0)
    except PermissionError:
        continue
    raise AssertionError("may signal %d" % pid)
"""
    )
    res = host._execute(program, disable=disable, landlock=landlock)
    assert res.passed, res.detail + res.output


@pytest.mark.skipif(LANDLOCK < 4, reason="Landlock TCP rules need ABI 4")
def test_tcp_is_refused():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        program = f"""
import socket
for act in (lambda s: s.connect(("127.0.0.1", {port})), lambda s: s.bind(("127.0.0.1", 0))):
    with socket.socket() as s:
        try:
            act(s)
        except PermissionError:
            continue
        raise AssertionError("TCP allowed")
"""
        res = host._execute(program, disable=("uid", "audit", "guard"))
        assert res.passed, res.detail + res.output
        with pytest.raises(BlockingIOError):
            server.accept()


@pytest.mark.skipif(not SECCOMP, reason="no seccomp filter on this platform")
@pytest.mark.parametrize("seccomp", [True, False], ids=["seccomp", "control-without-seccomp"])
def test_seccomp_refuses_ptrace_and_reading_process_memory(seccomp):
    """With the audit hook off, ctypes can call ptrace and process_vm_readv (another way to
    read the verdict token from memory); the seccomp filter refuses them, and
    open_by_handle_at where the program kept CAP_DAC_READ_SEARCH."""
    program = f"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def refused(result):
    return result == -1 and ctypes.get_errno() == errno.EPERM
secret = ctypes.create_string_buffer(b"s3cret")
copy = ctypes.create_string_buffer(6)
class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local, remote = IOVec(ctypes.addressof(copy), 6), IOVec(ctypes.addressof(secret), 6)
results = {{
    "process_vm_readv": refused(
        libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    ),
    "ptrace": refused(libc.ptrace(0, 0, None, None)),  # PTRACE_TRACEME
}}
if {"cap-dac-read-search" in BASELINE.guards}:
    results["open_by_handle_at"] = refused(libc.open_by_handle_at(-1, None, 0))
print(results)
assert all(results.values()) if {seccomp} else not any(results.values()), results
"""
    disable = ("audit", "guard") + (() if seccomp else ("seccomp",))
    res = host._execute(program, disable=disable)
    assert res.passed, res.detail + res.output


def test_limits_are_set():
    program = """
import resource
expect = {"AS": 300 * 2**20, "CPU": 9 + 2, "FSIZE": 3 * 2**20, "NOFILE": 256, "CORE": 0}
for name, value in expect.items():
    limits = resource.getrlimit(getattr(resource, "RLIMIT_" + name))
    assert limits == (value, value), (name, limits)
"""
    res = host._execute(
        program, disable=("audit", "guard"), memory_mb=300, max_file_mb=3, timeout=9.5
    )
    assert res.passed, res.detail + res.output
    assert "rlimits" in res.guards


def test_file_size_bomb_is_stopped():
    res = run_program('open("big", "wb").write(b"x" * (8 * 2**20))\n', max_file_mb=1)
    assert not res.passed
    assert "File too large" in res.detail or "SIGXFSZ" in res.detail, res.detail
    program = """
import os
try:
    open("big", "wb").write(b"x" * (8 * 2**20))
except OSError:
    pass
assert os.path.getsize("big") <= 2**20
"""
    assert run_program(program, max_file_mb=1).passed


@needs_linux
@pytest.mark.parametrize(
    "disable, landlock",
    [
        _param(
            "all-guards",
            (),
            pytest.mark.skipif(not (ROOT or LANDLOCK), reason="needs root or Landlock"),
        ),
        _param("landlock-only", ("uid", "audit", "guard"), needs_landlock),
        _param("separate-uid-only", ("landlock", "audit", "guard"), needs_root, landlock=False),
    ],
)
def test_writes_outside_are_refused_by_the_kernel(tmp_path, disable, landlock):
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("keep me")
    program = (
        BYPASS
        + f"""
path = {str(sentinel)!r}
for act in (
    lambda: posix.open(path, posix.O_WRONLY | posix.O_TRUNC),
    lambda: posix.unlink(path),
    lambda: posix.rename(path, path + ".moved"),
    lambda: posix.open(path + ".new", posix.O_WRONLY | posix.O_CREAT),
):
    try:
        act()
    except PermissionError:
        continue
    raise AssertionError("write allowed")
"""
    )
    res = host._execute(program, disable=disable, landlock=landlock)
    assert res.passed, res.detail + res.output
    assert sentinel.read_text() == "keep me" and sorted(os.listdir(tmp_path)) == ["sentinel.txt"]


def test_guards_are_reported():
    g = set(BASELINE.guards)
    assert {"rlimits", "audit-hook", "python-guard"} <= g
    assert BASELINE.landlock_abi == LANDLOCK
    json.dumps(BASELINE.to_dict())
    if LINUX:
        assert "subreaper" in g and ("seccomp" in g or "rlimit-nproc" in g)
    if LANDLOCK:
        assert {"landlock-write", "landlock-proc"} <= g
        assert ("landlock-tcp" in g) == (LANDLOCK >= 4)
        assert ("landlock-scope" in g) == (LANDLOCK >= 6)
    assert ("separate-uid" in g) == ROOT
    if ROOT:
        assert BASELINE.uid == 65534
    bare = host._execute("pass", disable=host._LAYERS, landlock=False)
    assert bare.passed and set(bare.guards) == {"rlimits"}
    nproc = host._execute("pass", disable=("seccomp",))
    assert ("rlimit-nproc" in nproc.guards) == (LINUX and nproc.uid != 0)
    with pytest.raises(ValueError):
        host._execute("pass", disable=("no-such-guard",))


def _python_for_nobody() -> str | None:
    for python in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            ok = subprocess.run(
                [python, "-I", "-c", "import sys; assert sys.version_info >= (3, 10)"],
                user=65534,
                group=65534,
                extra_groups=[],
                cwd="/",
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if ok.returncode == 0:
            return python
    return None


@needs_root
@needs_landlock
def test_non_root_evaluator():
    """The fallback when the evaluator is not root: no uid change, so the program runs under
    the evaluator's own uid; Landlock still hides the evaluator's environment (set at its
    start, as a real token would be), and processes still cannot be started."""
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python >= 3.10 that uid 65534 can run")
    # the texts of the sandbox package (the host modules and the programs they run) go in on
    # stdin, not as paths: uid 65534 may not be able to read the checkout (a clone in a 0700
    # folder); the evaluator writes them to a folder of its own, as swax.eval.sandbox below
    # empty swax and swax.eval packages, and imports the host module from there
    package = Path(host.__file__).resolve().parent
    files = {p.name: p.read_text() for p in package.glob("*.py")}
    evaluator = f"""
import importlib, json, os, shutil, sys, tempfile
given = json.load(sys.stdin)
folder = tempfile.mkdtemp()
sandbox = os.path.join(folder, "swax", "eval", "sandbox")
os.makedirs(sandbox)
for init in (("swax",), ("swax", "eval")):
    open(os.path.join(folder, *init, "__init__.py"), "w").close()
for name, text in given["files"].items():
    with open(os.path.join(sandbox, name), "w", encoding="utf-8") as f:
        f.write(text)
sys.path.insert(0, folder)
ce = importlib.import_module("swax.eval.sandbox.host")
assert ce.__file__ == os.path.join(sandbox, "host.py"), ce.__file__
scan = given["scan"].replace("EVALUATOR_PID", str(os.getpid()))
for program in (scan, {SPAWN!r}):
    print(json.dumps(ce.run_program(program, timeout=60).to_dict()), flush=True)
shutil.rmtree(folder)
"""
    scan = _environ_scan(0).replace("EVALUATOR = 0", "EVALUATOR = EVALUATOR_PID")
    env = {"PATH": "/usr/bin:/bin", "SWAX_TEST_TOKEN": "s3cret"}
    proc = subprocess.run(
        [python, "-I", "-c", evaluator],
        input=json.dumps({"files": files, "scan": scan}),
        text=True,
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    for res in results:
        assert res["passed"], res
        assert res["uid"] == 65534 and "separate-uid" not in res["guards"]
        assert "landlock-proc" in res["guards"]

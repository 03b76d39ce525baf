"""The sandbox's runner (see docs/sandbox.md), a program of its own.

Exec'd by the launcher as ``python -I -B -c TEXT CFG_FD SETUP_FD RESULT_FD SECCOMP``: it reads
its configuration (and the verdict tokens) from the pipe CFG_FD, starts the program's thread,
installs the Python guard and the audit hook, runs the program in that thread and writes the
verdict from the main thread. It runs in a bare interpreter: it imports only the standard
library, nothing from swax.

The program can reach this module's globals (its thread's first frame is ``target``'s in
:func:`main`), so what must hold once it runs lives in closures and in the main thread's frame,
bound before it starts: the module's globals are only read while the guards are installed.
"""

import json
import os
import sys

# The os/posix functions that the Python guard checks: those changing the path itself (a final
# symlink is not followed), those following it, those moving or linking (the source's final
# symlink not followed), and those that it disables.
CHANGING_THE_PATH = (
    "remove",
    "unlink",
    "rmdir",
    "removedirs",
    "lchown",
    "lchmod",
    "lchflags",
    "mkfifo",
    "mknod",
    "removexattr",
    "setxattr",
)
CHANGING_THE_TARGET = ("mkdir", "makedirs", "chmod", "chown", "chflags", "utime", "truncate")
MOVING = ("rename", "replace", "renames")
DISABLED = (
    "system",
    "popen",
    "fork",
    "forkpty",
    "kill",
    "killpg",
    "execv",
    "execve",
    "execl",
    "execle",
    "execlp",
    "execlpe",
    "execvp",
    "execvpe",
    "spawnl",
    "spawnle",
    "spawnlp",
    "spawnlpe",
    "spawnv",
    "spawnve",
    "spawnvp",
    "spawnvpe",
    "posix_spawn",
    "posix_spawnp",
    "setuid",
    "setgid",
    "chroot",
)
UNIMPORTABLE = ("ctypes", "_ctypes", "ipdb", "psutil", "resource")

# The audit events that the audit hook denies, and the modules it does not let be imported.
DENIED_EVENTS = frozenset(
    (
        "os.fork",
        "os.forkpty",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.startfile",
        "subprocess.Popen",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "sys._current_frames",
        "sys._current_exceptions",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys.settrace",
        "sys.setprofile",
        "sys._settraceallthreads",
        "sys._setprofileallthreads",
        "sys.monitoring.register_callback",
        "sys.remote_exec",
        "resource.setrlimit",
        "resource.prlimit",
    )
)
DENIED_IMPORTS = frozenset(
    (
        "ctypes",
        "_ctypes",
        "_posixsubprocess",
        "resource",
        "_testcapi",
        "_testinternalcapi",
        "_testmultiphase",
        "_testsinglephase",
        "_testbuffer",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "_interpreters",
        "_interpchannels",
        "_interpqueues",
    )
)


def path_check(root):
    # check(what, path, dir_fd=None, follow=True): a PermissionError unless path resolves
    # (symlinks and dir_fd followed) beneath root, or is /dev/null.
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
            # %d: the integer value, whatever the type's own __format__
            p = P.join(readlink("/proc/self/fd/%d" % dir_fd), p)  # noqa: UP031
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
        raise PermissionError(f"sandbox: {what} {path!r} is outside the temporary folder")

    def check(what, path, dir_fd=None, follow=True):
        if not inside(path, dir_fd, follow):
            deny(what, path)

    return check


def guard_open(check, builtins, io, _io):
    # open, io.open and io.FileIO refuse writing modes outside the temporary folder.
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


def guard_paths(check, patch):
    # os.open with writing flags and the path-changing os/posix functions refuse paths outside
    # the temporary folder.
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

    for name in CHANGING_THE_PATH:
        patch(name, make_one("changing", False))
    for name in CHANGING_THE_TARGET:
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

    for name in MOVING:
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


def block_processes(patch, subprocess, _posixsubprocess):
    # Starting processes, signals, setuid/setgid and chroot raise; ctypes and the like cannot
    # be imported.
    def blocked(what):
        def g(*args, **kwargs):
            raise PermissionError(f"sandbox: {what} is disabled")

        return g

    for name in DISABLED:
        patch(name, lambda f, name=name: blocked("os." + name))
    subprocess.Popen = blocked("subprocess.Popen")
    if _posixsubprocess is not None:
        _posixsubprocess.fork_exec = blocked("_posixsubprocess.fork_exec")
    for mod in UNIMPORTABLE:
        sys.modules[mod] = None


def install_guard(root):
    import builtins
    import io
    import shutil
    import subprocess

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
    check = path_check(root)
    guard_open(check, builtins, io, _io)
    mods = [m for m in (os, posix) if m is not None]

    def patch(name, make):
        for m in mods:
            f = getattr(m, name, None)
            if f is not None:
                setattr(m, name, make(f))

    guard_paths(check, patch)
    orig_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        check("removing", path, kwargs.get("dir_fd"), False)
        return orig_rmtree(path, *args, **kwargs)

    shutil.rmtree = rmtree
    block_processes(patch, subprocess, _posixsubprocess)


def exact_text():
    # exact(x): x as a plain str or bytes (a copy for a subclass of them), else None; with
    # functions bound here, so that the program cannot change what it does.
    _str, _bytes, _type, _isinstance = str, bytes, type, isinstance
    join_s, join_b = "".join, b"".join

    def exact(x):
        t = _type(x)
        if t is _str or t is _bytes:
            return x
        if _isinstance(x, _str):
            return join_s((x,))
        if _isinstance(x, _bytes):
            return join_b((x,))
        return None

    return exact


def proc_check(proc_mounts, exact):
    # under_proc(path): whether path (symlinks followed, relative to the current folder)
    # resolves to a file under a procfs mount; with functions bound here, so that the program
    # cannot change what it does.
    import posix

    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath
    _bytes, _int, _type, _isinstance = bytes, int, type, isinstance
    _OSError, _BaseException = OSError, BaseException
    mounts = tuple(proc_mounts)

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

    return under_proc


def install_audit_hook(root, proc_mounts):
    # An audit hook (it cannot be removed from Python): process creation, signals, the views
    # of other threads' frames and of all objects, tracing, ctypes, re-importing the modules that
    # give those back, and opening anything under /proc raise. It uses only functions bound
    # here, so that the program cannot change what it does.
    _str, _type = str, type
    _PermissionError, _ImportError = PermissionError, ImportError
    deny, deny_imports = DENIED_EVENTS, DENIED_IMPORTS
    exact = exact_text()
    under_proc = proc_check(proc_mounts, exact)

    def hook(event, args):
        if event in deny or event.startswith("ctypes."):
            raise _PermissionError(f"sandbox: {event} is disabled")
        if event == "import":
            name = exact(args[0]) if args else None
            if _type(name) is _str and name.partition(".")[0] in deny_imports:
                raise _ImportError(f"sandbox: importing {name} is disabled")
        elif event == "open" and args and under_proc(args[0]):
            raise _PermissionError(f"sandbox: reading {args[0]!r} (under /proc) is disabled")

    sys.addaudithook(hook)


def read_config():
    # The configuration (from the pipe CFG_FD), SETUP_FD, RESULT_FD and whether seccomp applied.
    fd, setup_fd, result_fd = (int(a) for a in sys.argv[1:4])
    data = b""
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        data += b
    os.close(fd)
    return json.loads(data), setup_fd, result_fd, sys.argv[4] == "1"


def compile_program(path, fail_early):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    try:
        return compile(source, "program.py", "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError) as e:
        msg, line = getattr(e, "msg", e), getattr(e, "lineno", None)
        fail_early(f"{type(e).__name__}: {msg} (line {line})")


def candidate_module():
    # The program's module (its __main__ once it runs) and its namespace.
    import types

    module = types.ModuleType("__candidate__")
    ns = module.__dict__
    ns["__builtins__"] = __builtins__
    return module, ns


def exception_text(e):
    msg = str(e).strip().splitlines()
    text = f"{type(e).__name__}{(': ' + msg[0]) if msg else ''}"
    return text.encode("utf-8", "replace")


def set_stack_size(_thread):
    # The program's thread gets the main thread's stack size (RLIMIT_STACK), within 8-256 MiB.
    import resource

    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    size = soft if 0 < soft < 2**40 else 64 * 2**20
    try:
        _thread.stack_size(min(max(size, 8 * 2**20), 256 * 2**20))
    except (ValueError, RuntimeError):
        pass


def apply_guards(cfg, root, seccomp, setup):
    # After the program's thread started: RLIMIT_NPROC = 0 where seccomp is missing, the Python
    # guard, the audit hook; what applied goes into setup.
    import resource

    disable = set(cfg["disable"])
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


def hand_over(setup, setup_fd, module):
    # Report the guards that applied; the program becomes __main__.
    os.write(setup_fd, json.dumps(setup).encode())
    os.close(setup_fd)
    sys.argv = ["program.py"]
    sys.modules["__main__"] = sys.modules["__candidate__"] = module


def main():
    import _thread
    import json
    import os
    import sys
    import threading  # noqa: F401 -- imported here, in the main thread, so it knows which that is

    _write, _exit, _type, _bytes = os.write, os._exit, type, bytes
    cfg, setup_fd, result_fd, seccomp = read_config()
    # The pass line exists only here, in this frame of the main thread, which the program
    # (run in another thread) has no reference to.
    passed_line = f"\npassed {cfg.pop('pass_token')}\n".encode()
    fail_prefix = f"\nfailed {cfg.pop('fail_token')} ".encode()
    setup = {}

    def fail_early(detail):
        _write(setup_fd, json.dumps(setup).encode())
        _write(result_fd, fail_prefix + detail.encode("utf-8", "replace")[:4000] + b"\n")
        _exit(1)

    code = compile_program(cfg["program"], fail_early)
    root = os.path.realpath(cfg["tmp"])
    module, ns = candidate_module()
    go, done = _thread.allocate_lock(), _thread.allocate_lock()
    go.acquire()
    done.acquire()
    status, detail = 0, b""

    describe = exception_text  # bound here: the program can reach this module's globals

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

    set_stack_size(_thread)
    try:
        _thread.start_new_thread(target, ())
    except RuntimeError as e:
        fail_early(f"sandbox: cannot start the program's thread ({e})")
    apply_guards(cfg, root, seccomp, setup)
    hand_over(setup, setup_fd, module)
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


if __name__ == "__main__":
    main()

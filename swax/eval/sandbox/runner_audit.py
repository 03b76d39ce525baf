"""The runner's audit hook (see docs/sandbox.md): a part of the runner's program.

The host joins ``runner_guard.py``, ``runner_audit.py`` and ``runner.py``, in this order, into
the one program text that the runner's interpreter runs (``python -I -B -c TEXT``, see
``runner.py``); this part defines :func:`install_audit_hook`, which ``runner.py`` calls. It
imports only the standard library, nothing from swax.

Once installed, the hook denies process creation, signals, the views of other threads' frames
and of all objects, tracing, ctypes, importing the modules that give those back, and opening
anything under /proc.
"""

import sys

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

"""The sandbox's runner (see docs/sandbox.md), a program of its own.

Exec'd by the launcher as ``python -I -B -c TEXT CFG_FD SETUP_FD RESULT_FD SECCOMP``: it reads
its configuration (and the verdict tokens) from the pipe CFG_FD, starts the program's thread,
installs the Python guard and the audit hook, runs the program in that thread and writes the
verdict from the main thread. It runs in a bare interpreter: it imports only the standard
library, nothing from swax.

The program can reach this module's globals (its thread's first frame is ``target``'s in
:func:`main`), so what must hold once it runs lives in closures and in the main thread's frame,
bound before it starts: the module's globals are only read while the guards are installed.

``TEXT`` is this file's text after those of ``runner_guard.py`` (the Python guard,
:func:`install_guard`) and ``runner_audit.py`` (the audit hook, :func:`install_audit_hook`):
the host joins the three into one program, so their functions are this module's globals.
"""

import json
import os
import sys


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
        install_guard(root)  # noqa: F821 -- defined by runner_guard.py, joined before this text
        setup["python_guard"] = True
    if "audit" not in disable:
        install_audit_hook(root, cfg["proc_mounts"])  # noqa: F821 -- by runner_audit.py
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

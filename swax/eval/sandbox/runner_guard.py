"""The runner's Python guard (see docs/sandbox.md): a part of the runner's program.

The host joins ``runner_guard.py``, ``runner_audit.py`` and ``runner.py``, in this order, into
the one program text that the runner's interpreter runs (``python -I -B -c TEXT``, see
``runner.py``); this part defines :func:`install_guard`, which ``runner.py`` calls. It imports
only the standard library, nothing from swax.

Once installed, writing outside the temporary folder (``open``, ``io.FileIO``, ``os.open``,
the path-changing os/posix functions, ``shutil.rmtree``) raises, and so do starting processes,
signals, setuid/setgid and chroot; ctypes and the like cannot be imported.
"""

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

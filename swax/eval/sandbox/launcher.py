"""The sandbox's launcher (see docs/sandbox.md), a program of its own.

Started by the evaluating process (``swax.eval.sandbox.host``) as ``python -I -S -B -c TEXT
CONFIG``, with the minimal environment, in a new session: it becomes the subreaper of
everything below it, forks, applies the kernel guards in the child (rlimits, Landlock, uid,
no_new_privs, seccomp) and execs the runner there, kills the runner at the timeout, then every
process left below it, and writes its report (JSON) to the report descriptor. It runs in a bare
interpreter: it imports only the standard library, nothing from swax.
"""

import json
import os
import resource
import signal
import sys
import time

LINUX = sys.platform.startswith("linux")
WALL = 0x40000000 if LINUX else 0  # __WALL
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
    return OSError(e, f"{what}: {os.strerror(e)}")


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


def landlock_ruleset(cfg):
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


def child(cfg, w, sigchld_blocked):
    # In the forked child: close every other descriptor, apply the kernel guards, exec.
    disable = set(cfg["disable"])
    if sigchld_blocked:
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
    if libc is not None and cfg["landlock"] and "landlock" not in disable:
        ruleset, ll = landlock_ruleset(cfg)  # as root: every directory can be listed
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
        if "seccomp" not in disable and info["no_new_privs"]:
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


def wait_runner(pid, deadline, sigchld_blocked):
    # Reap children until the runner (pid) has exited, or until the deadline (then None). With
    # __WALL, so that threads of the runner that made themselves our tracees (PTRACE_TRACEME,
    # where seccomp is missing) are reaped too: until they are, the runner cannot be. Woken by
    # SIGCHLD (blocked, taken with sigtimedwait) where that exists, else polling.
    wait = getattr(signal, "sigtimedwait", None) if sigchld_blocked else None
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
        with open(f"/proc/{me}/task/{me}/children") as f:
            kids.update(int(x) for x in f.read().split())
        return kids
    except OSError:
        pass
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
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


def block_sigchld():
    # Block SIGCHLD (taken with sigtimedwait in wait_runner) where that exists.
    if hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigtimedwait"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        return True
    return False


def start_runner(cfg, sigchld_blocked):
    # Fork; the child applies the guards and execs the runner (child). Returns the child's pid
    # and the guards it reported before the exec (or the error that stopped it).
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            child(cfg, w, sigchld_blocked)
        except BaseException as e:
            try:
                os.write(w, (json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n").encode())
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
    guards = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            guards.update(json.loads(line))
        except ValueError:
            pass
    return pid, guards


def main():
    cfg = json.loads(sys.argv[1])
    report = {"rc": None, "timeout": False, "reaped": 0, "subreaper": False, "guards": {}}
    if libc is not None and "subreaper" not in cfg["disable"]:
        report["subreaper"] = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    sigchld_blocked = block_sigchld()
    start = time.monotonic()
    pid, report["guards"] = start_runner(cfg, sigchld_blocked)
    status = wait_runner(pid, start + cfg["timeout"], sigchld_blocked)
    if status is None:
        report["timeout"] = True
        os.kill(pid, signal.SIGKILL)
        status = wait_runner(pid, time.monotonic() + 60, sigchld_blocked)
    if status is not None:
        report["rc"] = os.waitstatus_to_exitcode(status)
    if report["subreaper"]:
        report["reaped"] = reap_all()
    os.write(cfg["report_fd"], (json.dumps(report) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()

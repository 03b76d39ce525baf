"""Forked worker processes that map a function over jobs and return results in job order.

Used by ``swax data prepare`` instead of :class:`multiprocessing.Pool`. A pool's queues share
locks between the parent's handler threads and the workers: ``Pool.terminate()`` waits on the
result queue's write lock, which a worker holds while it writes a large result that nobody
reads any more (the result thread stops first), so a Ctrl-C could hang the parent forever
under load. Here each worker has its own pipe and at most one job in flight, and nothing is
shared: the parent sends job ``k`` to worker ``k % n`` only after it has read that worker's
previous result (so a worker is always reading when the parent writes), and stopping is a
SIGKILL to each worker followed by a wait, which cannot block on anything a worker holds.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator

__all__ = ["OrderedWorkers"]

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _serve(conn, init: Callable | None, init_args: tuple, fn: Callable) -> None:
    # The terminal's Ctrl-C reaches the whole process group: the parent decides when to stop.
    # SIGTERM gets its default action back (the parent's handler was inherited through fork).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    try:
        if init is not None:
            init(*init_args)
        while True:
            job = conn.recv()
            try:
                conn.send((True, fn(job)))
            except Exception:
                conn.send((False, traceback.format_exc()))
    except (EOFError, OSError):
        pass  # the parent closed its end or is gone: nothing left to do


class WorkerError(RuntimeError):
    """A job raised in a worker; the message holds the worker's traceback."""


class OrderedWorkers:
    """``n`` forked processes applying ``fn`` to jobs; :meth:`map` yields results in order.

    Signals SIGINT and SIGTERM are blocked while the workers are forked, so none of them can
    run the parent's handler before it has set its own. Use as a context manager (or call
    :meth:`close`): leaving kills and reaps every worker, whatever state they are in.
    """

    def __init__(self, n: int, fn: Callable, init: Callable | None = None, init_args=()):
        if n < 1:
            raise ValueError(f"need at least one worker, got {n}")
        ctx = mp.get_context("fork")
        self._procs: list = []
        self._conns: list = []
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            for _ in range(n):
                parent, child = ctx.Pipe(duplex=True)
                p = ctx.Process(target=_serve, args=(child, init, tuple(init_args), fn))
                p.daemon = True
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    @staticmethod
    def available() -> bool:
        """Whether this platform can fork (Linux and macOS can; Windows cannot)."""
        return "fork" in mp.get_all_start_methods()

    def _receive(self, w: int):
        try:
            ok, value = self._conns[w].recv()
        except (EOFError, OSError):
            self._procs[w].join(timeout=30)  # its pipe closed: it has exited or is exiting
            code = self._procs[w].exitcode
            raise WorkerError(f"worker process {self._procs[w].pid} died (exit {code})") from None
        if not ok:
            raise WorkerError(value)
        return value

    def map(self, jobs: Iterable) -> Iterator:
        """``fn(job)`` for each job, in the jobs' order, with up to ``n`` jobs in flight."""
        n = len(self._conns)
        in_flight: deque[int] = deque()  # worker of each sent job, in job order
        for k, job in enumerate(jobs):
            w = k % n
            if len(in_flight) == n:  # worker w holds the oldest job in flight
                in_flight.popleft()
                yield self._receive(w)
            self._conns[w].send(job)
            in_flight.append(w)
        while in_flight:
            yield self._receive(in_flight.popleft())

    def close(self) -> None:
        """Kill and reap every worker (they hold nothing the parent waits on)."""
        for p in self._procs:
            if p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self._procs:
            p.join()
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> OrderedWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

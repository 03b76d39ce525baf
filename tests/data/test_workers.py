"""swax.data.workers.OrderedWorkers: results in job order, worker errors and deaths reported,
and closing with large results unread never blocks (what hung multiprocessing.Pool)."""

import os
import signal

import numpy as np
import pytest

from swax.data.workers import OrderedWorkers, WorkerError

pytestmark = pytest.mark.skipif(not OrderedWorkers.available(), reason="no fork here")

_STATE = {}


def _init(offset):
    _STATE["offset"] = offset


def _job(x):
    if x == "boom":
        raise ValueError("bad job")
    if x == "die":
        os._exit(3)
    return (os.getpid(), x + _STATE["offset"])


def _big(n):
    return np.full(n, n, dtype=np.int32)  # several MB: more than a pipe holds


def test_results_come_in_job_order_from_several_processes():
    with OrderedWorkers(3, _job, _init, (100,)) as w:
        out = list(w.map(range(20)))
    assert [v for _, v in out] == [100 + k for k in range(20)]
    assert len({pid for pid, _ in out}) == 3 and os.getpid() not in {pid for pid, _ in out}


def test_a_job_that_raises_names_the_error_and_a_dead_worker_is_an_error():
    with OrderedWorkers(2, _job, _init, (0,)) as w:
        with pytest.raises(WorkerError, match="ValueError: bad job"):
            list(w.map([1, "boom", 3]))
    with OrderedWorkers(2, _job, _init, (0,)) as w:
        with pytest.raises(WorkerError, match=r"died \(exit 3\)"):
            list(w.map([1, 2, "die", 4]))


def test_close_with_large_results_unread_returns_and_reaps_every_worker():
    w = OrderedWorkers(2, _big)
    it = w.map([2_000_000] * 8)
    assert len(next(it)) == 2_000_000  # the others are being written into full pipes
    pids = [p.pid for p in w._procs]
    w.close()
    for pid in pids:  # reaped: no such child any more
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_workers_ignore_ctrl_c_and_the_parent_keeps_its_handlers():
    before = signal.getsignal(signal.SIGINT)
    with OrderedWorkers(2, _job, _init, (0,)) as w:
        for p in w._procs:
            os.kill(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the whole group
        assert [v for _, v in w.map(range(4))] == [0, 1, 2, 3]
    assert signal.getsignal(signal.SIGINT) is before
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}

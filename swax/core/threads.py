"""CPU threads of torch: ``--threads`` on every command, else ``$SWAX_THREADS``, else ``auto``.

torch starts as many intra-op threads as the machine has cores; on a small or busy machine
(other processes on the same cores) they wait for each other, and one thread can be several
times faster (measured on 2 shared cores: ``swax generate`` 197 tokens/s against 5.1, training
5.9-6.3k tokens/s against 1.1-1.7k). :func:`swax.cli.main` applies the setting before any
command runs:

- ``auto`` (the default): the CPUs this process may run on (its affinity mask: a container's or
  taskset's share, not the whole machine's cores, which torch would take) minus the CPU time
  other processes are using on them right now (sampled from ``/proc/stat`` for a quarter of a
  second; the 1-minute load average where there is no ``/proc``), at least 1;
- ``0``: one thread per usable CPU, whatever the load;
- ``N``: N threads.

The commands that compute say what they chose in one line (:func:`threads_note`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from swax.core.errors import ConfigError

ENV = "SWAX_THREADS"
"""The environment variable holding the default thread count of every command."""
AUTO = "auto"
SAMPLE_SECONDS = 0.25
"""How long :func:`auto_threads` watches the CPUs before choosing."""
ACCEPTED = "'auto' or a whole number of threads >= 0 (0 = one per usable CPU)"


def parse_threads(value: Any, what: str = "--threads") -> int | str:
    """A thread setting from text or a number: ``"auto"`` or an integer >= 0 (0 = one per
    usable CPU). Anything else is a ConfigError naming ``what`` (the option or the variable)
    and the value."""
    text = str(value).strip()
    if text.lower() == AUTO:
        return AUTO
    try:
        n = int(text)
    except ValueError:
        n = -1
    if isinstance(value, bool) or n < 0:
        raise ConfigError(f"{what} must be {ACCEPTED}, got {text!r}")
    return n


def threads_setting(option: int | str | None = None) -> int | str:
    """The thread setting to use: ``option`` (--threads) when given, else $SWAX_THREADS, else
    ``"auto"``. An invalid $SWAX_THREADS is a ConfigError naming it."""
    if option is not None:
        return parse_threads(option)
    env = os.environ.get(ENV, "").strip()
    return parse_threads(env, ENV) if env else AUTO


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cpu_ids() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cpu_times(ids: set[int] | None, path: str = "/proc/stat") -> tuple[float, float] | None:
    """(busy, total) jiffies summed over the CPUs ``ids`` (all CPUs when None) from
    /proc/stat; None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    found = False
    for ln in lines:
        name, *fields = ln.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if ids is not None and int(name[3:]) not in ids:
            continue
        vals = [float(x) for x in fields[:8]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)  # idle + iowait
        total += sum(vals)
        busy += sum(vals) - idle
        found = True
    return (busy, total) if found else None


def other_load(seconds: float = SAMPLE_SECONDS) -> tuple[float, str] | None:
    """(CPUs' worth of work other processes are running on this process's CPUs, how it was
    measured), or None where the platform tells nothing. This process is idle while it looks,
    so what it sees is the others'."""
    ids = _cpu_ids()
    first = _cpu_times(ids)
    if first is not None:
        time.sleep(seconds)
        second = _cpu_times(ids)
        if second is not None and second[1] > first[1]:
            share = (second[0] - first[0]) / (second[1] - first[1])
            return max(0.0, share) * (len(ids) if ids else usable_cpus()), "measured now"
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    total = os.cpu_count() or 1
    return load * min(1.0, usable_cpus() / total), "1-min load average"


def auto_threads(share: int = 1) -> tuple[int, str]:
    """(threads, why) for ``auto``: the usable CPUs less the others' work on them, split among
    ``share`` processes of ours that start together (a parallel sweep), at least 1."""
    cpus = usable_cpus()
    seen = other_load()
    if seen is None:
        n = max(1, cpus // share)
        return n, f"auto: {cpus} usable CPU(s)" + (f" / {share} jobs" if share > 1 else "")
    load, how = seen
    free = max(1.0, cpus - load)
    n = max(1, min(cpus, int(free / share + 0.5)))
    why = f"auto: {cpus} usable CPU(s), {load:.1f} in use by others ({how})"
    return n, why + (f", shared by {share} jobs" if share > 1 else "")


_applied = 0
_note = ""
_setting: int | str | None = None


def last_setting() -> int | str | None:
    """The setting last given to :func:`set_threads` in this process (None: never called)."""
    return _setting


def applied_threads() -> int:
    """The count last chosen by :func:`set_threads` in this process (0: none yet), e.g. for the
    worker processes of a parallel sweep."""
    return _applied


def threads_note() -> str:
    """One line on the thread count in use and where it came from, for a command's header:
    ``threads 1 (auto: 2 usable CPU(s), 1.9 in use by others (measured now); --threads N to
    override)``."""
    import torch

    n = torch.get_num_threads()
    if _note and n == _applied:
        return f"threads {n} ({_note})"
    return f"threads {n}"


def set_threads(setting: int | str = AUTO, share: int = 1, why: str | None = None) -> int:
    """Apply a thread setting (:func:`parse_threads`) to torch: its intra-op threads, and the
    inter-op ones too where torch still allows it (only before its first inter-op parallel
    work). Returns the count chosen. ``why``: where a count N came from, for
    :func:`threads_note` (default "as asked")."""
    global _applied, _note, _setting
    _setting = setting
    if setting == AUTO:
        n, why = auto_threads(share)
        _note = f"{why}; --threads N or {ENV}=N to override"
    elif int(setting) > 0:
        n, _note = int(setting), why or "as asked"
    else:
        n, _note = usable_cpus(), "one per usable CPU"
    _applied = n
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # inter-op work already started in this process
        pass
    return n


class AutoThreads:
    """``auto`` kept up to date while a long job runs: :meth:`check` (called every few steps)
    looks, at most every ``every`` seconds, at how busy this process's CPUs were since the last
    look, takes away this process's own CPU time, and re-picks the count from what the others
    used, as :func:`auto_threads` does at the start. Returns a line when the count changes.
    Inactive unless this process's setting is ``auto``."""

    def __init__(self, every: float = 30.0, share: int = 1):
        self.every, self.share = every, share
        self.active = last_setting() == AUTO
        self._ids = _cpu_ids()
        self._mark()

    def _mark(self) -> None:
        self._wall, self._cpu = time.monotonic(), time.process_time()
        self._times = _cpu_times(self._ids) if self.active else None

    def check(self) -> str | None:
        if not self.active or self._times is None or time.monotonic() - self._wall < self.every:
            return None
        before, wall0, cpu0 = self._times, self._wall, self._cpu
        self._mark()
        if self._times is None or self._times[1] <= before[1]:
            return None
        cpus = len(self._ids) if self._ids else usable_cpus()
        busy = (self._times[0] - before[0]) / (self._times[1] - before[1]) * cpus
        ours = (self._cpu - cpu0) / max(self._wall - wall0, 1e-9)
        others = max(0.0, busy - ours)
        n = max(1, min(cpus, int(max(1.0, cpus - others) / self.share + 0.5)))
        import torch

        if n == torch.get_num_threads():
            return None
        global _applied, _note
        torch.set_num_threads(n)
        _applied = n
        _note = (
            f"auto: {cpus} usable CPU(s), {others:.1f} in use by others lately; "
            f"--threads N or {ENV}=N to override"
        )
        return f"now {threads_note()}"

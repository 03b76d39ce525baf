"""CPU threads of torch: ``--threads N`` on every command, else ``$SWAX_THREADS``.

torch starts as many intra-op threads as the machine has cores; on a small or busy machine
(other processes on the same cores) they wait for each other, and one thread can be several
times faster (measured on 2 shared cores: ``swax generate`` 197 tokens/s against 5.1, training
5.9-6.3k tokens/s against 1.1-1.7k). :func:`swax.cli.main` applies the setting before any
command runs; 0 (the default) means one thread per CPU this process may run on (its affinity
mask: a container's or taskset's share, not the whole machine's cores, which torch would take),
and a command that computes says in one line when the machine is busier than its CPUs.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import ConfigError

ENV = "SWAX_THREADS"
"""The environment variable holding the default thread count of every command."""


def parse_threads(value: Any, what: str = "--threads") -> int:
    """A thread count from text or a number: an integer >= 0 (0 = one per usable CPU). Anything
    else is a ConfigError naming ``what`` (the option or the variable) and the value."""
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        n = -1
    if isinstance(value, bool) or n < 0:
        raise ConfigError(
            f"{what} must be a whole number of threads >= 0 (0 = one per usable CPU), got {text!r}"
        )
    return n


def threads_setting(option: int | None = None) -> int:
    """The thread count to use: ``option`` (--threads) when given, else $SWAX_THREADS, else 0
    (one per usable CPU). An invalid $SWAX_THREADS is a ConfigError naming it."""
    if option is not None:
        return parse_threads(option)
    env = os.environ.get(ENV, "").strip()
    return parse_threads(env, ENV) if env else 0


_applied = 0


def applied_threads() -> int:
    """The count last asked of :func:`set_threads` in this process (0: none, the default),
    e.g. for the worker processes of a parallel sweep."""
    return _applied


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def busy_hint(cpus: int | None = None) -> str | None:
    """One line when the machine's 1-minute load exceeds the CPUs this process may use (threads
    then wait for each other, and fewer are often faster); None otherwise or where the platform
    has no load average."""
    cpus = cpus or usable_cpus()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    if load <= cpus:
        return None
    return (
        f"note: the machine's load ({load:.1f}) exceeds the {cpus} CPU(s) this process may use; "
        f"if this runs slowly, try --threads 1 (or {ENV}=1)"
    )


def set_threads(n: int) -> None:
    """torch.set_num_threads(n), and the inter-op threads too where torch still allows it (only
    before its first inter-op parallel work); 0 = one per usable CPU (:func:`usable_cpus`)."""
    global _applied
    if n > 0:
        _applied = n
    else:
        n = usable_cpus()
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # inter-op work already started in this process
        pass

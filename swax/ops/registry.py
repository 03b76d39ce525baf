"""One registry of named backends per op.

Every op (``"swa"``, ``"mlstm"``, ``"gated_delta"``) has a plain PyTorch reference that runs on
any device, and may have fast paths (flash-attn, flex attention, Triton kernels) that only work
on some devices or dtypes. A backend is chosen by name; ``"auto"`` takes the first in priority
order that can run on the inputs and is preferred for them (a backend may run somewhere yet be
slower there than a lower one: ``prefer`` says where ``"auto"`` should take it). A backend
asked for by name that cannot run on the given inputs is an error
(:class:`BackendUnavailableError`, with the reason); only ``"auto"`` falls back. A kernel that
passed its checks but fails at its first call (``guard_first_call``) hands that call on to the
automatic choice and logs a warning once, a fallback never silent; from then on it is unusable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger("swax")


@dataclass(frozen=True)
class Backend:
    """A named implementation of an op.

    ``fn`` has the op's signature. ``usable(*args, **kwargs)`` returns None when the backend
    can run on those inputs, else a short reason (e.g. "flash_attn is not installed").
    ``priority``: higher is preferred by ``"auto"``. ``prefer(*args, **kwargs)``: None where
    ``"auto"`` should take this backend when it is usable (the default: everywhere), else a short
    reason (e.g. "short windows: blockwise_fwd is faster"); a backend named explicitly ignores it.
    ``environment(device)``: None when the installed packages and the device type let the backend
    run at all (whatever the inputs), else why not; ``packages``: the distributions it uses, whose
    versions :func:`backend_report` lists (``swax info``).
    """

    op: str
    name: str
    fn: Callable
    usable: Callable[..., str | None]
    priority: int
    doc: str = ""
    prefer: Callable[..., str | None] | None = None
    environment: Callable[[str], str | None] | None = None
    packages: tuple[str, ...] = ()


class BackendUnavailableError(ValueError):
    """A backend named explicitly (not ``"auto"``) that cannot run on the inputs: ``op``,
    ``name`` and ``reason`` (why not). The ops import nothing from ``swax.core``, so this is a
    ValueError; the model turns it into a ConfigError naming its ``attn_backend``."""

    def __init__(self, op: str, name: str, reason: str):
        self.op, self.name, self.reason = op, name, reason
        super().__init__(
            f"{op} backend {name!r} is not available: {reason}; use backend=auto to fall back"
        )


_REGISTRY: dict[str, dict[str, Backend]] = {}
_WARNED: set[tuple[str, str, str]] = set()
_FORCED: dict[str, str] = {}
_RECORDERS: list[list[tuple[str, str]]] = []


@contextmanager
def record_backends() -> Iterator[list[tuple[str, str]]]:
    """Within the block, every backend an op runs is appended to the yielded list as
    ``(op, name)``, the fallback of a kernel failing at its first call included: a test that
    means a kernel can check that it ran, and that nothing else did."""
    calls: list[tuple[str, str]] = []
    _RECORDERS.append(calls)
    try:
        yield calls
    finally:
        _RECORDERS.remove(calls)


def _chosen(backend: Backend) -> Backend:
    for calls in _RECORDERS:
        calls.append((backend.op, backend.name))
    return backend


def warn_once(op: str, name: str, reason: str, chosen: str) -> None:
    """The one log line of a fallback from backend ``name`` (per reason)."""
    key = (op, name, reason)
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("swax: %s backend %r unavailable (%s); using %r", op, name, reason, chosen)


@contextmanager
def forced_backends(**names: str) -> Iterator[None]:
    """Within the block, op ``op`` runs backend ``names[op]`` whatever backend a caller asks for
    (e.g. pure-torch references while exporting to ONNX, which cannot hold custom ops)."""
    for op, name in names.items():
        if name not in _REGISTRY.get(op, {}):
            raise ValueError(f"unknown {op} backend {name!r}")
    saved = dict(_FORCED)
    _FORCED.update(names)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(saved)


def register_backend(
    op: str,
    name: str,
    fn: Callable,
    usable: Callable[..., str | None] | None = None,
    priority: int = 0,
    doc: str = "",
    prefer: Callable[..., str | None] | None = None,
    environment: Callable[[str], str | None] | None = None,
    packages: tuple[str, ...] = (),
    guard_first_call: bool = False,
) -> None:
    """Register ``fn`` as backend ``name`` of ``op`` (replacing one of the same name).

    ``environment`` is also checked first by ``usable`` (on the inputs' device).
    ``guard_first_call``: a kernel compiled at its first call (Triton) may fail there for a
    reason no check foresaw (an installed version that lacks something it calls); until one
    call has succeeded, an exception (not out-of-memory) marks the backend unusable with that
    reason, logs one line, and the call runs on the automatic choice instead (selected on the
    call's first five arguments, the tensors every op's ``usable`` takes first)."""
    usable = usable or (lambda *a, **k: None)
    if environment is not None:
        usable = _with_environment(environment, usable)
    if guard_first_call:
        fn, usable = _guarded(op, name, fn, usable)
    _REGISTRY.setdefault(op, {})[name] = Backend(
        op, name, fn, usable, priority, doc, prefer, environment, tuple(packages)
    )


def _with_environment(environment, usable):
    def check(*args, **kwargs):
        x = args[0] if args else None
        device = getattr(getattr(x, "device", None), "type", None)
        reason = environment(device) if device is not None else None
        return reason if reason is not None else usable(*args, **kwargs)

    return check


class FailureRecord:
    """What failed in a way that will not change in this process, each with why (one line):
    a guarded kernel's first call, keyed ``(op, backend name)``, and a decode step's compile,
    keyed ``("decode step", device type, configuration)`` (:class:`swax.decode.StepCache`).
    What is noted is not tried again; :func:`backend_report` shows the kernels' reasons."""

    def __init__(self) -> None:
        self._why: dict[tuple, str] = {}

    def note(self, key: tuple, why: str) -> None:
        self._why[key] = why

    def why(self, key: tuple) -> str | None:
        """Why ``key`` failed, None if it has not."""
        return self._why.get(key)


FAILURES = FailureRecord()
"""The process's one record of failures (the op registry's and the decode steps')."""


def _guarded(op: str, name: str, fn: Callable, usable: Callable):
    proven = []

    def call(*args):
        if proven:
            return fn(*args)
        try:
            out = fn(*args)
        except Exception as e:  # noqa: BLE001 - whatever a kernel's first compile raises
            if type(e).__name__ == "OutOfMemoryError":
                raise
            last = (str(e).strip().splitlines() or [""])[-1][:200]
            FAILURES.note((op, name), f"its first call failed ({type(e).__name__}: {last})")
            chosen = select_backend(op, "auto", *args[:5])
            warn_once(op, name, FAILURES.why((op, name)), chosen.name)
            return chosen.fn(*args)
        proven.append(True)
        return out

    def check(*args, **kwargs):
        return FAILURES.why((op, name)) or usable(*args, **kwargs)

    return call, check


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None if it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def backend_report(device: str = "cpu") -> list[dict]:
    """One row per registered backend, most preferred first within each op: ``op``, ``name``,
    ``doc``, ``packages`` (distribution -> installed version or None) and ``reason`` (None
    when the installed packages and ``device``'s type let it run, else why not; a backend may
    still turn some inputs away, e.g. head dims its kernel does not take)."""
    rows = []
    for op in sorted(_REGISTRY):
        for name in list_backends(op):
            b = _REGISTRY[op][name]
            reason = b.environment(device) if b.environment is not None else None
            reason = reason or FAILURES.why((op, name))
            rows.append(
                {
                    "op": op,
                    "name": name,
                    "doc": b.doc,
                    "packages": {p: package_version(p) for p in b.packages},
                    "reason": reason,
                }
            )
    return rows


def list_backends(op: str) -> list[str]:
    """Names of the registered backends of ``op``, most preferred first."""
    if op not in _REGISTRY:
        raise ValueError(f"unknown op {op!r}; known ops: {sorted(_REGISTRY)}")
    return [b.name for b in sorted(_REGISTRY[op].values(), key=lambda b: -b.priority)]


def available_backends(op: str, *args, **kwargs) -> list[str]:
    """Names of the backends of ``op`` that can run on these inputs, most preferred first."""
    return [n for n in list_backends(op) if _REGISTRY[op][n].usable(*args, **kwargs) is None]


def select_backend(op: str, name: str | None, *args, **kwargs) -> Backend:
    """The backend ``name`` of ``op`` (``None`` or ``"auto"``: the best usable and preferred one).

    An unknown name is a ValueError listing the valid ones. A known backend that cannot run on
    these inputs is a :class:`BackendUnavailableError` with the reason: naming a backend asks
    for it, and only ``"auto"`` (or None) falls back.
    """
    table = _REGISTRY.get(op)
    if not table:
        raise ValueError(f"unknown op {op!r}; known ops: {sorted(_REGISTRY)}")
    if op in _FORCED:
        return _chosen(table[_FORCED[op]])
    if name not in (None, "auto"):
        if name not in table:
            raise ValueError(
                f"unknown {op} backend {name!r}; expected one of {['auto', *list_backends(op)]}"
            )
        reason = table[name].usable(*args, **kwargs)
        if reason is not None:
            raise BackendUnavailableError(op, name, reason)
        return _chosen(table[name])
    for backend in sorted(table.values(), key=lambda b: -b.priority):
        # ``prefer`` first: it is the cheap test that turns most calls away (a decode step asks
        # for every token and layer), ``usable`` may inspect compile caches
        preferred = backend.prefer is None or backend.prefer(*args, **kwargs) is None
        if preferred and backend.usable(*args, **kwargs) is None:
            return _chosen(backend)
    raise RuntimeError(f"no usable {op} backend among {list_backends(op)}")

"""One registry of named backends per op.

Every op (``"swa"``, ``"mlstm"``, ``"gated_delta"``) has a plain PyTorch reference that runs on
any device, and may have fast paths (flash-attn, flex attention, Triton kernels) that only work
on some devices or dtypes. A backend is chosen by name; ``"auto"`` takes the first in priority
order that can run on the inputs and is preferred for them (a backend may run somewhere yet be
slower there than a lower one: ``prefer`` says where ``"auto"`` should take it). Asking for a
backend that cannot run on the given inputs falls back to the automatic choice and logs a warning
once — a fallback is never silent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("swax")


@dataclass(frozen=True)
class Backend:
    """A named implementation of an op.

    ``fn`` has the op's signature. ``usable(*args, **kwargs)`` returns None when the backend
    can run on those inputs, else a short reason (e.g. "flash_attn is not installed").
    ``priority``: higher is preferred by ``"auto"``. ``prefer(*args, **kwargs)``: None where
    ``"auto"`` should take this backend when it is usable (the default: everywhere), else a short
    reason (e.g. "short windows: blockwise_fwd is faster"); a backend named explicitly ignores it.
    """

    op: str
    name: str
    fn: Callable
    usable: Callable[..., str | None]
    priority: int
    doc: str = ""
    prefer: Callable[..., str | None] | None = None


_REGISTRY: dict[str, dict[str, Backend]] = {}
_WARNED: set[tuple[str, str, str]] = set()
_FORCED: dict[str, str] = {}


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
) -> None:
    """Register ``fn`` as backend ``name`` of ``op`` (replacing one of the same name)."""
    _REGISTRY.setdefault(op, {})[name] = Backend(
        op, name, fn, usable or (lambda *a, **k: None), priority, doc, prefer
    )


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
    these inputs falls back to the automatic choice, with a warning logged once per reason.
    """
    table = _REGISTRY.get(op)
    if not table:
        raise ValueError(f"unknown op {op!r}; known ops: {sorted(_REGISTRY)}")
    if op in _FORCED:
        return table[_FORCED[op]]
    if name not in (None, "auto"):
        if name not in table:
            raise ValueError(
                f"unknown {op} backend {name!r}; expected one of {['auto', *list_backends(op)]}"
            )
        reason = table[name].usable(*args, **kwargs)
        if reason is None:
            return table[name]
        chosen = select_backend(op, "auto", *args, **kwargs)
        key = (op, name, reason)
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning(
                "swax: %s backend %r unavailable (%s); using %r", op, name, reason, chosen.name
            )
        return chosen
    for backend in sorted(table.values(), key=lambda b: -b.priority):
        # ``prefer`` first: it is the cheap test that turns most calls away (a decode step asks
        # for every token and layer), ``usable`` may inspect compile caches
        preferred = backend.prefer is None or backend.prefer(*args, **kwargs) is None
        if preferred and backend.usable(*args, **kwargs) is None:
            return backend
    raise RuntimeError(f"no usable {op} backend among {list_backends(op)}")

"""Input checks shared by the ops. Every message starts with the op's name, names the argument
and shows what it got next to what was expected, e.g.
``mlstm: k has shape (2, 2, 7, 8), expected q's shape (B, H, T, Dqk) = (2, 2, 7, 16)``."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_floating(fn: str, **tensors: object) -> None:
    """Each keyword argument is a floating-point torch.Tensor."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{fn}: {name} must be a floating-point tensor, got dtype {x.dtype}")


def check_ndim(fn: str, name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    """``x`` has ``ndim`` dimensions, laid out as ``layout`` (e.g. "(B, H, T, Dk)")."""
    if x.ndim != ndim:
        raise ValueError(
            f"{fn}: {name} must be {ndim}-D {layout}, got ndim={x.ndim} with shape {tuple(x.shape)}"
        )


def check_shape(fn: str, name: str, x: torch.Tensor, expected: Sequence[int], layout: str) -> None:
    """``x`` has exactly the shape ``expected``, described as ``layout``."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(
            f"{fn}: {name} has shape {tuple(x.shape)}, expected {layout} = {tuple(expected)}"
        )


def check_positive_int(fn: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{fn}: {name} must be a positive int, got {value!r}")


def check_choice(fn: str, name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(
            f"{fn}: unknown {name} {value!r}, expected one of {', '.join(map(repr, choices))}"
        )


def check_window(window: object, what: str = "window", fn: str = "") -> int | None:
    """``window`` if it is a positive integer (keys each query sees) or None (no window);
    else ValueError naming ``what`` (prefixed by ``fn``, the op, when given) and the value.
    The one check of a window passed as a number: ops, the model's forward and the training
    schedules use it (a window given as text is read by swax.core.configs.parse_window)."""
    where = f"{fn}: " if fn else ""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int):
        raise ValueError(f"{where}{what} must be a positive integer or None, got {window!r}")
    if window < 1:
        raise ValueError(f"{where}{what} must be >= 1 (keys each query sees), got {window}")
    return window

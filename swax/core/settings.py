"""The two values many configs share: the device (:func:`resolve_device`) and the attention
window as a user gives it (:func:`parse_window`, :func:`resolve_window`)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from swax.core.errors import ConfigError

log = logging.getLogger("swax")


def resolve_device(name: Any = "auto", fallback_to_cpu: bool = False):
    """The torch.device for a config's ``device``: ``auto`` (cuda when available, else cpu),
    ``cpu``, ``cuda`` or ``cuda:N`` (a torch.device is checked the same way). Anything else, or
    CUDA asked for on a machine without it, is a ConfigError naming the value; with
    ``fallback_to_cpu`` a missing CUDA gives the CPU instead, with a warning logged."""
    import torch

    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {str(name)!r}; expected cpu, cuda, cuda:N or auto")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            if fallback_to_cpu:
                log.warning("swax: device %s requested but CUDA is not available; using cpu", name)
                return torch.device("cpu")
            raise ConfigError(f"device {str(name)!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {str(name)!r} requested but only {torch.cuda.device_count()} CUDA "
                f"device(s) are visible"
            )
    return dev


WindowSetting = int | Literal["default", "full"]
"""An attention window as a user gives it: a positive integer, "default" (the model's
``config.window``) or "full" (no window: full causal attention)."""


def parse_window(value: Any) -> WindowSetting:
    """A window setting from text or a number: "default", "full" (also "none"), or a positive
    integer ("2048" or 2048). Anything else is a ConfigError naming the value."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("default", "full"):
            return text  # type: ignore[return-value]
        if text == "none":
            return "full"
        if text.lstrip("+-").isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"window must be a positive integer or 'full' (or 'default': the model's), "
            f"got {value!r}"
        )
    if value < 1:
        raise ConfigError(f"window must be >= 1 (keys each query sees), got {value}")
    return value


def resolve_window(setting: Any, default: int | None) -> int | None:
    """The window to pass to the model: ``default`` for "default", None for "full"."""
    w = parse_window(setting)
    return default if w == "default" else None if w == "full" else w

"""One way to declare a constraint: every numeric field of every config states its interval on
the field itself (swax.core.configs.bounded / option), and one function checks them all.

These tests walk every config dataclass of swax: each int or float field must declare bounds,
and a value just outside them (worked out here from the interval text, independently of the
checker) must be refused with a ConfigError naming the dotted key."""

import dataclasses
import importlib
import inspect
import math
import types
import typing

import pytest

from swax.core.configs import check_fields
from swax.core.errors import ConfigError
from swax.train import load_train_config
from swax.train.config import TrainConfig

CONFIG_MODULES = [
    "swax.config",
    "swax.cli.options",
    "swax.train.config",
    "swax.data.config",
    "swax.sweep.config",
]


def _config_classes():
    for name in CONFIG_MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if dataclasses.is_dataclass(cls) and cls.__module__ == name:
                yield cls


def _numeric(tp) -> type | None:
    """int or float for a field annotated int, float, X | None, list[X], tuple[X, ...]."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if len(args) != 1:
            return None
        tp = args[0]
    if typing.get_origin(tp) in (list, tuple):
        tp = typing.get_args(tp)[0]
    return tp if tp in (int, float) else None


def _numeric_fields():
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = _numeric(hints[f.name])
            if kind is not None:
                yield cls, f, kind


def _sections(cls=TrainConfig):
    """The dataclasses nested in ``cls`` (checked by it, under their dotted keys)."""
    for tp in typing.get_type_hints(cls).values():
        if dataclasses.is_dataclass(tp):
            yield tp
            yield from _sections(tp)


def _checks_itself(cls) -> bool:
    return "__post_init__" in {k for c in cls.__mro__ for k in vars(c)}


def test_there_are_configs_to_check():
    classes = list(_config_classes())
    assert len(classes) >= 25, [c.__name__ for c in classes]
    assert len(list(_numeric_fields())) >= 80


def test_every_config_is_checked_on_construction_or_by_the_config_it_is_part_of():
    sections = set(_sections())
    for cls in _config_classes():
        assert _checks_itself(cls) or cls in sections, f"{cls.__name__} is never checked"


@pytest.mark.parametrize(
    "cls, field, kind", list(_numeric_fields()), ids=lambda x: getattr(x, "name", None)
)
def test_every_numeric_field_declares_its_bounds(cls, field, kind):
    interval = field.metadata.get("bounds")
    assert interval, f"{cls.__name__}.{field.name} ({kind.__name__}) has no bounds"
    text = interval.strip()
    assert text[0] in "[(" and text[-1] in "])" and text.count(",") == 1, interval


def _outside(interval: str, kind: type) -> list:
    """Values just outside ``interval`` (and NaN for floats), worked out from its text."""
    lo_text, hi_text = (t.strip() for t in interval.strip()[1:-1].split(","))
    lo, hi = float(lo_text), float(hi_text)
    bad = [math.nan, math.inf] if kind is float else []
    step = 1 if kind is int else 1e-9 * max(1.0, abs(lo))
    if math.isfinite(lo):
        bad.append(
            kind(lo) if interval[0] == "(" else (lo - step if kind is float else int(lo) - 1)
        )
    if math.isfinite(hi) and hi < 2**53:
        bad.append(
            kind(hi) if interval[-1] == ")" else (hi + 1e-9 if kind is float else int(hi) + 1)
        )
    return bad


def _required(cls) -> dict:
    """Values for the fields without a default (positional arguments of a command)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            out[f.name] = ["x"] if typing.get_origin(hints[f.name]) is list else "x"
    return out


def _refusable(cases):
    """The fields some value of which is outside the bounds (an integer bounded "(-inf, inf)"
    has none)."""
    return [c for c in cases if _outside(c[1].metadata.get("bounds") or "(-inf, inf)", c[2])]


@pytest.mark.parametrize(
    "cls, field, kind",
    # the sections of TrainConfig are checked by it, under dotted keys (the test below)
    _refusable([c for c in _numeric_fields() if _checks_itself(c[0])]),
    ids=lambda x: getattr(x, "name", None),
)
def test_a_value_outside_the_bounds_is_refused_naming_the_field(cls, field, kind):
    values = _outside(field.metadata.get("bounds") or "(-inf, inf)", kind)
    for bad in values:
        value = [bad] if typing.get_origin(typing.get_type_hints(cls)[field.name]) is list else bad
        with pytest.raises(ConfigError, match=rf"\b{field.name} must be .*, got "):
            cls(**_required(cls), **{field.name: value})


def _train_keys(cls=TrainConfig, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _train_keys(hints[f.name], f"{prefix}{f.name}.")
        elif _numeric(hints[f.name]) is not None:
            yield prefix + f.name, f, _numeric(hints[f.name])


@pytest.mark.parametrize(
    "key, field, kind",
    _refusable(list(_train_keys())),
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_a_training_key_outside_its_bounds_names_the_dotted_key(key, field, kind):
    values = _outside(field.metadata.get("bounds") or "(-inf, inf)", kind)
    for bad in values:
        with pytest.raises(ConfigError, match=rf"^{key} must be .*, got "):
            load_train_config(None, [f"{key}={_override_text(field, bad)}"])


def _override_text(field, bad) -> str:
    """The key=value text of ``bad``; for a list or tuple field a YAML list of it, as many
    items as its default has (YAML spells NaN and infinity .nan and .inf)."""
    default = field.default
    if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    if not isinstance(default, (list, tuple)):
        return repr(bad)
    item = ".nan" if bad != bad else ".inf" if bad == math.inf else repr(bad)
    return "[" + ", ".join([item] * max(1, len(default))) + "]"


def test_check_fields_reads_intervals_as_written():
    from swax.core.configs import bounded

    @dataclasses.dataclass
    class Inner:
        p: float = bounded(0.5, "[0, 1)")

    @dataclasses.dataclass
    class Outer:
        n: int = bounded(1, "[1, inf)")
        k: int | None = bounded(None, "[0, 3]")
        xs: list[float] = bounded(dataclasses.MISSING, "(0, inf)", default_factory=list)
        free: float = 0.0
        inner: Inner = dataclasses.field(default_factory=Inner)

    check_fields(Outer())  # defaults inside
    check_fields(Outer(n=10**12, k=3, xs=[1e-300, 5.0], free=-1e300, inner=Inner(p=0.0)))
    cases = [
        (dict(n=0), "n must be a positive integer, got 0"),
        (dict(n=2.0), "n must be an integer, got 2.0"),
        (dict(k=4), r"k must be in \[0, 3\] or None, got 4"),
        (dict(xs=[1.0, 0.0]), "xs must be a positive number, got 0.0"),
        (dict(free=math.inf), "free must be a finite number, got inf"),
        (dict(inner=Inner(p=1.0)), r"^sub\.inner\.p must be in \[0, 1\), got 1.0"),
    ]
    for kw, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_fields(Outer(**kw), prefix="sub.")


def test_an_integer_beyond_float_range_is_checked_not_a_crash():
    # math.isfinite(10**400) raises OverflowError: only floats are tested for finiteness
    from swax.core.configs import bounded

    @dataclasses.dataclass
    class Small:
        n: int = bounded(1, "[0, 10]")
        any_int: int = bounded(0, "(-inf, inf)")

    check_fields(Small(any_int=10**400))
    with pytest.raises(ConfigError, match=r"n must be in \[0, 10\], got 1000"):
        check_fields(Small(n=10**400))


def test_zero_soft_caps_mean_off_and_are_accepted():
    from swax import SwaxConfig

    SwaxConfig(gate_soft_cap=0.0, logit_soft_cap=0.0)  # the layers read 0 as "no cap"
    with pytest.raises(ConfigError, match="gate_soft_cap must be >= 0"):
        SwaxConfig(gate_soft_cap=-1.0)


def test_a_command_window_is_parsed_and_none_refused():
    from swax.cli.options import ExportOnnxConfig, GenerateConfig

    assert GenerateConfig(window="2048").window == 2048
    assert GenerateConfig(window="none").window == "full"
    with pytest.raises(ConfigError, match="window must be a positive integer or 'full'"):
        GenerateConfig(window=None)
    assert ExportOnnxConfig(model_dir="m", out="o.onnx").window is None  # the model's own

"""Dataclass configs: field docstrings, strict construction from dicts, key=value overrides.

Every config in swax is a dataclass whose fields carry a docstring (a string literal right after
the field, as in mlstm_kernels). :func:`from_dict` builds one from plain data (JSON, YAML),
rejecting unknown keys and wrong types with an error that names the dotted key.
:func:`add_arguments` and :func:`from_args` make a command line of a dataclass (one option per
field, its docstring as help), so every ``swax`` command reads a config the same way.
The two values many configs share, the device and the window, are read by
:mod:`swax.core.settings`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import logging
import math
import re
import textwrap
import types
import typing
from functools import cache
from typing import Any, Literal, Union

from swax.core.errors import ConfigError

log = logging.getLogger("swax")


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: docstring} read from the class source (attribute docstrings)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for a, b in zip(body, body[1:]):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[a.target.id] = inspect.cleandoc(b.value.value)
    return docs


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def describe_type(tp: Any) -> str:
    """What values the annotation ``tp`` accepts, in words: "true or false, or 'auto'"."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return ", or ".join(describe_type(a) for a in args)
    if origin is Literal:
        return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp is type(None):
        return "null"
    return names.get(tp, _type_name(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (converting int->float, list->tuple)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # X | None: X's own error (e.g. a nested section's key)
            return coerce(value, options[0], key)
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {describe_type(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values, got {value!r}")
            items = [coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            a = args[0] if args else Any
            items = [coerce(v, a, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def field_type(cls: type, path: list[str]) -> Any:
    """The annotation of the field at dotted ``path`` (["optim", "lr"]) of dataclass ``cls``,
    through its nested sections (a section may be ``X | None``); None where the path names no
    field (an unknown key, a shorthand such as the model's ``preset``, a key inside a mapping)."""
    tp: Any = cls
    for part in path:
        if typing.get_origin(tp) in (Union, types.UnionType):  # an optional section
            options = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = options[0] if len(options) == 1 else None
        if not dataclasses.is_dataclass(tp):
            return None
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        if part not in fields:
            return None
        tp = typing.get_type_hints(tp)[part]
    return tp


_NULL = ("null", "Null", "NULL", "~")
_BOOL = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_text(text: str, tp: Any, key: str) -> Any:
    """The value the text ``text`` (of a ``key=value`` override) stands for in a field annotated
    ``tp``, read by that type rather than as YAML 1.1 (where ``010`` is octal 8 and ``off`` is
    false): an int ``010`` is 10 (also ``1e3``, a float that is whole), a float ``3e-4``, a
    bool true/false (yes/no, on/off; any case), a string the text as it is, a Literal one of
    its values, ``null`` (or ``~``) None where None is allowed; a union tries its members in
    order. Lists, mappings and anything else (``tp`` None: a key of no known field) are read as
    YAML (flow style: ``[3, 6]``, ``{a: 1}``). Text that is none of the type's values is a
    ConfigError naming ``key`` and the text."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    t = text.strip()
    if origin in (Union, types.UnionType):
        if type(None) in args and t in _NULL:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return parse_text(text, a, key)
                except ConfigError:
                    pass
        raise ConfigError(f"{key}: expected {describe_type(tp)}, got {text!r}")
    if origin is Literal:
        for a in args:
            if (t == a) if isinstance(a, str) else (_yaml_text(text) == a):
                return a
        raise ConfigError(f"{key}: expected one of {list(args)}, got {text!r}")
    if tp is bool:
        if t.lower() in _BOOL:
            return _BOOL[t.lower()]
        raise ConfigError(f"{key}: expected true or false, got {text!r}")
    if tp is int:
        try:
            return int(t)  # decimal: 010 is 10
        except ValueError:
            pass
        try:
            f = float(t)
        except ValueError:
            f = math.nan
        if f.is_integer():
            return int(f)
        raise ConfigError(f"{key}: expected an integer, got {text!r}")
    if tp is float:
        try:
            return float(t)
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {text!r}") from None
    if tp is str:
        return text
    return _yaml_text(text)


def _yaml_text(text: str) -> Any:
    """``text`` read as a YAML value (the text itself if it is not valid YAML), numbers such as
    3e-4 (a string in YAML 1.1) as numbers."""
    import yaml

    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    if isinstance(value, str):
        try:
            f = float(value)
            low = value.lower()
            value = int(f) if f.is_integer() and "." not in value and "e" not in low else f
        except ValueError:
            pass
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ConfigError.

    A class may define a classmethod ``expand_keys(data, prefix)`` that rewrites its plain data
    before the keys are checked: a shorthand key that stands for several (SwaxConfig's
    ``preset``), or a default that depends on another section (TrainConfig's model window).
    An error of a nested section's own checks (its ``__post_init__``) names the section's dotted
    key (``model.d_model must be ...``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: expected a mapping, got {data!r}")
    expand = getattr(cls, "expand_keys", None)
    if expand is not None:
        data = expand(data, prefix)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1, cutoff=0.6)
        hint = f"; did you mean {prefix}{close[0]}?" if close else ""
        raise ConfigError(
            f"unknown config key {prefix}{unknown[0]!s}{hint} "
            f"(valid keys: {', '.join(sorted(fields))})"
        )
    kwargs = {k: coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if not prefix or str(e).startswith(prefix):
            raise
        raise ConfigError(_under(prefix, str(e), fields)) from None


def _under(prefix: str, message: str, fields: Any) -> str:
    """``message`` of a nested section's check, named by the section's dotted ``prefix``: a
    message that starts with one of its field names gets the prefix on that name
    ("model.d_model must be ..."), any other is led by the section ("model: ...")."""
    head = re.match(r"[A-Za-z_]\w*", message)
    if head is not None and head.group() in fields:
        return prefix + message
    return f"{prefix.rstrip('.')}: {message}"


def parse_interval(text: str) -> tuple[bool, float, float, bool]:
    """ "[0, 1)" -> (closed below, 0, 1, closed above); "inf" bounds allowed."""
    lo, hi = (s.strip() for s in text.strip()[1:-1].split(","))

    def num(s: str) -> float:
        try:
            return int(s)
        except ValueError:
            return float(s)

    return text.strip()[0] == "[", num(lo), num(hi), text.strip()[-1] == "]"


def interval_text(interval: str, integer: bool, below: bool = False) -> str:
    """How a message states the interval; ``below``: the value is under its lower bound (an
    upper bound beyond 2^53, such as a seed's, is then left out)."""
    lo_in, lo, hi, hi_in = parse_interval(interval)
    if math.isinf(hi) and math.isinf(lo):
        return "a finite number" if not integer else "an integer"
    if math.isinf(hi) or (below and hi >= 2**53):
        if integer and lo == 1 and lo_in:
            return "a positive integer"
        if not integer and lo == 0 and not lo_in:
            return "a positive number"
        return f"{'>=' if lo_in else '>'} {lo}"
    return f"in {interval.replace(' ', '').replace(',', ', ')}"


SEED_BOUNDS = f"[0, {2**63 - 1}]"
"""The interval of a random seed (what torch.manual_seed takes)."""


def bounded(default: Any = dataclasses.MISSING, bounds: str | None = None, **kw: Any) -> Any:
    """A dataclass field whose value must lie in ``bounds``, an interval written as in
    mathematics: "[0, 1)", "(0, inf)", "[1, inf)", "(-inf, inf)" (any finite value).
    :func:`check_fields` checks it. ``kw``: dataclasses.field's (``default_factory``)."""
    meta = {"bounds": bounds} if bounds is not None else {}
    return dataclasses.field(default=default, metadata=meta, **kw)


def check_fields(obj: Any, prefix: str = "") -> None:
    """The one check of a config's declared constraints: every field of dataclass ``obj`` with
    ``bounds`` (:func:`bounded`, :func:`option`) lies in its interval, and every float field is
    finite; nested dataclass fields are checked the same way, their keys dotted. Fields
    annotated ``int`` must hold integers; None (an optional field left unset) passes; each item
    of a list is checked. The first bad value is a ConfigError naming the key (``prefix`` +
    dotted field) and the value."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_fields(value, f"{prefix}{f.name}.")
            continue
        item = _item_type(tp)
        interval = f.metadata.get("bounds")
        if interval is None and item is not float:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if interval is None:  # a float without bounds: any finite value
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"{prefix}{f.name} must be a finite number, got {v!r}")
                continue
            check_number(prefix + f.name, v, interval, item is int, optional=_optional(tp))


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _item_type(tp: Any) -> Any:
    """int for ``int``, ``int | None``, ``list[int]``, ``tuple[int, ...]``; likewise float."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else tp
    if typing.get_origin(tp) in (list, tuple):
        tp = typing.get_args(tp)[0]
    return tp


def check_number(key: str, v: Any, interval: str, integer: bool, optional: bool = False) -> None:
    """ConfigError unless ``v`` is a number (an integer if ``integer``) in ``interval``; None
    passes. ``optional``: the message says that None (unset) is allowed too."""
    if v is None:
        return
    unset = " or None" if optional else ""
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
        raise ConfigError(f"{key} must be {kind}{unset}, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{key} must be a finite number{unset}, got {v!r}")
    lo_in, lo, hi, hi_in = parse_interval(interval)
    below = v < lo or (v == lo and not lo_in)
    if below or v > hi or (v == hi and not hi_in):
        text = interval_text(interval, integer, below)
        raise ConfigError(f"{key} must be {text}{unset}, got {v!r}")


def load_yaml_mapping(path: Any, what: str) -> dict:
    """The mapping of keys in the YAML file ``path`` (empty file: {}). A missing or unreadable
    file, one that is not UTF-8 text or not valid YAML, and one holding anything but a
    mapping are ConfigErrors naming ``what`` (e.g. "config file") and the path."""
    import pathlib

    import yaml

    p = pathlib.Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {p} {'is a folder' if p.is_dir() else 'does not exist'}")
    try:
        text = p.read_bytes().decode("utf-8")
        data = yaml.safe_load(text) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {p} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {p}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{what} {p} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {p} must hold a mapping of keys")
    return data


def to_dict(obj: Any) -> dict:
    """A dataclass as plain JSON-able data (tuples become lists)."""

    def conv(x):
        if dataclasses.is_dataclass(x):
            return {f.name: conv(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        return x

    return conv(obj)


def default_text(f: dataclasses.Field) -> str | None:
    """A field's default as help text shows it (None: no default worth showing)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    if value is None or value is False or value == [] or value == ():
        return None
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def config_keys(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, first sentence of its docstring) of every field of dataclass
    ``cls``, nested dataclasses flattened (except a field whose metadata says
    ``flatten=False``: one row): the keys a YAML file or key=value may set."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]) and f.metadata.get("flatten", True):
            rows += config_keys(hints[f.name], key + ".")
            continue
        doc = " ".join(docs.get(f.name, "").split())
        first = doc.split(". ")[0].rstrip(".")
        rows.append((key, default_text(f) or "", first))
    return rows

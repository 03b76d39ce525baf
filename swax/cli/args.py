"""Command lines made from dataclass configs: one option per field, typed from its annotation,
with the field's docstring and default as help (:mod:`swax.core.configs` holds the configs
themselves)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

from swax.core.configs import (
    check_number,
    default_text,
    field_docs,
    from_dict,
    interval_text,
    parse_interval,
)
from swax.core.errors import ConfigError


def option(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    positional: bool = False,
    nargs: str | None = None,
    repeat: bool = False,
    group: str | None = None,
    metavar: str | None = None,
    choices: Sequence[str] | None = None,
    bounds: str | None = None,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A :func:`bounded` field with how the command line shows it: ``positional`` (else
    ``--field-name``), ``nargs``, ``repeat`` (the option may be given several times; a list),
    ``group`` (options of one group exclude each other), ``metavar``, ``choices``, ``bounds``
    (its interval: checked by the parser and, on construction, by :func:`check_fields`) and
    ``parse`` (text -> value)."""
    meta = dict(
        positional=positional,
        nargs=nargs,
        repeat=repeat,
        group=group,
        metavar=metavar,
        choices=choices,
        parse=parse,
    )
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata={"cli": meta, **({"bounds": bounds} if bounds is not None else {})},
    )


def _parser_of(tp: Any, key: str, bounds: str | None) -> Callable[[str], Any]:
    """Text -> value of type ``tp`` (int, float or str) within ``bounds``, as argparse's
    ``type=``."""

    def parse(text: str) -> Any:
        if tp is int:
            try:
                value: Any = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        elif tp is float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        else:
            value = text
        if bounds is not None:
            try:
                check_number(key, value, bounds, tp is int)
            except ConfigError:
                below = value < parse_interval(bounds)[1]
                what = interval_text(bounds, tp is int, below)
                raise argparse.ArgumentTypeError(f"expected {what}, got {text}") from None
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one argument per field of dataclass ``cls`` to ``parser``: ``--field-name`` (or a
    positional), typed from the annotation (bool: --x / --no-x; Literal: choices; list:
    several values), with the field's docstring and default as help. Options that are not
    given are left out of the parsed namespace, so the dataclass defaults apply."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("cli", {})
        tp, args = hints[f.name], ()
        if typing.get_origin(tp) in (Union, types.UnionType):  # X | None -> X
            args = tuple(a for a in typing.get_args(tp) if a is not type(None))
            tp = args[0] if len(args) == 1 else tp
        doc = docs.get(f.name, "").replace("%", "%%")
        default = default_text(f)
        if default is not None and "default" not in doc.lower():
            doc += f" (default: {default})"
        kw: dict[str, Any] = {"help": doc, "default": argparse.SUPPRESS}
        if meta.get("metavar"):
            kw["metavar"] = meta["metavar"]
        item = tp
        if typing.get_origin(tp) in (list, tuple):
            item = typing.get_args(tp)[0]
            if meta.get("repeat"):
                kw["action"] = "append"
            else:
                kw["nargs"] = meta.get("nargs") or "+"
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(item) is Literal:
            kw["choices"] = typing.get_args(item)
        elif meta.get("parse"):
            kw["type"] = _argparse_type(meta["parse"])
        else:
            kw["type"] = _parser_of(item, f.name, f.metadata.get("bounds"))
            if item in (int, float) and "metavar" not in kw:
                kw["metavar"] = "N" if item is int else "X"
        if meta.get("choices"):
            kw["choices"] = list(meta["choices"])
        target = parser
        if meta.get("group"):
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_mutually_exclusive_group()
            target = groups[meta["group"]]
        if meta.get("positional"):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                del kw["default"]  # required
            target.add_argument(f.name, **kw)
        else:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                del kw["default"]  # a required option: argparse shows and checks it as such
                kw["required"] = True
            target.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A ``parse`` raising ConfigError, as argparse's ``type=`` (its message kept)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def from_args(cls: type, namespace: argparse.Namespace) -> Any:
    """The dataclass ``cls`` from the arguments :func:`add_arguments` parsed."""
    names = {f.name for f in dataclasses.fields(cls)}
    return from_dict(cls, {k: v for k, v in vars(namespace).items() if k in names})

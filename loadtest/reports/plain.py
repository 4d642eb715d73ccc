"""Dataclasses to and from JSON's plain values, every field checked on the way in.

Results, history entries and capacity plans are written as JSON and read back by later runs and other
commands; reading one validates it whole, so that a hand-edited or older file gets a message naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def to_plain(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and infinities become null (``from_plain`` reads them back as NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def from_plain(cls: type[T], data: Any, where: str) -> T:
    """The dataclass ``cls`` built from JSON data, every field checked against its type.

    ``where`` names the object in the message an unknown, missing or mistyped field gets
    (``results.correctness.exact`` must be a number, ...), so a hand-edited file is told what is wrong.
    """
    if not isinstance(data, dict):
        raise TypeError(f"{where} must be an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{where} has unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}.{name} is missing")
            continue
        kwargs[name] = _convert(hints[name], data[name], f"{where}.{name}")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where)
    if dataclasses.is_dataclass(hint):
        return from_plain(typing.cast(type[Any], hint), value, where)
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(f"{where} must be a list")
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where} must be an object")
        return {str(k): _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is float:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is bool and not isinstance(value, bool):
        raise TypeError(f"{where} must be true or false, got {value!r}")
    if hint is str and not isinstance(value, str):
        raise TypeError(f"{where} must be a string, got {value!r}")
    return value

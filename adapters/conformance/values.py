"""A generic JSON form of the kernel's attrs values, for layers whose values map one to one onto JSON.

Rules of this module:

- An attrs value is an object of its fields, by the kernel's field names; an
  enum is its value; a time is :func:`.wire.time_text`; a duration integer
  microseconds; a tuple an array; ``None`` null.  The same rules as
  :mod:`.wire`, applied by type rather than written out per class.
- Free-text fields (``message``, ``reason``) are never encoded: comparisons
  use codes and values only.
- A field a request gained after its cases were published, whose absence
  means its default (``earlier_input_digest``, cases 2.6.0), is left out
  while it holds that default: the earlier cases keep their form, and a
  driver that reads them needs nothing new.
- :func:`structure` reads the JSON back into the type a decision takes.  A
  value of the wrong shape is passed through unchanged, so that the kernel,
  not this reader, refuses it and names the field.  A required member that
  is missing is :data:`MISSING` for the same reason: the kernel checks its
  request's fields in their order, so a missing one is refused where the
  order places it, as a malformed one is, never as a reader's error.
"""

from __future__ import annotations

import enum
import types
import typing
from datetime import datetime, timedelta
from typing import Any

import attrs

from . import wire
from .wire import MISSING

TEXT_FIELDS = frozenset({"message", "reason"})
LATER_FIELDS = frozenset({"earlier_input_digest"})
"""Fields left out while None (see the module's rules)."""




def missing_member(kind: Any, data: Any, path: str) -> str | None:
    """The dotted name of the first required member of ``kind`` that ``data`` leaves out, at any depth, or None.

    For values that are stored rows rather than requests (an Operation as stored): the layer documents no
    refusal of a malformed row, so the driver names the member in a protocol error instead.
    """
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return missing_member(options[0], data, path) if len(options) == 1 and data is not None else None
    if not (isinstance(kind, type) and attrs.has(kind)) or not isinstance(data, dict):
        return None
    hints = typing.get_type_hints(kind)
    for f in attrs.fields(kind):
        if f.name not in data:
            if f.default is attrs.NOTHING:
                return f"{path}.{f.name}"
            continue
        found = missing_member(hints[f.name], data[f.name], f"{path}.{f.name}")
        if found is not None:
            return found
    return None


def unstructure(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return wire.time_text(value)
    if isinstance(value, timedelta):
        return wire.duration_us(value)
    if isinstance(value, tuple | list):
        return [unstructure(v) for v in value]
    if attrs.has(type(value)):
        return {
            f.name: unstructure(getattr(value, f.name))
            for f in attrs.fields(type(value))
            if f.name not in TEXT_FIELDS and not (f.name in LATER_FIELDS and getattr(value, f.name) is None)
        }
    raise TypeError(f"no JSON form for {type(value).__name__}")


def structure(kind: Any, data: Any) -> Any:
    """``data`` as a value of ``kind``; anything that does not fit is returned as it is."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if data is None:
            return None
        return structure(options[0], data) if len(options) == 1 else data
    if origin is tuple:
        if not isinstance(data, list):
            return data
        args = typing.get_args(kind)
        item = args[0] if args else Any
        return tuple(structure(item, v) for v in data)
    if kind is datetime:
        return wire.parse_time(data)
    if kind is timedelta:
        return wire.parse_duration(data)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(data)
        except ValueError:
            return data
    if isinstance(kind, type) and attrs.has(kind):
        if not isinstance(data, dict):
            return data
        hints = typing.get_type_hints(kind)
        values = {}
        for f in attrs.fields(kind):
            if f.name in data:
                values[f.name] = structure(hints[f.name], data[f.name])
            elif f.default is attrs.NOTHING:
                values[f.name] = MISSING
        return kind(**values)
    return data

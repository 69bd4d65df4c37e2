"""Settings as values: a dataclass of a service's settings crosses a process boundary
as one JSON message (``--config-json``), never re-typed field by field into argv.

:func:`to_json` writes every field; :func:`from_json` reads them back, refusing an
unknown field, a missing one without a default, and a value of the wrong type (a
``bool`` is not an ``int``, an ``int`` is a ``float``), with a
:class:`~stoker.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

from stoker.errors import ConfigError

T = TypeVar("T")


def to_json(value: Any) -> str:
    """The settings ``value`` (a dataclass instance) as one line of JSON."""
    return json.dumps(dataclasses.asdict(value), sort_keys=True, separators=(",", ":"))


def _accepts(kind: Any, value: Any) -> bool:
    if kind is Any:
        return True
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(k, value) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is bool:
        return type(value) is bool
    if kind is int:
        return type(value) is int
    if kind is float:
        return type(value) in (int, float)
    if kind is str:
        return isinstance(value, str)
    raise TypeError(f"settings fields must be None, bool, int, float or str, not {kind}")


def from_json(cls: type[T], text: str, where: str = "--config-json") -> T:
    """The settings of type ``cls`` that :func:`to_json` wrote."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a JSON object, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    kwargs = {}
    for name, field in fields.items():
        if name not in raw:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise ConfigError(f"{where}: setting {name!r} is missing")
            continue
        value = raw[name]
        if not _accepts(hints[name], value):
            raise ConfigError(f"{where}: setting {name!r} is {value!r}, not {hints[name]}")
        kwargs[name] = float(value) if hints[name] is float else value
    return cls(**kwargs)

"""``--declare KEY=VALUE``: declaration overrides typed by the Declaration's own type hints.

Apart from resolving ``--impl`` (harness.calls.registry) because it knows nothing of adapters: it reads
``conformance.contract.Declaration``'s fields, so a new field is accepted on the command line with
no change here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from conformance.contract import Declaration


class ImplSpecError(ValueError):
    """An ``--impl`` or ``--declare`` value that cannot be used; the message is shown to the user."""


_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")
_NONE = ("none", "")


def _union_args(hint: Any) -> tuple[Any, ...] | None:
    """The members of ``X | Y`` / ``Optional[X]``; None when ``hint`` is not a union."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return None


def _literal_choices(hint: Any) -> tuple[Any, ...] | None:
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def expected_phrase(hint: Any) -> str:
    """What a ``--declare`` value of this Declaration type must look like, in words."""
    members = _union_args(hint)
    if members is not None:
        rest = [m for m in members if m is not type(None)]
        phrase = " or ".join(expected_phrase(m) for m in rest)
        return phrase + " or none" if len(rest) < len(members) else phrase
    choices = _literal_choices(hint)
    if choices is not None:
        return "one of " + ", ".join(repr(c) for c in choices)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if typing.get_origin(hint) in (frozenset, set, tuple, list):
        return "a comma-separated list"
    return f"a value of type {hint}"


class _BadValue(Exception):
    """The raw string does not parse as the field's type."""


def _parse_as(hint: Any, raw: str) -> Any:
    """``raw`` as a value of ``hint`` (a Declaration field type), or :class:`_BadValue`."""
    members = _union_args(hint)
    if members is not None:
        if type(None) in members and raw.lower() in _NONE:
            return None
        for m in members:
            if m is type(None):
                continue
            try:
                return _parse_as(m, raw)
            except _BadValue:
                pass
        raise _BadValue
    choices = _literal_choices(hint)
    if choices is not None:
        for c in choices:
            if raw == str(c):
                return c
        raise _BadValue
    if hint is bool:
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise _BadValue
    if hint in (int, float):
        try:
            return hint(raw)
        except ValueError:
            raise _BadValue from None
    if hint is str:
        return raw
    origin = typing.get_origin(hint)
    if origin in (frozenset, set, tuple, list):
        items = [v.strip() for v in raw.split(",") if v.strip()]
        return frozenset(items) if origin in (frozenset, set) else tuple(items)
    raise _BadValue


def parse_declare(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings into Declaration overrides, typed by the Declaration field's type hint.

    Every field type is parsed from its hint, not from a list of names: bool (true/false, yes/no,
    1/0, on/off), int, ``X | None`` ("none" or empty for None), ``Literal`` choices, frozenset or
    tuple of names (comma-separated), str. A value that does not parse, or that the Declaration
    rejects, is an :class:`ImplSpecError` naming the field, the value and what was expected, which
    the plugin turns into a one-line usage error (exit code 4).
    """
    fields = {f.name: f for f in dataclasses.fields(Declaration)}
    hints = typing.get_type_hints(Declaration)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise ImplSpecError(f"--declare {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(fields))}")
        raw = raw.strip()
        hint = hints[key]
        try:
            value = _parse_as(hint, raw)
        except _BadValue:
            raise ImplSpecError(f"--declare {key}={raw!r}: expected {expected_phrase(hint)}") from None
        try:
            Declaration().replace(**{key: value})
        except (ValueError, TypeError) as exc:
            raise ImplSpecError(f"--declare {key}={raw!r}: expected {expected_phrase(hint)}; {exc}") from None
        out[key] = value
    try:
        Declaration().replace(**out)
    except (ValueError, TypeError) as exc:
        raise ImplSpecError(f"--declare: {exc}") from None
    return out

"""Resolving ``--impl``: built-in names, ``module:attr``, and third-party entry points.

Accepted forms, tried in this order:

1. a built-in name (``implementations.BUILTINS``) or a name registered by another package in the
   entry-point group ``sdpa_conformance.adapters`` (value ``module:attr``);
2. ``module:attr`` naming an adapter object, an adapter class (instantiated without arguments), or
   a plain function with the signature of ``torch.nn.functional.scaled_dot_product_attention``, or
   of another API named by ``--signature`` (harness.signatures: ``flash-attn``).

Everything is imported lazily: an adapter whose framework is missing is *unavailable* with the
import error as its reason, and only its own tests are skipped.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from conformance.contract import Declaration
from conformance.harness import signatures

ENTRY_POINT_GROUP = "sdpa_conformance.adapters"
FORMS = (
    "a built-in or entry-point name (see --impl-list), "
    "'module:attr' naming an adapter object or class, "
    "or 'module:function' naming a function with the torch SDPA signature"
)


class ImplSpecError(ValueError):
    """An ``--impl`` or ``--declare`` value that cannot be used; the message is shown to the user."""


@dataclass
class Resolved:
    spec: str
    adapter: Any | None
    reason: str | None  # why it is unavailable here; None when usable

    @property
    def name(self) -> str:
        return str(getattr(self.adapter, "name", self.spec)) if self.adapter is not None else self.spec

    @property
    def usable(self) -> bool:
        """The adapter loaded and says it can run here."""
        return self.adapter is not None and not self.reason


def builtin_names() -> dict[str, str]:
    from implementations import BUILTINS

    return dict(BUILTINS)


def plugin_names() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_names() -> dict[str, str]:
    names = plugin_names()
    names.update(builtin_names())  # built-ins win a name clash: their meaning is documented here
    return names


def _import_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ImplSpecError(f"{target!r} is not of the form module:attr")
    module = importlib.import_module(module_name)  # ImportError is handled by the caller
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImplSpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


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


def _as_adapter(obj: Any, spec: str, overrides: dict[str, Any], signature: str = signatures.DEFAULT) -> Any:
    if inspect.isclass(obj):
        obj = obj()
    if hasattr(obj, "forward") and hasattr(obj, "declaration"):
        if signature != signatures.DEFAULT:
            raise ImplSpecError(
                f"--signature={signature} describes a plain function; {spec!r} is an adapter, which brings its own"
            )
        adapter = obj
    elif callable(obj):
        adapter = signatures.wrap(obj, spec, signature, device=str(overrides.get("device", "cpu")))
    else:
        raise ImplSpecError(
            f"{spec!r} resolved to a {type(obj).__name__}, which is neither an adapter "
            "(an object with .forward and .declaration) nor a callable"
        )
    if overrides:
        adapter.declaration = adapter.declaration.replace(**overrides)
    return adapter


def resolve(spec: str, overrides: dict[str, Any] | None = None, signature: str = "sdpa") -> Resolved:
    """Resolve one ``--impl`` value. Unknown names raise :class:`ImplSpecError` listing what exists.

    ``signature`` (``--signature``, harness.signatures) is the calling convention of a plain function."""
    overrides = overrides or {}
    names = known_names()
    if spec in names:
        target = names[spec]
    elif ":" in spec:
        target = spec
    else:
        raise ImplSpecError(
            f"unknown --impl {spec!r}. Available names: {', '.join(sorted(names))}. Accepted forms: {FORMS}."
        )
    try:
        obj = _import_target(target)
    except ImportError as exc:
        if spec in names:  # a built-in whose framework is missing: unavailable, not an error
            return Resolved(spec, None, f"cannot import {target.partition(':')[0]}: {exc}")
        raise ImplSpecError(f"--impl {spec!r}: cannot import module {target.partition(':')[0]!r}: {exc}") from None
    except ImplSpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a module that crashes on import is the user's to fix
        raise ImplSpecError(f"--impl {spec!r}: importing it raised {type(exc).__name__}: {exc}") from None
    try:
        adapter = _as_adapter(obj, spec, overrides, signature)
    except ImplSpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a constructor that crashes is a usage error, reported in one line
        raise ImplSpecError(f"--impl {spec!r}: constructing the adapter raised {type(exc).__name__}: {exc}") from None
    reason = None
    check = getattr(adapter, "unavailable_reason", None)
    if callable(check):
        reason = check()
    return Resolved(spec, adapter, reason)

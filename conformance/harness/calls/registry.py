"""Resolving ``--impl``: built-in names, ``module:attr``, and third-party entry points.

Accepted forms, tried in this order:

1. a built-in name (``implementations.BUILTINS``) or a name registered by another package in the
   entry-point group ``sdpa_conformance.adapters`` (value ``module:attr``);
2. ``module:attr`` naming an adapter object, an adapter class (instantiated without arguments), or
   a plain function with the signature of ``torch.nn.functional.scaled_dot_product_attention``, or
   of another API named by ``--signature`` (harness.calls.signatures: ``flash-attn``).

Everything is imported lazily: an adapter whose framework is missing is *unavailable* with the
import error as its reason, and only its own tests are skipped.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from conformance.harness.calls import signatures
from conformance.harness.calls.declare import ImplSpecError, _parse_as, expected_phrase, parse_declare

__all__ = [
    "ImplSpecError",
    "Resolved",
    "_parse_as",
    "default_names",
    "expected_phrase",
    "known_names",
    "parse_declare",
    "resolve",
]

ENTRY_POINT_GROUP = "sdpa_conformance.adapters"
FORMS = (
    "a built-in or entry-point name (see --impl-list), "
    "'module:attr' naming an adapter object or class, "
    "or 'module:function' naming a function with the torch SDPA signature"
)


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


def default_names() -> list[str]:
    """The built-ins a run without ``--impl`` certifies: every one but ``implementations.BY_NAME_ONLY``
    (kernels that compile per shape, whose certification is minutes of compiling: named, they run)."""
    from implementations import BUILTINS, BY_NAME_ONLY

    return [name for name in BUILTINS if name not in BY_NAME_ONLY]


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

    ``signature`` (``--signature``, harness.calls.signatures) is the calling convention of a plain function."""
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

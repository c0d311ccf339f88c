"""Library releases: which release of a kernel's library is installed, and whether a release range holds it.

A library's behaviour changes between releases: a bug shipped in one and fixed in the next, a convention
changed on purpose. One expectations file serves every release of a library when each known cause says
the releases it holds for (``versions = ">=3.6,<3.15"``, a PEP 440 specifier set), and one adapter
serves them when its declaration says where a release differs (:func:`for_release`: a table of
overrides keyed by specifier sets). The release is that of the adapter's *library*: the first
distribution its ``measured_with`` names (``{"keras": "3.15.1", "torch": "2.13.0"}``: keras).

``packaging.specifiers`` (which pytest itself requires) does the matching where it is importable; the
few lines of :func:`_fallback` do it otherwise. A leaf module: the contract's neighbour, imported by the
adapters and the harness alike, importing nothing of the project.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from typing import Any

_CLAUSE = re.compile(r"^\s*(~=|===|==|!=|<=|>=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)\s*$")


class ReleaseRangeError(ValueError):
    """A ``versions`` value that is not a PEP 440 specifier set; the message quotes it."""


def installed(dist: str) -> str | None:
    """The installed release of distribution ``dist``, or None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_of(adapter: Any) -> str | None:
    """The distribution an adapter's releases are counted in: the first its ``measured_with`` names."""
    measured = getattr(adapter, "measured_with", None) or {}
    return next(iter(measured), None)


def check(spec: str) -> str:
    """``spec`` when it is a non-empty PEP 440 specifier set (``">=3.6,<3.15"``); ReleaseRangeError otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ReleaseRangeError(f"{spec!r} is not a release range: write a PEP 440 specifier set such as '>=3.6,<3.15'")
    if any(_CLAUSE.match(part) is None for part in spec.split(",")):
        raise ReleaseRangeError(
            f"{spec!r} is not a release range: each comma-separated part is an operator (==, !=, <, <=, >, >=, ~=) "
            "and a release, e.g. '>=3.6,<3.15'"
        )
    return spec


def contains(spec: str, version: str) -> bool:
    """Whether release ``version`` is in the specifier set ``spec``; a local build label (``+cpu``) is
    not a release, and a pre-release counts as its release (a range says which releases, not which tags)."""
    check(spec)
    public = version.split("+")[0]
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - pytest depends on packaging
        return _fallback(spec, public)
    try:
        return SpecifierSet(spec).contains(Version(public), prereleases=True)
    except InvalidVersion:
        return _fallback(spec, public)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:4])


def _fallback(spec: str, version: str) -> bool:
    """The comparisons PEP 440 defines, on the numeric release segment alone (no packaging here)."""
    v = _release(version)
    for part in spec.split(","):
        op, want = _CLAUSE.match(part).groups()  # type: ignore[union-attr] - check() matched it
        if want.endswith(".*"):
            prefix = _release(want[:-2])
            ok = v[: len(prefix)] == prefix
            if (op == "==") != ok:
                return False
            continue
        w = _release(want)
        n = max(len(v), len(w))
        a, b = v + (0,) * (n - len(v)), w + (0,) * (n - len(w))
        if op == "~=":
            ok = a >= b and a[: len(w) - 1] == b[: len(w) - 1]
        else:
            ok = {"==": a == b, "===": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        if not ok:
            return False
    return True


def for_release(table: Mapping[str, Mapping[str, Any]], version: str | None) -> dict[str, Any]:
    """The declaration fields an adapter sets for ``version`` of its library: the union of the entries of
    ``table`` (specifier set -> {field: value}) whose range holds it, later entries winning; none when
    the release is unknown. Why a table and not code: the sweep report reads a convention change off the
    declarations of two releases' certificates, and a reader sees every release's difference in one place."""
    out: dict[str, Any] = {}
    if version is None:
        return out
    for spec, fields in table.items():
        if contains(spec, version):
            out.update(fields)
    return out

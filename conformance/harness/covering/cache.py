"""Covering plans kept on disk between runs, keyed by everything a plan is a function of.

Why: a plan is a pure function of the declaration, t, the profile's number of draws, this package's
source and NumPy's random streams, and building one costs a second or more of CPU (each row is built
and checked for what it hides). A full run plans every adapter and every self-test kernel in every
pytest-xdist worker; the second run in the same ``HOME`` reads them back. The key hashes all of those
inputs, so an edited table or generator never meets an old plan. ``SDPA_CONFORMANCE_PLAN_CACHE=0``
turns it off, a directory chooses where (default ``~/.cache/sdpa-conformance/plans``); a cache that
cannot be read or written is skipped silently, never a failure.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from conformance.contract import Declaration

_SOURCES = (
    "conformance/harness/cases",
    "conformance/harness/covering",
    "conformance/contract.py",
    "conformance/oracle.py",
)


@functools.cache
def _source_digest() -> str:
    root = Path(__file__).resolve().parents[3]
    h = hashlib.sha256(np.__version__.encode())
    for entry in _SOURCES:
        path = root / entry
        for f in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _canonical(decl: Declaration) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(decl):
        v = getattr(decl, f.name)
        out[f.name] = sorted(v) if isinstance(v, frozenset) else v
    return out


def _directory() -> Path | None:
    choice = os.environ.get("SDPA_CONFORMANCE_PLAN_CACHE", "")
    if choice == "0":
        return None
    return Path(choice) if choice else Path.home() / ".cache" / "sdpa-conformance" / "plans"


def key(decl: Declaration, t: int, draws: int) -> str:
    text = json.dumps([_canonical(decl), t, draws, _source_digest()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(k: str) -> dict[str, Any] | None:
    where = _directory()
    if where is None:
        return None
    try:
        return json.loads((where / f"{k}.json").read_text())
    except (OSError, ValueError):
        return None


def store(k: str, data: dict[str, Any]) -> None:
    where = _directory()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=where, delete=False, suffix=".tmp") as fh:
            json.dump(data, fh)
        os.replace(fh.name, where / f"{k}.json")  # atomic: two workers writing the same plan is harmless
    except OSError:
        return


def encode(p: Any) -> dict[str, Any]:
    """A ``covering.Plan`` as JSON: tuples of (parameter, value) pairs become lists."""
    return {
        "t": p.t,
        "defaults": p.defaults,
        "rows": p.rows,
        "picks": p.picks,
        "seeds": p.seeds,
        "admitted": [list(map(list, tup)) for tup in p.admitted],
        "excluded": [[list(map(list, tup)), why] for tup, why in p.excluded.items()],
        "excluded_values": [[pv[0], pv[1], why] for pv, why in p.excluded_values.items()],
    }


def decode(d: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``covering.Plan`` from :func:`encode`'s JSON."""

    def tup(x) -> tuple:
        return tuple((a, b) for a, b in x)

    return {
        "t": d["t"],
        "defaults": d["defaults"],
        "rows": d["rows"],
        "picks": d["picks"],
        "seeds": d["seeds"],
        "admitted": [tup(x) for x in d["admitted"]],
        "excluded": {tup(x): why for x, why in d["excluded"]},
        "excluded_values": {(p, v): why for p, v, why in d["excluded_values"]},
    }

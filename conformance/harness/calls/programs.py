"""Programs: the distinct input structures a kernel was given, and the time its first calls of each took.

Why: a kernel that compiles per shape (XLA's jit, torch.compile, Triton, TVM, inference runtimes)
builds one program for every new structure it meets, and a certification's cost is then (number of
structures) x (time to compile one), not the arithmetic. The suite cannot see inside a compiler, but
it sees every call (``harness.calls.guarded``): :func:`structure` names what a compiler that
specializes on shapes keys a program on (what is called, the dtype, each array's shape, dtype and
strides, the scalar arguments), and :class:`ProgramLog` notes for each guarded call whether its
structure is new *in this process* (a compiled program lives in the process that compiled it) and
how long the call took. The run sums them (``harness.run.programs``) into the summary and the
certificate: the distinct structures, and the share of the kernel's call time spent in first calls.
For a kernel that compiles per shape that share is most of the time; for one that does not, it is
about the share of the calls that were first calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conformance.contract import Case, dtype_name

_ARRAYS = ("query", "key", "value", "mask", "bias", "alibi_slopes", "sinks", "seqlens_q", "seqlens_k")


def _layout(a: np.ndarray) -> str:
    """``C`` for a C-contiguous array, else its strides in elements (0 for a broadcast axis)."""
    if a.flags.c_contiguous:
        return "C"
    item = a.itemsize or 1
    return "(" + ",".join(str(s // item) for s in a.strides) + ")"


def _array(a: Any) -> str:
    arr = np.asarray(a)
    return f"{dtype_name(arr.dtype)}{list(arr.shape)}{_layout(arr)}"


def structure(case: Case, what: str) -> str:
    """The structure of one call: ``what`` (forward, vjp, ...), each array's dtype, shape and
    layout, and the scalar arguments a compiler may specialize on (causal, scale, dropout, window,
    softcap, the KV-cache form). Two calls with one structure can share a compiled program."""
    parts = [what]
    for name in _ARRAYS:
        a = getattr(case, name)
        if a is not None:
            parts.append(f"{name}={_array(a)}")
    scalars = (
        ("causal", case.is_causal),
        ("scale", case.scale),
        ("dropout", case.dropout_p or None),
        ("window", case.window),
        ("softcap", case.softcap or None),
        ("kv", case.kv_form),
    )
    parts += [f"{k}={v}" for k, v in scalars if v not in (None, False)]
    return " ".join(parts)


@dataclass
class ProgramLog:
    """What one guarded adapter's calls met in this process: every structure (``seen``, kept for the
    whole run), and, since the last :meth:`take`, the new structures and the call times."""

    seen: set[str] = field(default_factory=set)
    new: list[str] = field(default_factory=list)
    calls: int = 0
    first_s: float = 0.0  # seconds in calls whose structure was new in this process
    all_s: float = 0.0

    def call(self, case: Case, what: str, fn):
        """``fn()``, timed and noted under the structure of ``case``; returns its result or raises.

        A call that raises is noted too: a compiler that rejects a structure compiled (or traced) it first."""
        key = structure(case, what)
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.note(key, time.perf_counter() - start)

    def note(self, key: str, seconds: float) -> None:
        self.calls += 1
        self.all_s += seconds
        if key not in self.seen:
            self.seen.add(key)
            self.new.append(key)
            self.first_s += seconds

    def take(self) -> dict[str, Any] | None:
        """The record since the last take (JSON-ready), or None when no call was made; then reset."""
        if not self.calls:
            return None
        out = {"new": list(self.new), "calls": self.calls, "first_s": self.first_s, "all_s": self.all_s}
        self.new.clear()
        self.calls, self.first_s, self.all_s = 0, 0.0, 0.0
        return out


def summarize(entry: dict[str, Any] | None) -> dict[str, Any]:
    """The certificate's record of one adapter's merged entry (JSON-ready)."""
    entry = entry or {}
    all_s = float(entry.get("all_s", 0.0))
    first_s = float(entry.get("first_s", 0.0))
    keys = entry.get("keys", set())
    return {
        "distinct": len(keys),
        "forward": sum(1 for k in keys if not k.startswith("vjp ")),
        "backward": sum(1 for k in keys if k.startswith("vjp ")),
        "first_calls": int(entry.get("first_calls", 0)),
        "calls": int(entry.get("calls", 0)),
        "first_s": round(first_s, 3),
        "all_s": round(all_s, 3),
        "first_share": round(first_s / all_s, 4) if all_s > 0 else None,
    }


def sentence(rec: dict[str, Any], compiling: bool | None = None) -> str:
    """One sentence for the summary and the certificate; ``compiling``: what the declaration says of
    ``compiles_per_shape`` (None: not said)."""
    text = {
        True: "Declares compiles_per_shape (the ci profile's shapes come from a few buckets): ",
        False: "Does not declare compiles_per_shape: ",
        None: "",
    }[compiling]
    text += (
        f"{rec['distinct']} distinct structures (shapes, strides, dtypes, scalar arguments) given to the kernel "
        f"({rec['forward']} forward, {rec['backward']} backward) in {rec['calls']} calls; "
        f"{rec['first_calls']} first calls of a structure (one per process)"
    )
    if rec["first_share"] is not None:
        share, first_s, all_s = 100 * rec["first_share"], rec["first_s"], rec["all_s"]
        text += f", {share:.0f} % of the kernel's call time ({first_s:.1f} s of {all_s:.1f} s)"
    return text + ("." if compiling is not None else "")

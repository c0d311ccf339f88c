"""The process state a caller relies on, read before and after every kernel call.

A kernel call may not change what its caller's code depends on besides the result: torch's autograd
mode, default dtype, thread count, deterministic-algorithms flag, matmul precision and anomaly mode;
NumPy's floating-point error handling; and the global random generators (torch's, NumPy's legacy one,
Python's ``random``) when the call asked for no dropout. A kernel that leaves ``torch.set_grad_enabled
(False)`` behind silently turns its caller's training into inference; one that draws from the global
generator without dropout shifts every later random draw of the program.

Read only for the frameworks already imported (``sys.modules``): the suite imports none of them for
this. The guarded call (``harness.calls.guarded``) reads a :class:`Snapshot` before the call and
compares after; a difference fails the running clause with the names of what changed, and the state
is put back so that the rest of the run is not poisoned.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _torch_readers(torch: Any) -> list[tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    readers: list[tuple[str, Callable[[], Any], Callable[[Any], None]]] = [
        ("torch grad mode (torch.is_grad_enabled)", torch.is_grad_enabled, torch.set_grad_enabled),
        ("torch default dtype (torch.get_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
        ("torch thread count (torch.get_num_threads)", torch.get_num_threads, torch.set_num_threads),
        (
            "torch deterministic algorithms (torch.are_deterministic_algorithms_enabled)",
            torch.are_deterministic_algorithms_enabled,
            torch.use_deterministic_algorithms,
        ),
        (
            "torch float32 matmul precision (torch.get_float32_matmul_precision)",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        (
            "torch anomaly mode (torch.is_anomaly_enabled)",
            torch.is_anomaly_enabled,
            torch.set_anomaly_enabled,
        ),
    ]
    return readers


def _readers() -> list[tuple[str, Callable[[], Any], Callable[[Any], None], bool]]:
    """(name, read, restore, is a random generator) for every piece of state of the imported frameworks."""
    out: list[tuple[str, Callable[[], Any], Callable[[Any], None], bool]] = [
        ("Python's global random generator (random.getstate)", random.getstate, random.setstate, True),
    ]
    np = sys.modules.get("numpy")
    if np is not None:
        out.append(("NumPy's floating-point error handling (numpy.geterr)", np.geterr, lambda s: np.seterr(**s), False))
        out.append(
            ("NumPy's global random generator (numpy.random.get_state)", np.random.get_state, np.random.set_state, True)
        )
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "is_grad_enabled"):
        out += [(n, r, w, False) for n, r, w in _torch_readers(torch)]
        out.append(
            ("torch's global random generator (torch.get_rng_state)", torch.get_rng_state, torch.set_rng_state, True)
        )
    return out


def _same(a: Any, b: Any) -> bool:
    if type(a).__name__ == "Tensor":
        return bool(a.shape == b.shape and (a == b).all())
    if isinstance(a, tuple):  # numpy's random state: (name, keys array, pos, has_gauss, cached)
        if len(a) != len(b):
            return False
        try:  # Python's random state: 625 ints, compared at C speed (an array inside raises: compared below)
            return bool(a == b)
        except (ValueError, TypeError, RuntimeError):
            return all(_same(x, y) for x, y in zip(a, b))
    if type(a).__name__ == "ndarray":
        return a.shape == b.shape and bool((a == b).all())
    return a == b


@dataclass
class Snapshot:
    """The process state before a call; :meth:`changes` after it."""

    values: list[tuple[str, Any, Callable[[Any], None], bool]]

    @classmethod
    def take(cls) -> Snapshot:
        return cls([(name, read(), restore, rng) for name, read, restore, rng in _readers()])

    def changes(self, generators: bool) -> list[str]:
        """What differs now, as "name: before -> after" (a generator: "drawn from"), and put it back.
        ``generators``: whether the global random generators are compared (not when the call asked
        for dropout, which draws from them by contract)."""
        found = []
        readers = {n: r for n, r, _, _ in _readers()}
        for name, before, restore, rng in self.values:
            if rng and not generators or name not in readers:
                continue
            now = readers[name]()
            if _same(before, now):
                continue
            found.append(f"{name}: drawn from" if rng else f"{name}: {before!r} -> {now!r}")
            try:
                restore(before)
            except Exception:  # noqa: BLE001 - a state the framework will not take back is still reported
                found[-1] += " (could not be restored)"
        return found

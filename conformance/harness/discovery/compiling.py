"""Discovery's compiling probe: does the kernel compile a program for each new input structure?

A kernel that compiles per shape (XLA's jit, torch.compile, Triton, TVM) spends its first call of a new
shape compiling and its second call of the same shape computing; one that does not takes about as long
for both. The probe calls three shapes no other probe uses (new ones at each discovery), each three
times, and records ``compiles_per_shape = true`` when every first call took at least :data:`FACTOR`
times the faster of the two calls after it and :data:`MIN_EXTRA` seconds more: a pause of a busy machine
would have to fall on all three first calls to fake it, and on both repeats of a shape to hide it. It is
measured, like every field, but it changes no verdict: it decides whether the ci profile takes the
kernel's shapes from a few buckets (``harness.cases.buckets``), which is what makes a compiling kernel's
certification minutes, not hours.
"""

from __future__ import annotations

import itertools
import os
import time

from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probes import base
from conformance.harness.discovery.probing import Probing

FACTOR = 5.0
MIN_EXTRA = 0.05  # seconds: a compilation takes longer (jax ~0.1 s, torch.compile ~0.3 s on a CPU)
# (T, S) that no other probe uses, new at each discovery of the process and unlikely to be in a compilation
# cache on disk (a random start): each first call is a first, also when discovery runs twice.
_NEXT = itertools.count(3 * (int.from_bytes(os.urandom(2), "little") % 64))


def _shapes() -> list[tuple[int, int]]:
    return [(11 + n % 192, 13 + n % 192) for n in (next(_NEXT) for _ in range(3))]


def _timed(p: Probing, case) -> tuple[w.Outcome, float]:
    start = time.perf_counter()
    outcome = p.forward(case)
    return outcome, time.perf_counter() - start


def compiles_per_shape(p: Probing) -> None:
    if p.pinned_here("compiles_per_shape"):
        return
    seen = []
    for i, (T, S) in enumerate(_shapes()):
        case = base(p, 60 + i, T=T, S=S)
        calls = [_timed(p, case) for _ in range(3)]
        failed = next((o.error for o, _ in calls if not o.ok), None)
        if failed:
            p.keep("compiles_per_shape", f"T={T} S={S} could not run: {failed}")
            return
        t1, t2 = calls[0][1], min(t for _, t in calls[1:])
        seen.append((T, S, t1, t2, t1 >= FACTOR * t2 and t1 - t2 >= MIN_EXTRA))
    slow = sum(s[-1] for s in seen)
    times = "; ".join(f"T={T} S={S}: first call {1e3 * t1:.1f} ms, then {1e3 * t2:.1f} ms" for T, S, t1, t2, _ in seen)
    rule = f"first >= {FACTOR:g} x second and {1e3 * MIN_EXTRA:.0f} ms more"
    p.record("compiles_per_shape", slow == len(seen), f"{times} ({rule}: {slow} of {len(seen)} new shapes)")

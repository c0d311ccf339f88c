"""Latency of one fixed-shape call: first call apart, then quantiles over enough repetitions.

The seed asks for this order (003_648455d5abd16778.txt, 工程实现: "第一次 CUDA 调用包含初始化和编译开销，
应预热后再统计分位数"): the first call of a shape (lazy initialisation, XLA/JIT compilation, autotuning)
is timed and reported on its own, never mixed into the distribution; then the call is repeated
until the time budget of the row is spent or ``max_reps`` is reached, and p50 / p90 / p99 are read
from the samples. A quantile from too few samples is not a measurement of that quantile: p99 needs
at least 100 samples, p90 at least 10, and a row reports which of its quantiles are backed.
Stability is judged by the p50 of the first and second half of the samples (they must agree within
``STABLE_REL``); on a shared machine a row can be unstable, and it says so rather than pretending.

Each sample is wall time (``time.perf_counter``) around a call that returns only when its result
is complete: adapters synchronise in ``run`` (CUDA, jax's ``block_until_ready``), and an adapter can
instead provide device timestamps (``device_times``, e.g. CUDA events after synchronisation),
which are used when present.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

STABLE_REL = 0.10
MIN_SAMPLES = {"p50": 1, "p90": 10, "p99": 100}


@dataclass
class Timing:
    first_s: float | None  # the first call of the shape, on its own
    samples: list[float] = field(default_factory=list)
    source: str = "perf_counter around a synchronised call"

    @property
    def n(self) -> int:
        return len(self.samples)

    def quantile(self, q: float) -> float | None:
        if not self.samples:
            return None
        return float(np.percentile(np.asarray(self.samples), q))

    def backed(self) -> list[str]:
        """Quantiles the sample count supports (p99 needs >= 100 samples)."""
        return [name for name, need in MIN_SAMPLES.items() if self.n >= need]

    def half_spread(self) -> float | None:
        """|p50(first half) - p50(second half)| / p50(all): how much the middle moved during the row."""
        if self.n < 6:
            return None
        a, b = np.asarray(self.samples[: self.n // 2]), np.asarray(self.samples[self.n // 2 :])
        mid = float(np.median(self.samples))
        return abs(float(np.median(a)) - float(np.median(b))) / mid if mid > 0 else None

    def summary(self) -> dict:
        spread = self.half_spread()
        return {
            "first_call_s": self.first_s,
            "p50_s": self.quantile(50),
            "p90_s": self.quantile(90),
            "p99_s": self.quantile(99),
            "min_s": min(self.samples) if self.samples else None,
            "n": self.n,
            "quantiles_backed": self.backed(),
            "half_spread": spread,
            "stable": spread is not None and spread <= STABLE_REL,
            "source": self.source,
        }

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Budget:
    seconds: float = 1.0  # repetitions stop once this much time was spent (after min_reps)
    min_reps: int = 3
    max_reps: int = 200


def first_call(call: Callable[[], Any]) -> tuple[Any, float]:
    """The result of the first call of a shape and its time, on their own."""
    t0 = time.perf_counter()
    result = call()
    return result, time.perf_counter() - t0


def repeat(
    call: Callable[[], Any],
    budget: Budget,
    device_times: Callable[[int], list[float]] | None = None,
    first_s: float | None = None,
) -> Timing:
    """Time ``call`` repeatedly within ``budget``, after its first call: timed here on its own
    unless the caller made it already (``first_s``, from :func:`first_call`)."""
    if first_s is None:
        _, first_s = first_call(call)
    first = first_s
    timing = Timing(first)
    if device_times is not None:
        # Device timestamps come in batches: size them from the first call, then keep to the budget.
        guess = max(budget.min_reps, min(budget.max_reps, int(budget.seconds / max(first, 1e-6))))
        timing.samples = [float(s) for s in device_times(guess)]
        timing.source = "device timestamps provided by the adapter (device_times)"
        return timing
    spent = 0.0
    while timing.n < budget.max_reps and (timing.n < budget.min_reps or spent < budget.seconds):
        t = time.perf_counter()
        call()
        dt = time.perf_counter() - t
        timing.samples.append(dt)
        spent += dt
    return timing

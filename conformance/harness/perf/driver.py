"""How the profile calls a kernel: on device-resident inputs when the adapter can, else ``forward``.

The optional half of the contract (conformance/contract.py, "Optional, for the performance
profile") splits a call in two so that host <-> device copies are not timed:

    prepare(case) -> handle             # inputs converted and placed on the device, once
    run(handle) -> result               # the kernel alone; returns when the result is complete
    fetch(result) -> np.ndarray         # back to NumPy (for the correctness check; not timed)
    prepare_backward(case, grad_out) -> handle ; run_backward(handle) -> grads   # forward + backward
    device_times(handle, n, backward=False) -> list[float]   # device timestamps, e.g. CUDA events

An adapter without them is timed through ``forward`` / ``vjp``, and the row says that the figure
includes whatever conversions and copies the adapter makes on every call. Which framework the
kernel runs in (for the two-GEMM floor and for the memory reading) is the adapter's ``framework``
attribute when it has one, else inferred from the modules its class's module imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.contract import Case

FRAMEWORKS = ("numpy", "torch", "jax")
MODE_SPLIT = "prepare/run (device-resident inputs; copies not timed)"
MODE_FORWARD = "forward() (no prepare/run split: the adapter's per-call conversions and copies are included)"


def framework_of(adapter: Any) -> str:
    declared = getattr(adapter, "framework", None)
    if declared in FRAMEWORKS:
        return str(declared)
    module = sys.modules.get(type(adapter).__module__)
    names = {getattr(v, "__name__", "").partition(".")[0] for v in vars(module).values()} if module else set()
    for fw in ("torch", "jax"):
        if fw in names:
            return fw
    return "numpy"


class Driver:
    """Forward (and backward) calls of one case, split into prepare/run when the adapter allows."""

    def __init__(self, adapter: Any, case: Case, grad_out: np.ndarray | None = None) -> None:
        self.adapter, self.case, self.grad_out = adapter, case, grad_out
        self.split = callable(getattr(adapter, "prepare", None)) and callable(getattr(adapter, "run", None))
        self.mode = MODE_SPLIT if self.split else MODE_FORWARD
        self._handle: Any = adapter.prepare(case) if self.split else None
        self._bhandle: Any = None

    # -- forward --------------------------------------------------------------------------------
    def forward(self) -> Any:
        return self.adapter.run(self._handle) if self.split else self.adapter.forward(self.case)

    def output(self, result: Any) -> np.ndarray:
        if not self.split:
            return np.asarray(result)
        fetch = getattr(self.adapter, "fetch", None)
        return np.asarray(fetch(result) if callable(fetch) else result)

    def device_times(self, backward: bool = False) -> Callable[[int], list[float]] | None:
        fn = getattr(self.adapter, "device_times", None)
        if not (self.split and callable(fn)):
            return None
        handle = self._backward_handle() if backward else self._handle
        return lambda n: fn(handle, n, backward=backward)

    # -- backward -------------------------------------------------------------------------------
    def backward_split(self) -> bool:
        return self.split and callable(getattr(self.adapter, "prepare_backward", None))

    def _backward_handle(self) -> Any:
        if self._bhandle is None:
            self._bhandle = self.adapter.prepare_backward(self.case, self.grad_out)
        return self._bhandle

    def backward(self) -> Any:
        """Forward + backward: ``run_backward`` on prepared inputs, else the adapter's ``vjp``."""
        if self.backward_split():
            return self.adapter.run_backward(self._backward_handle())
        return self.adapter.vjp(self.case, self.grad_out)

    def backward_mode(self) -> str:
        if self.backward_split():
            return "prepare_backward/run_backward (device-resident inputs; copies not timed)"
        return "vjp() (forward recomputed inside; the adapter's per-call conversions and copies are included)"

    def release(self) -> None:
        self._handle = self._bhandle = None


def kernel_report(adapter: Any, case: Case) -> tuple[str | None, str]:
    """(backend, evidence) from the adapter's ``kernel_ran``; (None, why) when it cannot say."""
    fn = getattr(adapter, "kernel_ran", None)
    if not callable(fn):
        return None, "the adapter does not report which kernel ran (no kernel_ran)"
    try:
        got = fn(case)
    except Exception as exc:  # noqa: BLE001 - a report that fails is recorded, not fatal
        return None, f"kernel_ran raised {type(exc).__name__}: {exc}"
    if not (isinstance(got, tuple) and len(got) == 2):
        return None, f"kernel_ran returned {type(got).__name__}, not (backend, evidence)"
    backend, evidence = got
    return (None if backend is None else str(backend)), str(evidence)

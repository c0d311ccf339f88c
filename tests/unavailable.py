"""A kernel that is never available here, the way a CUDA-only built-in is on a machine without CUDA:
it loads, and says why it cannot run (tests/test_matrix.py lists it apart, with its reason). Unlike a
real CUDA built-in, it stays unavailable on every machine and imports no framework."""

from __future__ import annotations

from tests.mutants import BaseKernel

REASON = "needs a device this machine lacks (a self-test kernel that is never available)"


class NoDevice(BaseKernel):
    def __init__(self):
        super().__init__("no-device")

    def unavailable_reason(self) -> str:
        return REASON

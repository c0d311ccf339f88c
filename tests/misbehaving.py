"""Adapters that misbehave in the ways a conformance suite meets in the wild, for tests/test_self_defense.py.

Each is correct (the self-test base kernel) except on the worked example of 003 (query [1,1,1,2],
keys [1,1,2,2]), so a run over several clause modules shows that exactly the running clause fails,
with a message naming the misbehaviour, while the others pass. Use as ``--impl=tests.misbehaving:NAME``.
"""

from __future__ import annotations

import time

import numpy as np

from conformance.contract import Case
from tests.mutants import BaseKernel


def is_trigger(case: Case) -> bool:
    return case.query.shape == (1, 1, 1, 2) and case.key.shape == (1, 1, 2, 2)


class _Misbehaving(BaseKernel):
    def __init__(self):
        super().__init__(type(self).__name__)

    def forward(self, case: Case):
        out = super().forward(case)
        return self.misbehave(case, out) if is_trigger(case) else out

    def misbehave(self, case: Case, out: np.ndarray):  # pragma: no cover - overridden
        return out


class Raises(_Misbehaving):
    def misbehave(self, case, out):
        raise RuntimeError("kernel exploded on purpose")


class WrongShape(_Misbehaving):
    def misbehave(self, case, out):
        return out[..., :1].copy()


class WrongDtype(_Misbehaving):
    def misbehave(self, case, out):
        return out.astype(np.float64) if case.dtype != "float64" else out.astype(np.float32)


class WrongType(_Misbehaving):
    def misbehave(self, case, out):
        return out.tolist()


class NonFinite(_Misbehaving):
    def misbehave(self, case, out):
        return np.full_like(out, np.nan)


class Hangs(_Misbehaving):
    """Sleeps 30 s on the float32 worked example only; every other call is immediate."""

    def misbehave(self, case, out):
        if case.dtype == "float32":
            time.sleep(30)
        return out


class Spins(_Misbehaving):
    """Loops in Python for 30 s on the float32 worked example (no system call for an alarm to
    interrupt): the timeout must still cut it off on the caller's thread."""

    def misbehave(self, case, out):
        if case.dtype == "float32":
            end = time.monotonic() + 30
            while time.monotonic() < end:
                pass
        return out


class ModifiesInput(_Misbehaving):
    def misbehave(self, case, out):
        case.query[...] = 0  # the "scale q in place" shortcut, applied to the caller's array
        return out


class ReturnsView(_Misbehaving):
    def misbehave(self, case, out):
        return case.value[:, :, :1, :]  # right shape and dtype, but the caller's own memory


class SilencesNumpy(_Misbehaving):
    """Silences NumPy's floating-point errors for its own arithmetic and leaves them silenced."""

    def misbehave(self, case, out):
        np.seterr(all="ignore")
        return out


class DrawsGlobalRandom(_Misbehaving):
    """Draws from NumPy's global generator without dropout (a random tie-break), shifting the caller's draws."""

    def misbehave(self, case, out):
        np.random.random()
        return out


class RewritesEarlierResult(_Misbehaving):
    """Writes into the result it returned on the call before (its output buffer, handed out again)."""

    def __init__(self):
        super().__init__()
        self._last = None

    def forward(self, case: Case):
        out = super().forward(case)
        if is_trigger(case) and self._last is not None:
            self._last[...] = 0
        self._last = out
        return out


class LeaksState(BaseKernel):
    """Returns the previous call's output whenever the shape repeats: state carried between calls."""

    def __init__(self):
        super().__init__("LeaksState")
        self._last: dict = {}

    def forward(self, case):
        key = (case.query.shape, case.key.shape, case.value.shape, case.dtype)
        out = self._last.get(key)
        if out is None:
            out = super().forward(case)
        self._last[key] = out
        return out.copy()

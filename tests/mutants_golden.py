"""Mutants for the golden clause (GOLDEN-01) and the regression baselines.

``output_drift_1e-3`` is the drift a new library release or GPU can bring without breaking any
identity the other clauses test: every output element grows by one part in a thousand.
``gqa_grad_first_head_only`` is a GQA backward that takes dK/dV from the first query head of each
group instead of summing the group: forward is right, and only a gradient check on a GQA case
sees it. ``causal_bottom_right_undeclared`` aligns causal masks bottom-right while declaring
top-left, the FlashAttention convention slipping into a kernel that promises torch's.
"""

from __future__ import annotations

import numpy as np

from tests.mutants import BaseKernel, mutant


@mutant("output_drift_1e-3")
class OutputDrift(BaseKernel):
    def finish(self, out, case):
        return super().finish(out * (1.0 + 1e-3), case)


@mutant("gqa_grad_first_head_only")
class GqaGradFirstHeadOnly(BaseKernel):
    def vjp(self, case, grad_out):
        if not case.is_gqa:
            return super().vjp(case, grad_out)
        g = case.Hq // case.Hkv
        wide = case.replace(key=np.repeat(case.key, g, axis=1), value=np.repeat(case.value, g, axis=1))
        dq, dk, dv = super().vjp(wide, grad_out)
        return dq, np.ascontiguousarray(dk[:, ::g] * g), np.ascontiguousarray(dv[:, ::g] * g)


@mutant("causal_bottom_right_undeclared")
class CausalBottomRightUndeclared(BaseKernel):
    def causal(self, T, S):
        i = np.arange(T)[:, None]
        j = np.arange(S)[None, :]
        return j > i + (S - T)

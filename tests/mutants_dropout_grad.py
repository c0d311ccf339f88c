"""Mutants of the backward pass under dropout (DROPOUT-GRAD-01).

Each keeps :class:`tests.mutants_features.DropoutKernel`'s forward, which is correct, and breaks one
step of its backward the way fused kernels have: the forward clauses cannot see any of them, and the
gradient clauses run without dropout. With W = P * Z (Z = keep / (1 - p)) and dW = dO V^T, the
correct backward is dV = W^T dO, dP = Z * dW, D = rowsum(P * dP) = rowsum(dO * O), dS = P * (dP - D).
"""

from __future__ import annotations

import numpy as np

from tests.mutants import mutant
from tests.mutants_features import DropoutKernel


@mutant("grad_dropout_ignored")
class GradDropoutIgnored(DropoutKernel):
    """The backward recomputes P and never applies the mask: the undropped gradient."""

    def backward_keep_scale(self, case):
        return np.ones(case.weights_shape)


@mutant("grad_dropout_fresh_mask")
class GradDropoutFreshMask(DropoutKernel):
    """The backward regenerates the mask from an RNG offset that moved since the forward (seed + 1):
    a correct gradient of some other dropped forward."""

    def backward_keep_scale(self, case):
        return self.factor(case.replace(seed=case.seed + 1))


@mutant("grad_dropout_no_rescale")
class GradDropoutNoRescale(DropoutKernel):
    """The backward applies the keep mask but forgets 1/(1 - p) (the forward has it)."""

    def backward_keep_scale(self, case):
        return self.keep(case).astype(np.float64)


@mutant("grad_dropout_mask_dv_only")
class GradDropoutMaskDvOnly(DropoutKernel):
    """dV uses the dropped weights, but dS is the undropped softmax gradient (mask not applied to dP)."""

    def dropout_score_grad(self, p, z, dw):
        return p * (dw - (p * dw).sum(axis=-1, keepdims=True))


@mutant("grad_dropout_delta_undropped")
class GradDropoutDeltaUndropped(DropoutKernel):
    """D = rowsum(dO * O) taken from the undropped output (rowsum(P * dW) instead of rowsum(P * Z * dW))."""

    def dropout_score_grad(self, p, z, dw):
        return p * (dw * z - (p * dw).sum(axis=-1, keepdims=True))


@mutant("grad_dropout_delta_double_scaled")
class GradDropoutDeltaDoubleScaled(DropoutKernel):
    """D = rowsum(W * dP): the dropped weights times the already masked and rescaled dP (Z applied twice)."""

    def dropout_score_grad(self, p, z, dw):
        dp = dw * z
        return p * (dp - (p * z * dp).sum(axis=-1, keepdims=True))


@mutant("grad_dropout_jacobian_dropped_p")
class GradDropoutJacobianDroppedP(DropoutKernel):
    """dS = W * (dP - D): the dropped weights as the softmax Jacobian's outer factor instead of P."""

    def dropout_score_grad(self, p, z, dw):
        dp = dw * z
        return p * z * (dp - (p * dp).sum(axis=-1, keepdims=True))

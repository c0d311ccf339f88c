"""Observing attention weights through the output alone.

Fused kernels (SDPA, FlashAttention, cuDNN) return no weights, yet the weight clauses (shape, row
sums, masking, all-blocked rows) must hold for them. Feeding ``V = I`` makes the output *be* the
weights: ``out[..., t, :] = sum_j w[t, j] e_j = w[t, :]``. Each output element is a single product
``w * 1`` plus exact zeros, so the only error the probe adds is the final rounding to the working
dtype. V is widened with zero columns to a multiple of 8 because several fused kernels accept only
such head dims; those columns must come back as zeros too, and are checked.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, np_dtype
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.spec.report import ClauseViolation


def identity_value(case: Case) -> np.ndarray:
    S = case.S
    width = max(8, -(-S // 8) * 8)
    eye = np.zeros((S, width))
    eye[np.arange(S), np.arange(S)] = 1.0
    v = np.broadcast_to(eye, (case.B, case.Hkv, S, width))
    return np.ascontiguousarray(v).astype(np_dtype(case.dtype))


def probe_case(case: Case, square: bool = False) -> Case:
    """``case`` with V replaced by the (widened) identity.

    ``square`` serves kernels that require Dk == Dv: Q and K are widened with zero columns (which
    leave every q.k unchanged) and the original 1/sqrt(Dk) is passed as an explicit scale.
    """
    v = identity_value(case)
    changes: dict = {"value": v, "label": (case.label + " V=I probe").strip()}
    width = v.shape[-1]
    if square and case.Dk != width:
        if case.Dk > width:
            v = np.zeros(v.shape[:-1] + (case.Dk,), dtype=v.dtype)
            v[..., :width] = identity_value(case)
            changes["value"] = v
        else:
            pad = [(0, 0)] * 3 + [(0, width - case.Dk)]
            changes["query"] = np.pad(case.query, pad)
            changes["key"] = np.pad(case.key, pad)
            changes["scale"] = case.effective_scale
    return case.replace(**changes)


def observe_weights(impl: GuardedAdapter, case: Case) -> np.ndarray:
    """The kernel's attention weights for ``case`` as float64 ``[B, Hq, T, S]``.

    Uses the kernel's own weights when it declares it returns them, and the ``V = I`` probe
    otherwise. A probe output whose padding columns are not zero is itself a violation (the kernel
    mixed value columns), reported as such.
    """
    if impl.declaration.returns_weights:
        _, w = impl.forward_with_weights(case)
        return np.asarray(w, dtype=np.float64)
    probe = probe_case(case, square=impl.declaration.requires_dk_eq_dv)
    out = np.asarray(impl.forward(probe), dtype=np.float64)
    check_padding(out, case.S, probe)
    return out[..., : case.S]


def check_padding(out: np.ndarray, S: int, probe: Case) -> None:
    """The probe's columns beyond S are exactly 0, on every row, whatever the weights are.

    They are ``sum_j w[t, j] * 0``: anything else (a number, inf, NaN) means the kernel mixed value
    columns or produced garbage where it had nothing to add. The one exception is a row whose
    weight columns are all NaN too (a declared ``nan`` fill for an all-blocked row): there every
    column is NaN, and the clause judges that row's weights against the declaration.
    """
    pad = out[..., S:]
    nan_rows = np.isnan(out[..., :S]).all(axis=-1, keepdims=True)
    bad = (pad != 0) & ~(nan_rows & np.isnan(pad))  # NaN != 0, so NaN counts as bad outside NaN rows
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        kinds = {"NaN": int(np.isnan(pad[bad]).sum()), "inf": int(np.isinf(pad[bad]).sum())}
        kinds["nonzero finite"] = int(bad.sum()) - kinds["NaN"] - kinds["inf"]
        what = ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
        at = list(idx[:-1]) + [idx[-1] + S]
        raise ClauseViolation(
            f"with V = identity (zero-padded to width {out.shape[-1]}), output columns beyond S={S} must be exactly 0; "
            f"{int(bad.sum())} of {pad.size} are not ({what}); first at {at}: {out[tuple(at)]!r}",
            probe,
        )

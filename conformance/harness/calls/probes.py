"""Observing attention weights through the output alone.

Fused kernels (SDPA, FlashAttention, cuDNN) return no weights, yet the weight clauses (shape, row
sums, masking, all-blocked rows) must hold for them. Feeding ``V = I`` makes the output *be* the
weights: ``out[..., t, :] = sum_j w[t, j] e_j = w[t, :]``. Each output element is a single product
``w * 1`` plus exact zeros, so the only error the probe adds is the final rounding to the working
dtype. V is widened with zero columns to a multiple of 8 because several fused kernels accept only
such head dims; those columns must come back as zeros too, and are checked.

A probe uses no capability beyond what the case itself uses: a clause about dropout must not become
not applicable because its probe needed something else of the kernel. A kernel that requires
Dk == Dv gets Q and K widened with zero columns to V's width W, which changes the default scale
from 1/sqrt(Dk) to 1/sqrt(W); instead of passing the old scale explicitly (a kernel without a scale
argument refuses that), W is chosen as Dk * 4^m and Q, K are multiplied by 2^ceil(m/2), 2^floor(m/2),
so that every score, scale included, is the original one bit for bit (powers of two scale exactly;
sqrt(Dk * 4^m) = 2^m sqrt(Dk) exactly). Only when that W exceeds the declared head-dim limit (or
the scaled inputs would overflow the dtype) does the probe pass the scale, and when the kernel has
no scale argument either, the weights are observed in blocks of Dk keys, one call per block, with
V the identity on that block's keys: exact again, and still nothing the kernel does not take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.contract import Case, Declaration, np_dtype
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.spec.report import ClauseViolation


@dataclass(frozen=True)
class Probe:
    """One call of a V = I probe: its output columns ``0 .. keys-1`` are the weights of keys
    ``first .. first+keys-1``; the columns past ``keys`` must be exactly 0."""

    case: Case
    first: int
    keys: int


def _width(S: int) -> int:
    return max(8, -(-S // 8) * 8)


def identity_value(case: Case, width: int | None = None, first: int = 0, keys: int | None = None) -> np.ndarray:
    """``[B, Hkv, S, width]``: 1 at (key ``first + i``, column ``i``) for ``i < keys``, 0 elsewhere."""
    S = case.S
    keys = S - first if keys is None else keys
    width = _width(S) if width is None else width
    eye = np.zeros((S, width))
    eye[first + np.arange(keys), np.arange(keys)] = 1.0
    v = np.broadcast_to(eye, (case.B, case.Hkv, S, width))
    return np.ascontiguousarray(v).astype(np_dtype(case.dtype))


def _label(case: Case, what: str = "V=I probe") -> str:
    return (case.label + " " + what).strip()


def _exact_widening(case: Case, width: int, limit: int | None) -> Case | None:
    """Q and K zero-padded to W = Dk * 4^m >= ``width`` and scaled by powers of two so that the default
    scale 1/sqrt(W) gives the original scores exactly; None when W exceeds ``limit`` or the scaled
    inputs overflow the dtype."""
    m, W = 0, case.Dk
    while W < width:
        m, W = m + 1, W * 4
    if limit is not None and W > limit:
        return None
    dt = np_dtype(case.dtype)
    pad = [(0, 0)] * 3 + [(0, W - case.Dk)]
    with np.errstate(over="ignore"):
        q = (np.asarray(case.query, dtype=np.float64) * 2.0 ** -(-m // 2)).astype(dt)
        k = (np.asarray(case.key, dtype=np.float64) * 2.0 ** (m // 2)).astype(dt)
    if not (np.isfinite(q.astype(np.float64)).all() and np.isfinite(k.astype(np.float64)).all()):
        return None
    return case.replace(query=np.pad(q, pad), key=np.pad(k, pad), value=identity_value(case, W), label=_label(case))


def probes(case: Case, decl: Declaration | None = None) -> list[Probe]:
    """The calls that observe the weights of ``case`` with ``V = I`` (see the module docstring);
    ``decl`` None: a kernel that takes any head dims."""
    width = _width(case.S)
    whole = [Probe(case.replace(value=identity_value(case), label=_label(case)), 0, case.S)]
    if decl is None or not decl.requires_dk_eq_dv or case.Dk == width:
        return whole
    if case.Dk > width:
        return [Probe(case.replace(value=identity_value(case, case.Dk), label=_label(case)), 0, case.S)]
    if case.scale is not None:  # the case passes a scale already: padding Q and K keeps every q.k
        pad = [(0, 0)] * 3 + [(0, width - case.Dk)]
        return [Probe(whole[0].case.replace(query=np.pad(case.query, pad), key=np.pad(case.key, pad)), 0, case.S)]
    exact = _exact_widening(case, width, decl.max_head_dim)
    if exact is not None:
        return [Probe(exact, 0, case.S)]
    if decl.custom_scale:
        pad = [(0, 0)] * 3 + [(0, width - case.Dk)]
        widened = whole[0].case.replace(query=np.pad(case.query, pad), key=np.pad(case.key, pad))
        return [Probe(widened.replace(scale=case.effective_scale), 0, case.S)]
    blocks = []
    for first in range(0, case.S, case.Dk):
        n = min(case.Dk, case.S - first)
        v = identity_value(case, case.Dk, first, n)
        blocks.append(
            Probe(case.replace(value=v, label=_label(case, f"V=I probe, keys {first}..{first + n - 1}")), first, n)
        )
    return blocks


def probe_case(case: Case, decl: Declaration | None = None) -> Case:
    """The one call that observes the weights of ``case`` (``probes``); a kernel whose probe takes
    several calls (see the module docstring) gets the first block's, which the caller must notice
    from ``len(probes(case, decl))``."""
    return probes(case, decl)[0].case


def observe_weights(impl: GuardedAdapter, case: Case) -> np.ndarray:
    """The kernel's attention weights for ``case`` as float64 ``[B, Hq, T, S]``.

    Uses the kernel's own weights when it declares it returns them, and the ``V = I`` probe
    otherwise. A probe output whose padding columns are not zero is itself a violation (the kernel
    mixed value columns), reported as such.
    """
    if impl.declaration.returns_weights:
        _, w = impl.forward_with_weights(case)
        return np.asarray(w, dtype=np.float64)
    parts = []
    for p in probes(case, impl.declaration):
        out = np.asarray(impl.forward(p.case), dtype=np.float64)
        check_padding(out, p.keys, p.case)
        parts.append(out[..., : p.keys])
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)


def check_padding(out: np.ndarray, S: int, probe: Case) -> None:
    """The probe's columns beyond the ``S`` weight columns are exactly 0, on every row, whatever the weights are.

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

"""The oracle's answer for a case and how far a kernel's answer may be from it, computed once.

The oracle's answer depends on the case *and* on the declared conventions (all-blocked policy,
causal alignment); both are part of the cache key, and so is the rule dtype. Caching matters
because many clauses (and every adapter in a matrix run) ask the same case: the float64 forward,
the same-precision ensemble (``harness.judge.ensemble``) and the first-order bound (``harness.judge.tolerance``)
are computed once per case per process.

The allowances are functions of the *case* (and declaration), never of the kernel's answer:
:func:`output_allowance`, :func:`weights_allowance` and :func:`grad_allowance` give them per
element for clauses that compare something other than a plain output (sums, differences of two
outputs, dropout-scaled weights). The assertions that use them are ``harness.judge.compare``'s.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from conformance import oracle, oracle_formulations, oracle_variants
from conformance.contract import Case, Declaration, aliases
from conformance.harness.calls.probes import probe_case
from conformance.harness.judge import ensemble, formulation_error, tolerance

_DEFAULT = Declaration()
_CACHE: OrderedDict[tuple, object] = OrderedDict()
_CACHE_SIZE = 512


def case_key(case: Case) -> str:
    """A digest of everything in ``case`` the oracle reads, kept on the case: a case is asked for its
    oracle, ensemble, bounds and allowances several times (a covering row about seven), and hashing
    its arrays each time was a seventh of a covering clause's time. A Case is frozen and its arrays
    are not written after it is built (a kernel that writes them fails the guarded call)."""
    memo = case.__dict__.get("_oracle_key")
    if memo is None:
        memo = _case_digest(case)
        object.__setattr__(case, "_oracle_key", memo)
    return memo


def _case_digest(case: Case) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in (case.query, case.key, case.value, case.mask, case.bias):
        if a is None:
            h.update(b"-")
        else:
            a = np.ascontiguousarray(a)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
    h.update(repr((case.is_causal, case.scale, case.dropout_p)).encode())
    if case.has_variant:
        slopes = None if case.alibi_slopes is None else np.asarray(case.alibi_slopes, dtype=np.float64)
        lens = [None if x is None else np.asarray(x).tolist() for x in (case.seqlens_q, case.seqlens_k)]
        sinks = None if case.sinks is None else np.asarray(case.sinks, dtype=np.float64).tolist()
        h.update(repr((case.window, case.softcap, None if slopes is None else slopes.tolist(), lens, sinks)).encode())
    return h.hexdigest()


def formulation(case: Case, decl: Declaration) -> oracle_formulations.Formulation | None:
    """The formulation ``decl`` declares for ``case`` (None: the spec's oracle and error model judge it)."""
    return oracle_formulations.formulation(case, decl)


def _cached(kind: str, case: Case, decl: Declaration, compute, spec: bool = False):
    """``compute()`` cached per case and the declaration's conventions (``spec``: the spec's
    formulation even where ``decl`` declares another: the ensemble's reference)."""
    f = None if spec else formulation(case, decl)
    key = (kind, case_key(case), decl.all_blocked_policy(case), decl.causal_alignment, decl.tolerance_dtype(case))
    key += (f.key() + (decl.all_blocked, decl.all_blocked_float_mask, decl.masks_combined),) if f else ()
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = compute()
    _CACHE[key] = value
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def _conventions(case: Case, decl: Declaration) -> dict:
    return {"all_blocked": decl.all_blocked_policy(case), "causal_alignment": decl.causal_alignment}


def _work_dtype(case: Case, decl: Declaration) -> str | None:
    return "float32" if decl.tolerance_dtype(case) == "float32" else None


def expected(case: Case, decl: Declaration) -> oracle.Forward:
    """The oracle's forward for ``case`` under ``decl``'s conventions (a variant case: the variant
    oracle's, whose result also carries the lse; a declared formulation: the oracle re-run under it)."""
    f = formulation(case, decl)
    if f is not None and f.changes_oracle:
        return _cached("ffwd", case, decl, lambda: oracle_formulations.forward(case, f, decl))
    return _spec_expected(case, decl)


def _spec_expected(case: Case, decl: Declaration) -> oracle.Forward:
    fwd = oracle_variants.forward if case.has_variant else oracle.forward
    return _cached("fwd", case, decl, lambda: fwd(case, **_conventions(case, decl)), spec=True)


def _lowered(case: Case, decl: Declaration) -> Case:
    """A variant case's allowances are those of the base case that means the same in float64
    (oracle_variants.lower: window -> mask, ALiBi and the softcap's change of each score -> bias);
    the model is then conservative where a kernel keeps ALiBi or the cap in float32."""
    return oracle_variants.lower(case, decl.causal_alignment)


def _row_model(case: Case, decl: Declaration) -> tolerance.RowModel:
    def compute():
        f = formulation(case, decl)
        if f is None:
            prec = tolerance.precision(case.dtype, decl.tolerance_dtype(case))
            return tolerance.row_model(case, expected(case, decl), prec)
        prec = formulation_error.precision(case, decl, f)
        err, size = formulation_error.score_error(case, decl, f, prec)
        return tolerance.row_model(case, expected(case, decl), prec, err, size)

    return _cached("rows", case, decl, compute)


def _output_bound(case: Case, decl: Declaration) -> np.ndarray:
    return _cached(
        "obound", case, decl, lambda: tolerance.forward_bound(case, expected(case, decl), _row_model(case, decl))
    )


def output_allowance(case: Case, decl: Declaration | None = None) -> np.ndarray:
    """Per-element allowance for the output of ``case``: max(first-order bound, 2 x ensemble spread)."""
    decl = decl or _DEFAULT
    if case.has_variant:
        return output_allowance(_lowered(case, decl), decl)

    def compute():
        members = ensemble.forward_members(case, work_dtype=_work_dtype(case, decl), **_conventions(case, decl))
        spread = tolerance.ensemble_error(list(members.values()), _spec_expected(case, decl).out)
        return tolerance.combine(_output_bound(case, decl), spread)

    return _cached("oallow", case, decl, compute)


def weights_allowance(case: Case, decl: Declaration | None = None) -> np.ndarray:
    """Per-element allowance for the weights of ``case`` as observed (own weights or the V = I probe)."""
    decl = decl or _DEFAULT
    if case.has_variant:
        return weights_allowance(_lowered(case, decl), decl)

    def compute():
        probe = probe_case(case)
        members = ensemble.forward_members(probe, work_dtype=_work_dtype(case, decl), **_conventions(case, decl))
        want = _spec_expected(case, decl).weights
        spread = tolerance.ensemble_error([m[..., : case.S] for m in members.values()], want)
        return tolerance.combine(tolerance.weights_bound(_row_model(case, decl)), spread)

    return _cached("wallow", case, decl, compute)


def grad_allowance(
    case: Case, grad_out: np.ndarray, decl: Declaration | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element allowances for (dQ, dK, dV) of ``case`` with cotangent ``grad_out``."""
    decl = decl or _DEFAULT
    if case.has_variant:
        return grad_allowance(_lowered_for_grad(case, decl), grad_out, decl)

    def compute():
        fwd = expected(case, decl)
        want = _spec_vjp(case, grad_out, decl)
        bounds = tolerance.grad_bound(case, fwd, _row_model(case, decl), _output_bound(case, decl), grad_out)
        members = ensemble.backward_members(
            case, grad_out, work_dtype=_work_dtype(case, decl), **_conventions(case, decl)
        )
        return tuple(
            tolerance.combine(b, tolerance.ensemble_error([m[i] for m in members.values()], want[i]))
            for i, b in enumerate(bounds)
        )

    return _cached("gallow:" + _digest(grad_out), case, decl, compute)


def _lowered_for_grad(case: Case, decl: Declaration) -> Case:
    """Window and ALiBi do not depend on Q and K, so the lowered case has the same VJP; the softcap
    does (its derivative 1 - tanh^2 scales dS), and no oracle VJP for it exists yet."""
    if case.softcap:
        raise ValueError(f"no oracle VJP for softcap cases yet: {case.describe()}")
    return _lowered(case, decl)


def _digest(a: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).hexdigest()


def expected_vjp(case: Case, grad_out: np.ndarray, decl: Declaration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The oracle's (dQ, dK, dV) for ``case`` and cotangent ``grad_out`` under ``decl``'s conventions."""
    if case.has_variant:
        return expected_vjp(_lowered_for_grad(case, decl), grad_out, decl)
    f = formulation(case, decl)
    if f is not None and f.changes_oracle:
        return _cached(
            "fvjp:" + _digest(grad_out), case, decl, lambda: oracle_formulations.vjp(case, grad_out, f, decl)
        )
    return _spec_vjp(case, grad_out, decl)


def merged_aliases(case: Case, decl: Declaration, want, allowed) -> tuple[list, list]:
    """(dQ, dK, dV) and their allowances as a kernel differentiated by autograd returns them for ``case``:
    an argument that is one object with another (self-attention's ``q = k = x``) gets the whole gradient
    of that object, the sum of its arguments' parts, under each name (``Presentation``'s contract).
    Kernels whose adapter does not present ``requires_grad`` compute each argument's own part."""
    want, allowed = list(want), list(allowed)
    if "requires_grad" in decl.presents:
        index = {"query": 0, "key": 1, "value": 2}
        for group in aliases(case):
            at = [index[n] for n in group]
            total, bound = sum(want[i] for i in at), sum(allowed[i] for i in at)
            for i in at:
                want[i], allowed[i] = total, bound
    return want, allowed


def expected_bias_grad(case: Case, grad_out: np.ndarray, decl: Declaration) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's gradient of the additive M (in M's shape) for ``case`` and cotangent ``grad_out``, and
    its allowance (``tolerance.bias_grad_bound``), under ``decl``'s conventions."""

    def compute():
        fwd = expected(case, decl)
        want = oracle.bias_grad(case, fwd, grad_out)
        bound = tolerance.bias_grad_bound(case, fwd, _row_model(case, decl), _output_bound(case, decl), grad_out)
        return want, bound

    return _cached("dbias:" + _digest(grad_out), case, decl, compute)


def _spec_vjp(case: Case, grad_out: np.ndarray, decl: Declaration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _cached(
        "vjp:" + _digest(grad_out),
        case,
        decl,
        lambda: oracle.vjp(case, grad_out, **_conventions(case, decl)),
        spec=True,
    )


def pair_allowance(case: Case, other: Case, decl: Declaration | None = None) -> np.ndarray:
    """The allowance between the kernel's outputs on two cases with the same exact answer: the sum
    of their output allowances (each output may carry one allowance of error, and the triangle
    inequality through the exact answer adds them), and under a declared formulation the distance
    between its two answers (NaN, not judged, where only one of them is NaN)."""
    decl = decl or _DEFAULT
    allowed = output_allowance(case, decl) + output_allowance(other, decl)
    if _formulated(case, decl) or _formulated(other, decl):
        # a declared formulation keeps the relation only up to its own roundings, which the oracle
        # re-run under it gives exactly: the two answers' distance joins the triangle inequality
        # exactly: where one answer is NaN (an overflow) and the other is not, the relation does not
        # hold under the formulation at all and the element is not judged (NaN; each output was
        # compared with its own answer)
        one, two = expected(case, decl).out, expected(other, decl).out
        gap = np.abs(one - two)
        split = np.isnan(one) != np.isnan(two)
        allowed = np.where(split, np.nan, allowed + np.where(np.isnan(gap), 0.0, gap))
    return allowed


def _formulated(case: Case, decl: Declaration) -> bool:
    f = formulation(case, decl)
    return f is not None and f.changes_oracle

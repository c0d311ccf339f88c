"""Counts past the limits real kernels have, judged by structure rather than by tolerance.

Kernels hold counts in narrow types: a key index in 16 bits, a position in the input's own dtype (an
``arange`` made with the query's dtype holds the integers exactly only up to 256 in bfloat16 and 2 048
in float16), a (batch, head) slice on a CUDA grid axis of at most 65 535 (``test_limits_grid.py``). Each
is right on every size a casual test tries and wrong past its limit, and the error it makes there is
small against a long row (one key of 2 049 seen too early moves the output by about 1/2 049 of a value),
so it hides inside a tolerance. These clauses judge what a limit breaks by structure instead:

* a change to a key a row may not see leaves that row bitwise unchanged (two calls that differ only in
  the keys and values after position p: rows <= p equal, bitwise for a kernel declaring itself
  deterministic, within the error model otherwise): a blocked key contributes an exact 0 to every sum
  of the row, whatever its score, in any correct kernel, tiled or not;
* a key a row must see takes part: a dominant key past the 65 535th, and the output against the oracle;
* every slice is computed and no slice depends on another (``test_limits_grid.py``).

Element counts past 2**31 (an offset computed in int32 wraps) are argued, not run: the smallest case
that reaches them with the structure above (2**31 elements of one input, T = D = 1, every slice
distinct) needs 4 GiB per float16 input and 16 GiB for the oracle's float64 copy of it, more than the
machines the suite runs on have. The fault is an offset b * stride_b + h * stride_h + t * stride_t
computed in a type narrower than the tensor's element count; its 16-bit form is run here and in
``test_limits_grid.py`` (slices and keys past 65 535, each checked on its own), and its 32-bit form is
the same arithmetic at a larger count: a kernel that passes these clauses indexes per slice and per key,
and only its offset's width remains, which its source states (docs/case-space.md, "Counts past their
limits").

Cost (ci): T = 2 against S = 65 538 keys of head dim 1, and T = S = 300 (bfloat16) or 2 052 (float16)
under causal with head dim 1: a fraction of a second per adapter and dtype.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_causal import TRIANGLE
from conformance.clauses.test_long_sequence import ALL_KEYS
from conformance.contract import DTYPES, Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.covering.build import at_alignment
from conformance.harness.judge import compare
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import fail

KEY_LIMIT = 65535  # the largest count of a 16-bit index
# The largest integer each half-precision dtype holds exactly with its neighbours (2**(mantissa bits + 1)).
EXACT_POSITIONS = {"bfloat16": 256, "float16": 2048}
PAST = {"bfloat16": 300, "float16": 2052}  # T = S under causal: a few positions past the limit


def one_dtype(impl: GuardedAdapter) -> str:
    """The dtype a limit clause runs its big case in (one is enough: the limit is a count, not a precision):
    float32 where declared, else the first declared."""
    declared = [d for d in DTYPES if d in impl.declaration.dtypes]
    if not declared:
        impl.not_applicable("declares no dtype")
    return "float32" if "float32" in declared else declared[0]


def on_a_boundary(case: Case) -> Case:
    """``case`` with Q, K, V and the mask copied to a 64-byte boundary: the two calls :func:`rows_unchanged` sets
    side by side then differ in values only, not in alignment, so the bits a deterministic kernel owes are the
    same-memory ones (a vector path blocked by the address rounds alike at one alignment, on any host)."""
    arrays = {
        n: at_alignment(getattr(case, n)) for n in ("query", "key", "value", "mask") if getattr(case, n) is not None
    }
    return case.replace(**arrays)


def rows_unchanged(impl: GuardedAdapter, a: Case, out_a, b: Case, out_b, rows: slice, why: str) -> None:
    """Rows ``rows`` of two outputs of cases that differ only in what those rows may not see are equal: bitwise
    for a kernel declaring itself deterministic (both cases on a 64-byte boundary: :func:`on_a_boundary`), within
    the sum of the two allowances otherwise."""
    got_a, got_b = np.asarray(out_a)[..., rows, :], np.asarray(out_b)[..., rows, :]
    decl = impl.declaration
    if decl.deterministic:
        x, y = got_a.astype(np.float64), got_b.astype(np.float64)
        differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        if differ.any():
            idx = tuple(int(i) for i in np.argwhere(differ)[0])
            row = idx[2] + (rows.start or 0)
            fail(
                f"{why}: {int(differ.any(axis=-1).sum())} rows changed although every key that differs between the two "
                f"calls is blocked for them; first at [b,h,t,d]={[idx[0], idx[1], row, idx[3]]}: {x[idx]!r} then "
                f"{y[idx]!r} (the kernel declares itself deterministic: a blocked key adds an exact 0 to the row)",
                b,
            )
        return
    allowed = compare.pair_allowance(a, b, decl)[..., rows, :]
    compare.assert_outputs_agree(why, got_a, got_b, allowed, case=a, decl=decl, other=b)


@clause(
    "LIMITS-KEYS-02",
    "keys past the 65 535th take part and are blocked like any other: T = 2 queries against S = 65 538 keys, a "
    "dominant key 65 536 gives the oracle's output, and with the last key blocked by the mask, changing it leaves "
    "the output bitwise unchanged (a 16-bit key index)",
    ALL_KEYS,
    kills=["keys_past_65535_dropped"],
)
def test_keys_past_16_bits(impl):
    dtype = one_dtype(impl)
    S = KEY_LIMIT + 3  # keys 0 .. 65 537
    rng = rng_for(4301)
    q = np.array([1.0, 0.5]).reshape(1, 1, 2, 1)
    k = rng.standard_normal((1, 1, S, 1))
    k[..., KEY_LIMIT + 1, 0] = 16.0  # key 65 536: scaled score 16 against about 1, most of row 0's weight
    v = rng.standard_normal((1, 1, S, 1))
    v[..., KEY_LIMIT + 1, 0] = 4.0
    case = Case(cast(q, dtype), cast(k, dtype), cast(v, dtype), seed=4301, label=f"S = {S}, dominant key 65 536")
    if impl.declaration.bool_mask:  # the last key blocked, one mask row per query (some kernels refuse a [.., 1, S])
        case = case.replace(
            mask=np.broadcast_to(np.arange(S) == S - 1, (1, 1, 2, S)).copy(),
            label=f"S = {S}, dominant key 65 536, key {S - 1} blocked",
        )
    case = on_a_boundary(case)
    impl.require(case)
    out = compare.assert_output_matches(impl, case)
    if case.mask is None:
        return
    k2, v2 = k.copy(), v.copy()
    k2[..., S - 1, 0] = 30.0
    v2[..., S - 1, 0] = -8.0
    changed = on_a_boundary(
        case.replace(key=cast(k2, dtype), value=cast(v2, dtype), label=f"the blocked key {S - 1} changed")
    )
    out2 = compare.assert_output_matches(impl, changed)
    rows_unchanged(impl, case, out, changed, out2, slice(None), f"key {S - 1} blocked by the mask, changed")


@clause(
    "LIMITS-POSITIONS-03",
    "under is_causal past the integers a half-precision dtype holds exactly (T = S = 300 in bfloat16, past 256; "
    "2 052 in float16, past 2 048), changing the keys and values after position p leaves rows 0 .. p bitwise "
    "unchanged for p = the limit (and 3 past it in bfloat16): no query sees the next key because positions were "
    "compared in the input dtype; the same for the left edge of a declared sliding window",
    TRIANGLE,
    requires=["causal"],
    dtypes=("bfloat16", "float16"),
    kills=["causal_positions_in_input_dtype"],
)
def test_positions_past_exact_integers(impl, dtype):
    n, limit = PAST[dtype], EXACT_POSITIONS[dtype]
    rng = rng_for(4400 + n)
    q, k, v = (rng.standard_normal((1, 1, n, 1)) for _ in range(3))
    base = on_a_boundary(
        Case(cast(q, dtype), cast(k, dtype), cast(v, dtype), is_causal=True, seed=4400, label=f"causal T = S = {n}")
    )
    impl.require(base)
    out = impl.forward(base)
    if n <= 512:  # the oracle's T x S work: cheap at 300, and the float16 case is judged by structure alone
        compare.assert_close(out, compare.expected(base, impl.declaration).out, case=base, decl=impl.declaration)
    for p in (limit,) if n > 512 else (limit, limit + 3):  # the first pair of positions that round together
        k2, v2 = k.copy(), v.copy()
        k2[..., p + 1 :, 0] = -k[..., p + 1 :, 0] + 3.0
        v2[..., p + 1 :, 0] += 16.0  # a leaked key moves its row by about 16 / p, far past one unit of the dtype
        other = on_a_boundary(base.replace(key=cast(k2, dtype), value=cast(v2, dtype), label=f"keys after {p} changed"))
        rows_unchanged(
            impl, base, out, other, impl.forward(other), slice(0, p + 1), f"causal, keys after position {p} changed"
        )
    if not impl.declaration.window:
        return
    left = 64  # query i sees keys i - 64 .. i: the left edge crosses the limit at query limit + 64
    windowed = base.replace(window=(left, 0), label=f"window ({left}, 0), T = S = {n}")
    if not impl.supports(windowed):
        return
    wout = impl.forward(windowed)
    p = limit + 1
    k3, v3 = k.copy(), v.copy()
    k3[..., : p + 1, 0] = -k[..., : p + 1, 0] + 3.0
    v3[..., : p + 1, 0] += 16.0
    wother = on_a_boundary(
        windowed.replace(key=cast(k3, dtype), value=cast(v3, dtype), label=f"window, keys up to {p} changed")
    )
    rows_unchanged(
        impl,
        windowed,
        wout,
        wother,
        impl.forward(wother),
        slice(p + left + 1, n),
        f"window ({left}, 0), keys up to position {p} changed",
    )

"""The float64 oracle re-run under a declared formulation: the spec's formula with named roundings.

000 §8 upcasts low-precision inputs before the product and blocks keys with -inf. Many kernels do
not (keras, MLX, transformers' eager attention and ONNX Runtime form float16 products; keras, XLA
and transformers fill blocked keys with a large finite number; TF32 tensor cores and bfloat16
"fast math" round float32 operands). A kernel that declares such a formulation
(``Declaration.float32_computed_as`` ... ``blocked_fill``, conformance/contract.py) owes this
module's answer instead of :mod:`conformance.oracle`'s: the same float64 computation with the
formulation's roundings applied where it rounds, and its fill where it fills:

* operands: Q, K, V (and dO in the backward) rounded to the float32 case's operand format;
* the scale on Q: ``round(Q * scale)`` in the input dtype before the product (``scale_applied="query"``);
* the product: ``round(Q K^T)`` to the input dtype (``-products``, ``-sums``; +-inf past its range),
  or the *scaled* product ``round(scale Q K^T)`` (``scale_applied="product"``); ``-scores`` rounds the
  scaled product once more (the scale applied in the input dtype); ``-sums`` changes no answer, only
  how far a kernel may be from it (its sums accumulate in the input dtype);
* the additive mask (``-masked``): M rounded to the input dtype and added there, ``round(s + round(M))``;
* the fill: each blocked key's score replaced by F (``set:F``) or ``round(s + F)`` (``add:F``) in the
  precision the scores have there; float64 scores with an added fill, of a kernel whose softmax runs in
  float32 (``float64_computed_as="float32"``), reach it through float32, so a fill past float32's
  range is -inf there (transformers' eager attention: finfo(float64).min added, softmax(dtype=float32)).

Everything else is the oracle's float64 arithmetic: the softmax, P V, the backward. What the
formulation does *not* fix (the order of a float32 accumulation, where P is rounded, a rounding
of a value the kernel computed with its own small error) is the error model's part
(``harness.judge.tolerance`` with the residuals :func:`rounding_residual` gives). A rounding the
kernel and the oracle make of the *same* number gives the same result, so where the exact value
lies farther from a rounding boundary than the kernel's own error can move it, the residual is
exactly 0: that is what lets a declared formulation be judged exactly (an overflow to inf, a fine
structure a float16 product erases, a fill that swamps the scores) rather than by a wider rule.

Consequences of a fill, computed rather than declared: a row blocked entirely is the softmax over
its filled scores (uniform where the fill swamps them; under ``add`` in float16 it keeps their
coarse structure, and it depends on Q and K, so the backward passes a gradient through it); a key
whose score exceeds the fill stays visible. ``Forward.all_blocked`` marks the rows whose answer
does not depend on the scores (a row of -inf, a ``set`` fill, a row the kernel overwrites with
its declared zeros or NaN); ``Forward.blocked`` the blocked keys whose weight is exactly 0.

Variant cases (window, softcap, ALiBi, sinks, variable lengths) are judged by
:mod:`conformance.oracle_variants` unchanged: a formulation applies to the seed's SDPA cases.
Imports the contract and the oracle only, like the oracle itself. Longer than 250 lines because it is
one definition: which formulation a declaration makes of a case, the roundings it names, and the
forward and VJP that apply them must be read together against the docstring above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance import oracle
from conformance.contract import LOW_PRECISION, Case, Declaration, np_dtype, parse_fill

# Significand bits (the implicit one included) of the formats a formulation rounds to.
PRECISION_BITS = {"float64": 53, "float32": 24, "tf32": 11, "float16": 11, "bfloat16": 8}
UNIT_ROUNDOFF = {name: 2.0**-bits for name, bits in PRECISION_BITS.items()}
F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Formulation:
    """The named roundings and fill one declaration makes for one case (None fields: the spec's)."""

    dtype: str  # the case's dtype
    operands: str | None = None  # float32 cases: the format both products' operands are rounded to
    product: str | None = None  # the dtype Q K^T (or scale Q K^T) is rounded to
    scaled_rounded: bool = False  # ``-scores``: the scaled product rounded to ``product`` again
    summed_in: str | None = None  # ``-sums``: the products' sums accumulated in this dtype (error model only)
    bias_rounded: bool = False  # ``-masked``: M in the input dtype, s + M rounded to it
    scale_applied: str = "scores"  # "scores" | "product" | "query" (query: only below float32)
    fill: tuple[str, float] | None = None  # ("set" | "add", F) for the boolean mask's and causal's keys
    fill_text: str = "-inf"
    fill_dtype: str = "float32"  # the precision the fill is applied in
    softmax_float32: bool = False  # float64 scores reach a float32 softmax (fills past its range: -inf)
    normwise_merges: int = 0

    @property
    def rounds_query(self) -> bool:
        return self.scale_applied == "query" and self.dtype in LOW_PRECISION

    @property
    def changes_oracle(self) -> bool:
        """False when the oracle's answer is the spec's (only the error model differs)."""
        return bool(self.operands or self.product or self.rounds_query or self.fill)

    def key(self) -> tuple:
        return (
            self.operands,
            self.product,
            self.scaled_rounded,
            self.summed_in,
            self.bias_rounded,
            self.scale_applied,
            self.fill_text,
            self.fill_dtype,
            self.softmax_float32,
            self.normwise_merges,
        )

    def describe(self) -> str:
        """The formulation in words, for the rule line of a failure report."""
        parts = []
        if self.operands:
            parts.append(f"operands rounded to {self.operands}")
        if self.rounds_query:
            parts.append(f"Q*scale rounded to {self.dtype}")
        if self.product:
            what = "scale*QK^T" if self.scale_applied == "product" else "QK^T"
            parts.append(f"{what} rounded to {self.product}" + (", scaled there" if self.scaled_rounded else ""))
        if self.summed_in:
            parts.append(f"sums accumulated in {self.summed_in}")
        if self.bias_rounded:
            parts.append(f"M added in {self.product}")
        if self.fill:
            parts.append(f"blocked keys {self.fill_text} in {self.fill_dtype}")
        if self.normwise_merges:
            parts.append(f"{self.normwise_merges} normwise merges")
        return "; ".join(parts)


def formulation(case: Case, decl: Declaration) -> Formulation | None:
    """The formulation ``decl`` declares for ``case``, or None where the case is the spec's to judge
    (nothing declared reaches its dtype or its blocked keys, or it is a variant case)."""
    if case.has_variant:
        return None
    dtype = case.dtype
    operands = product = summed_in = None
    scaled_rounded = bias_rounded = False
    if dtype == "float32" and decl.float32_computed_as != "float32":
        operands = decl.float32_computed_as
    if dtype in LOW_PRECISION:
        how = decl.computed_as(dtype)
        if how != "float32":
            product = dtype
            scaled_rounded = how.endswith("-scores")
            summed_in = dtype if how.endswith("-sums") else None
            bias_rounded = how.endswith("-masked") and case.bias is not None
    fill = None
    parsed = parse_fill(decl.blocked_fill)
    if parsed is not None and _fill_reaches(case, decl):
        fill = (parsed[0], fill_value(parsed[1], dtype))
    if dtype in LOW_PRECISION:
        fill_dtype = dtype if scaled_rounded else "float32"
    else:
        fill_dtype = dtype
    f = Formulation(
        dtype=dtype,
        operands=operands,
        product=product,
        scaled_rounded=scaled_rounded,
        summed_in=summed_in,
        bias_rounded=bias_rounded,
        scale_applied=decl.scale_applied,
        fill=fill,
        fill_text=decl.blocked_fill if fill else "-inf",
        fill_dtype=fill_dtype,
        # an added fill is a float64 number in float64 scores; a kernel that declares float64 computed in
        # float32 meets it in its float32 softmax (transformers' softmax(dtype=float32): finfo(float64).min
        # is -inf there). A set fill is what the kernel substitutes in the scores' own dtype (MLX's
        # finfo(float64).min, in a float64 softmax): it reaches the softmax as it is.
        softmax_float32=dtype == "float64"
        and decl.float64_computed_as == "float32"
        and fill is not None
        and fill[0] == "add",
        normwise_merges=decl.normwise_merges,
    )
    return f if f.changes_oracle or f.normwise_merges else None


def _fill_reaches(case: Case, decl: Declaration) -> bool:
    """A fill reaches the keys a boolean mask or causal blocks, when the kernel receives them so (not
    folded by its adapter into one additive mask with -inf: ``Declaration.masks_combined``)."""
    if case.mask is None and not case.is_causal:
        return False
    return not (case.bias is not None and (case.mask is None or decl.masks_combined))


def fill_value(name: str, dtype: str) -> float:
    """F for a fill name of ``Declaration.blocked_fill`` in a case of ``dtype``, as a float64 number."""
    if name == "min":
        return -float(np.finfo(np_dtype(dtype)).max)
    if name == "-0.7max":
        top = min(float(np.finfo(np_dtype(dtype)).max), F32_MAX)
        return float(round_to(np.float64(-0.7 * top), dtype))
    if name == "-0.7max-float32":
        return float(round_to(np.float64(-0.7 * F32_MAX), "float32"))
    return float(name)


# -- rounding --------------------------------------------------------------------------------------------
def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` (float64) rounded to ``fmt`` (to nearest, ties to even; past the range: +-inf), as float64.
    tf32 is float32 with 13 fewer significand bits (float32's range)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "float64":
            return x
        if fmt == "tf32":
            return _round_bits(x.astype(np.float32), 13).astype(np.float64)
        return x.astype(np_dtype(fmt)).astype(np.float64)


def _round_bits(x32: np.ndarray, drop: int) -> np.ndarray:
    """float32 rounded to ``24 - drop`` significand bits, to nearest, ties to even (inf stays inf)."""
    bits = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    half = np.uint64(1 << (drop - 1))
    keep_lsb = (bits >> np.uint64(drop)) & np.uint64(1)
    rounded = ((bits + half - np.uint64(1) + keep_lsb) >> np.uint64(drop)) << np.uint64(drop)
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x32), out, x32)


def ulp(x: np.ndarray, fmt: str) -> np.ndarray:
    """The spacing of ``fmt`` at |x| (at least its smallest subnormal step), float64."""
    bits = PRECISION_BITS[fmt]
    emin = {"float16": -14, "float64": -1022}.get(fmt, -126)
    mag = np.abs(np.asarray(x, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(mag)
    e = np.where(mag == 0, emin, np.maximum(e - 1, emin))
    return np.ldexp(1.0, e - bits + 1)


def rounding_residual(x: np.ndarray, delta: np.ndarray, fmt: str) -> np.ndarray:
    """A bound on |round(x') - round(x)| over every x' with |x' - x| <= delta: 0 where the exact value
    ``x`` lies farther than ``delta`` from a rounding boundary of ``fmt`` (the kernel's rounding then
    lands where the oracle's does), else ``delta`` plus one spacing; inf near the overflow threshold."""
    x = np.asarray(x, dtype=np.float64)
    delta = np.broadcast_to(np.asarray(delta, dtype=np.float64), x.shape)
    r = round_to(x, fmt)
    step = ulp(r, fmt)
    below = np.where(np.abs(r) == np.ldexp(1.0, np.frexp(np.abs(r))[1] - 1), step / 2, step)  # at a power of two
    lo = np.where(r > 0, below, step)
    hi = np.where(r > 0, step, below)
    with np.errstate(invalid="ignore", over="ignore"):
        room = np.minimum(x - (r - lo / 2), (r + hi / 2) - x)
        res = np.where(room > delta, 0.0, delta + np.maximum(lo, hi))
    return np.where(np.isfinite(r) & np.isfinite(x), res, np.where(np.isnan(x), 0.0, np.inf))


def tie_residual(x: np.ndarray, fmt: str | None) -> np.ndarray:
    """For an input rounded to ``fmt``: one spacing where the value is exactly halfway between two
    numbers of ``fmt`` (kernels break such ties differently: even, away from zero), else 0."""
    x = np.asarray(x, dtype=np.float64)
    if not fmt:
        return np.zeros(x.shape)
    r = round_to(x, fmt)
    with np.errstate(invalid="ignore"):
        tie = np.isfinite(r) & (np.abs(x - r) == ulp(r, fmt) / 2)
    return np.where(tie, ulp(r, fmt), 0.0)


# -- the forward and the VJP ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Operands:
    """A case's operands as the formulation's products see them, float64, GQA heads expanded."""

    q: np.ndarray  # [B, Hq, T, Dk] as multiplied (rounded; times the scale under scale_applied="query")
    k: np.ndarray  # [B, Hq, S, Dk]
    v: np.ndarray  # [B, Hq, S, Dv]
    raw: np.ndarray  # q @ k^T, exact
    scale_after: float  # the scale still to apply to ``raw`` (1 when it went into Q)


def operands(case: Case, f: Formulation) -> Operands:
    q, k, v = (np.asarray(x).astype(np.float64) for x in (case.query, case.key, case.value))
    if f.operands:
        q, k, v = (round_to(x, f.operands) for x in (q, k, v))
    scale = case.effective_scale
    if f.rounds_query:
        q, scale = round_to(q * scale, f.dtype), 1.0
    k, v = oracle.expand_kv(k, case.Hq), oracle.expand_kv(v, case.Hq)
    raw = q @ np.ascontiguousarray(np.swapaxes(k, -1, -2))
    return Operands(q=q, k=k, v=v, raw=raw, scale_after=scale)


def scores(case: Case, f: Formulation, ops: Operands) -> np.ndarray:
    """The scores before the mask: the product, rounded and scaled as the formulation says."""
    with np.errstate(over="ignore", invalid="ignore"):
        if not f.product:
            return ops.raw * ops.scale_after
        if f.scale_applied == "product":
            return round_to(ops.raw * ops.scale_after, f.product)
        s = round_to(ops.raw, f.product) * ops.scale_after
        return round_to(s, f.product) if f.scaled_rounded and ops.scale_after != 1.0 else s


def fill_positions(case: Case, f: Formulation, alignment: str) -> tuple[np.ndarray, np.ndarray]:
    """([B,Hq,T,S] keys the fill reaches, [B,Hq,T,S] keys that stay -inf)."""
    blocked, _ = oracle.blocked_and_bias(case, alignment)
    if not f.fill:
        return np.zeros(blocked.shape, dtype=bool), blocked
    neg = np.zeros(blocked.shape, dtype=bool)
    if case.bias is not None:
        neg = np.broadcast_to(np.isneginf(np.asarray(case.bias, dtype=np.float64)), blocked.shape)
    filled = blocked & ~neg
    return filled, neg


def filled_scores(case: Case, f: Formulation, s: np.ndarray, alignment: str) -> tuple[np.ndarray, np.ndarray]:
    """(the scores the softmax takes, the keys the fill reached): bias added, the fill applied,
    -inf where nothing fills."""
    _, bias = oracle.blocked_and_bias(case, alignment)
    filled, neg = fill_positions(case, f, alignment)
    with np.errstate(over="ignore", invalid="ignore"):
        s = masked_scores(s, bias, f)
        if f.fill:
            mode, value = f.fill
            put = round_to(np.float64(value), f.fill_dtype) if mode == "set" else round_to(s + value, f.fill_dtype)
            if f.softmax_float32:
                put = round_to(put, "float32")
            s = np.where(filled, put, s)
    return np.where(neg, -np.inf, s), filled


def masked_scores(s: np.ndarray, bias: np.ndarray, f: Formulation) -> np.ndarray:
    """The scores plus the additive mask: exact, or (``-masked``) M rounded to the input dtype and the
    sum rounded to it (-inf stays -inf)."""
    if not f.bias_rounded:
        return s + bias
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to(s + round_to(bias, f.product), f.product)


def _softmax(s: np.ndarray) -> np.ndarray:
    """softmax over the last axis in float64; a row of -inf gives 0 (its fill is decided by the caller),
    a row with +inf or NaN gives NaN (what an overflowed product does in every kernel)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m)
        e = np.exp(s - m)
        d = e.sum(axis=-1, keepdims=True)
        return np.where(np.isneginf(s).all(axis=-1, keepdims=True), 0.0, e / d)


def forward(case: Case, f: Formulation, decl: Declaration) -> oracle.Forward:
    """The oracle's forward for ``case`` under formulation ``f`` (``decl``: the row policies)."""
    alignment = decl.causal_alignment
    ops = operands(case, f)
    s, filled = filled_scores(case, f, scores(case, f, ops), alignment)
    spec_blocked, _ = oracle.blocked_and_bias(case, alignment)
    weights = _softmax(s)
    no_score = np.isneginf(s).all(axis=-1)  # every key -inf: nothing to compute
    unseen = spec_blocked.all(axis=-1)  # no key visible by the spec's rule (blocked or filled)
    # Rows the kernel answers without the scores: -inf everywhere (what it makes of such a row), a
    # set fill, or a row with no visible key that it overwrites with its declared zeros / NaN.
    policy = decl.all_blocked_policy(case)
    overwrite = unseen & ~no_score & (policy != "mean-v")
    set_fill = f.fill is not None and f.fill[0] == "set"
    fixed = no_score | overwrite | (unseen & set_fill)
    weights = _apply_policy(weights, overwrite, policy, case.S)
    weights = _apply_policy(weights, no_score, _row_policy(case, decl, f), case.S)
    out = np.einsum("bhts,bhsd->bhtd", weights, ops.v)
    with np.errstate(invalid="ignore"):
        zero_weight = ~(weights > 0) & ~np.isnan(weights)
    blocked = spec_blocked & (zero_weight | fixed[..., None])
    return oracle.Forward(out=out, weights=weights, blocked=blocked, all_blocked=fixed)


def _row_policy(case: Case, decl: Declaration, f: Formulation) -> str:
    """The declared answer of a row with no finite score: under a fill only -inf empties a row (an
    additive mask's, or a fill past float32's range in a float32 softmax), so such a row is what the
    kernel makes of a row of -inf: the additive mask's policy, where one is declared."""
    if f.fill and decl.all_blocked_float_mask is not None:
        return decl.all_blocked_float_mask
    return decl.all_blocked_policy(case)


def _apply_policy(weights: np.ndarray, rows: np.ndarray, policy: str, S: int) -> np.ndarray:
    if not rows.any():
        return weights
    fill = {"zeros": 0.0, "nan": np.nan, "mean-v": 1.0 / S}.get(policy)
    if fill is None:
        raise ValueError(f"unknown all_blocked policy {policy!r} for a formulation")
    return np.where(rows[..., None], fill, weights)


def vjp(case: Case, grad_out: np.ndarray, f: Formulation, decl: Declaration) -> tuple[np.ndarray, ...]:
    """(dQ, dK, dV) of the formulation, analytic, float64: the oracle's backward through its weights,
    every rounding's derivative taken as 1 (autograd's), dO rounded where the operands are; a
    ``set`` fill passes no gradient (its keys have weight 0, or the row is fixed), an ``add`` fill of
    a row blocked entirely passes the softmax's."""
    fwd = forward(case, f, decl)
    ops = operands(case, f)
    do = np.asarray(grad_out).astype(np.float64)
    if f.operands:
        do = round_to(do, f.operands)
    g = case.Hq // case.Hkv
    k = ops.k[:, ::g]  # back to the kv heads (expand_kv repeats them)
    v = ops.v[:, ::g]
    if not f.rounds_query:
        dq, dk, dv = oracle.backward(case.replace(query=ops.q, key=k, value=v), fwd, do)
    else:  # scores q'.k with q' = round(q * scale): dK = dS^T q', dQ = scale dS K
        dq, dk, dv = oracle.backward(case.replace(query=ops.q, key=k, value=v, scale=1.0), fwd, do)
        dq = dq * case.effective_scale
    nan_rows = np.isnan(fwd.weights).any(axis=-1)  # a NaN row (an overflow, a row of -inf left NaN)
    if nan_rows.any():  # passes NaN to its dQ and to every dK, dV its head touches, as autograd does
        B, Hkv = case.B, case.Hkv
        dq = np.where(nan_rows[..., None], np.nan, dq)
        touched = nan_rows.any(axis=-1).reshape(B, Hkv, g).any(axis=-1)[..., None, None]
        dk, dv = np.where(touched, np.nan, dk), np.where(touched, np.nan, dv)
    return dq, dk, dv

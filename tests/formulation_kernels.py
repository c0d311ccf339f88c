"""Self-test kernels, one per declarable formulation, each doing exactly what it declares.

Each computes attention the way a real kernel of that formulation does (NumPy, float32 work, the
formulation's roundings where it makes them), written from the formulation's description and not
from ``conformance.oracle_formulations`` (nothing of the oracle or the harness is imported), so that
a mistake in the formulation oracle shows up as a failure here instead of being shared:

==============================  ===============================================================
kernel                          formulation (declaration)
==============================  ===============================================================
form-f32-bf16                   float32 at bfloat16 precision: Q, K, V, P (and dO, dS) rounded to
                                bfloat16 for float32-accumulated products (float32_computed_as=bfloat16)
form-f32-tf32                   float32 at TF32: the same with 10 explicit mantissa bits
                                (float32_computed_as=tf32)
form-f16-products               float16 without upcast: Q K^T formed in float16 (float32
                                accumulation, the result rounded: past 65504 it is inf), scale,
                                softmax in float32, P rounded, P V (float16_computed_as=float16-products)
form-q-prescaled                Q times the scale rounded to the input dtype before an upcast
                                product (scale_applied=query), float16 and bfloat16
form-fill-add                   blocked keys get -0.7 x the dtype's largest number ADDED to their
                                scores (an additive 0 / F mask), rows blocked entirely follow the
                                softmax of the filled scores, gradient included (blocked_fill=add:-0.7max)
form-ring-merge                 ring attention: keys in 4 blocks merged by out -= sigmoid(lse_b - lse)
                                (out - out_b) (normwise_merges=3)
==============================  ===============================================================

``with_bug`` adds one more departure to a kernel (a mask off by one key; the backward's scale 1 %
off), ``approximate`` one that only approximately follows the formulation (noise of a few units of
the formulation's precision on the scores; another fill value). tests/test_formulations.py runs them.
Longer than 250 lines because it is one catalogue: the kernels share one forward and backward whose
roundings each subclass switches on, and must sit side by side to be compared.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration, capabilities, np_dtype
from tests.mutants import validate_article


def _to(x: np.ndarray, fmt: str | None) -> np.ndarray:
    """x (float32 work) rounded to ``fmt`` and back to float32; tf32 keeps 10 explicit mantissa bits."""
    if fmt is None:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        if fmt == "tf32":
            bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
            lsb = (bits >> np.uint64(13)) & np.uint64(1)
            out = ((bits + np.uint64(0xFFF) + lsb) >> np.uint64(13) << np.uint64(13)).astype(np.uint32)
            return np.where(np.isfinite(x), out.view(np.float32), x).astype(np.float32)
        return x.astype(np_dtype(fmt)).astype(np.float32)


class FormulationKernel:
    """Attention with named roundings: the plumbing every self-test kernel shares."""

    name = "form"
    operands: str | None = None  # float32 cases: the products' operand format
    product_lowp = False  # float16: Q K^T rounded to float16
    bias_lowp = False  # float16: the additive mask taken in float16 and s + M rounded to it (MLX)
    query_scaled = False  # Q * scale rounded to the input dtype (float16, bfloat16)
    fill: tuple[str, str] | None = None  # ("add" | "set", "-0.7max" | number)
    blocks = 1  # key blocks merged with the sigmoid merge
    # departures (with_bug / approximate)
    mask_shift = False
    bwd_scale = 1.0
    score_noise = 0.0
    fill_override: float | None = None

    def __init__(self) -> None:
        self.declaration = Declaration(
            **capabilities(dropout=False),
            causal_alignment="top-left",
            all_blocked="mean-v" if self.fill else "zeros",
            all_blocked_float_mask="zeros",  # a row of -inf (an additive mask's) gives 0 here
            notes=f"self-test kernel: {self.name}",
            **self.declares(),
        )

    def declares(self) -> dict:
        return {}

    # -- the pieces -------------------------------------------------------------------------------
    def _work(self, case: Case):
        return np.float64 if case.dtype == "float64" else np.float32

    def _rows(self, case: Case):
        """(blocked by mask / causal [B,Hq,T,S], finite bias, -inf bias positions)."""
        shape = (case.B, case.Hq, case.T, case.S)
        blocked = np.zeros(shape, dtype=bool)
        if case.mask is not None:
            m = np.broadcast_to(np.asarray(case.mask, dtype=bool), shape)
            blocked = blocked | (np.roll(m, 1, axis=-1) if self.mask_shift else m)
        if case.is_causal:
            blocked = blocked | (np.arange(case.S)[None, :] > np.arange(case.T)[:, None])
        bias = np.zeros(shape)
        neg = np.zeros(shape, dtype=bool)
        if case.bias is not None:
            b = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), shape)
            neg = np.isneginf(b)
            bias = np.where(neg, 0.0, b)
        return blocked & ~neg, bias, neg

    def _fill_value(self, case: Case) -> float:
        if self.fill_override is not None:
            return self.fill_override
        name = self.fill[1]
        if name == "-0.7max":
            dt = np_dtype(case.dtype)
            top = min(float(np.finfo(dt).max), float(np.finfo(np.float32).max))
            return float(np.asarray(-0.7 * top).astype(dt))
        return float(name)

    def _lowp(self, case: Case) -> str | None:
        return case.dtype if case.dtype in ("float16", "bfloat16") else None

    def _operands(self, case: Case):
        work = self._work(case)
        q, k, v = (np.asarray(x).astype(work) for x in (case.query, case.key, case.value))
        fmt = self.operands if case.dtype == "float32" else None
        q, k, v = _to(q, fmt), _to(k, fmt), _to(v, fmt)
        g = case.Hq // case.Hkv
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        scale = work(case.effective_scale)
        lowp = self._lowp(case)
        if self.query_scaled and lowp:
            q, scale = _to(q * scale, lowp), work(1.0)
        return work, fmt, q, k, v, scale

    def _scores(self, case: Case):
        work, fmt, q, k, v, scale = self._operands(case)
        raw = q @ np.swapaxes(k, -1, -2)
        lowp = self._lowp(case)
        if self.product_lowp and case.dtype == "float16":
            raw = _to(raw, lowp)
        with np.errstate(over="ignore", invalid="ignore"):
            s = raw * scale
        if self.score_noise:
            rng = np.random.default_rng(int(abs(float(np.sum(case.query, dtype=np.float64))) * 1000) % 2**31)
            s = s * (1 + self.score_noise * rng.choice([-1.0, 1.0], size=s.shape)).astype(work)
        blocked, bias, neg = self._rows(case)
        if self.bias_lowp and lowp == "float16" and case.bias is not None:
            s = _to(s + _to(bias.astype(work), lowp), lowp)
        else:
            s = s + bias.astype(work)
        if self.fill and case.mask is not None or self.fill and case.is_causal:
            if case.bias is None or case.mask is not None:
                f = work(self._fill_value(case))
                with np.errstate(over="ignore"):
                    s = np.where(blocked, s + f if self.fill[0] == "add" else f, s)
                blocked = np.zeros_like(blocked)
        s = np.where(blocked | neg, work(-np.inf), s)
        return work, fmt, q, k, v, scale, s.astype(work)

    @staticmethod
    def _softmax(s: np.ndarray, work):
        with np.errstate(invalid="ignore", over="ignore"):
            m = s.max(axis=-1, keepdims=True)
            m = np.where(np.isneginf(m), work(0), m)
            e = np.exp(s - m)
            l = e.sum(axis=-1, keepdims=True)
            # a row of -inf gives 0; an overflowed (+inf) score gives NaN, as in every kernel
            return np.where(l == 0, work(0), e / np.where(l == 0, 1, l)).astype(work), e, l, m

    def _p_format(self, case: Case, fmt: str | None) -> str | None:
        return self._lowp(case) or fmt

    def forward(self, case: Case) -> np.ndarray:
        validate_article(case)
        work, fmt, q, k, v, scale, s = self._scores(case)
        pf = self._p_format(case, fmt)
        if self.blocks > 1:
            out = self._ring(s, v, work, pf)
        else:
            p, _, _, _ = self._softmax(s, work)
            out = _to(p, pf) @ v
        empty = np.isneginf(s).all(axis=-1, keepdims=True)
        if self.fill is None:
            out = np.where(empty, work(0), out)
        return out.astype(np_dtype(case.dtype))

    def _ring(self, s, v, work, pf):
        S = s.shape[-1]
        per = -(-S // min(self.blocks, S))
        out = lse = None
        for a in range(0, S, per):
            p, e, l, m = self._softmax(s[..., a : a + per], work)
            out_b = _to(p, pf) @ v[..., a : a + per, :]
            with np.errstate(divide="ignore"):
                lse_b = np.where(l > 0, m + np.log(np.where(l > 0, l, 1)), -np.inf).astype(work)
            if out is None:
                out, lse = out_b, lse_b
                continue
            seen = ~np.isneginf(lse_b)
            first = np.isneginf(lse)
            with np.errstate(invalid="ignore", over="ignore"):
                d = np.where(first | ~seen, work(0), lse_b - lse)
                sig = work(1) / (work(1) + np.exp(-d))
                log_sig = -np.log1p(np.exp(-np.abs(d))) + np.minimum(-d, work(0))
            out = np.where(first, out_b, np.where(seen, out - sig * (out - out_b), out)).astype(work)
            lse = np.where(first, lse_b, np.where(seen, lse - log_sig, lse)).astype(work)
        return out

    def vjp(self, case: Case, grad_out: np.ndarray):
        """Autograd's backward of the forward above (each rounding's derivative 1)."""
        validate_article(case)
        work, fmt, q, k, v, scale, s = self._scores(case)
        lowp = self._lowp(case)
        pf = self._p_format(case, fmt)
        p, _, _, _ = self._softmax(s, work)
        do = _to(np.asarray(grad_out).astype(work), fmt)
        dv = np.swapaxes(_to(p, pf), -1, -2) @ do
        dp = do @ np.swapaxes(v, -1, -2)
        if self.product_lowp and lowp == "float16":
            dp = _to(dp, lowp)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        ds = np.where(np.isneginf(s), work(0), ds)
        if self.fill is None or self.fill[0] == "set":
            blocked, _, _ = self._rows(case)
            ds = np.where(blocked, work(0), ds)
        ds = _to(ds, pf)
        sc = work(case.effective_scale * self.bwd_scale)
        dq = (ds @ k) * sc
        dk = np.swapaxes(ds, -1, -2) @ (q if self.query_scaled and lowp else q * sc)
        g = case.Hq // case.Hkv
        b, hq, n, d = dk.shape
        dk = dk.reshape(b, case.Hkv, g, n, d).sum(axis=2)
        dv = dv.reshape(b, case.Hkv, g, n, dv.shape[-1]).sum(axis=2)
        dt = np_dtype(case.dtype)
        return dq.astype(dt), dk.astype(dt), dv.astype(dt)


class F32Bf16(FormulationKernel):
    name = "form-f32-bf16"
    operands = "bfloat16"

    def declares(self) -> dict:
        return {"float32_computed_as": "bfloat16"}


class F32Tf32(FormulationKernel):
    name = "form-f32-tf32"
    operands = "tf32"

    def declares(self) -> dict:
        return {"float32_computed_as": "tf32"}


class F16Products(FormulationKernel):
    name = "form-f16-products"
    product_lowp = True

    def declares(self) -> dict:
        return {"float16_computed_as": "float16-products"}


class F16Masked(F16Products):
    """float16 products with the additive mask added in float16 (MLX's additive mask has the inputs'
    dtype): not in KERNELS, checked on its own by tests/test_formulations.py."""

    name = "form-f16-masked"
    bias_lowp = True

    def declares(self) -> dict:
        return {"float16_computed_as": "float16-masked"}


class QPrescaled(FormulationKernel):
    name = "form-q-prescaled"
    query_scaled = True

    def declares(self) -> dict:
        return {"scale_applied": "query"}


class FillAdd(FormulationKernel):
    name = "form-fill-add"
    fill = ("add", "-0.7max")

    def declares(self) -> dict:
        return {"blocked_fill": "add:-0.7max"}


class RingMerge(FormulationKernel):
    name = "form-ring-merge"
    blocks = 4

    def declares(self) -> dict:
        return {"normwise_merges": 3}


class AllBf16(FormulationKernel):
    """Not a declarable formulation: EVERY dtype's products take bfloat16 operands (float64 and
    float16 too). Its failures span dtypes; likely causes must name one precision for them."""

    name = "form-all-bf16"
    operands = "bfloat16"

    def _operands(self, case: Case):
        work = self._work(case)
        q, k, v = (_to(np.asarray(x).astype(np.float32), "bfloat16") for x in (case.query, case.key, case.value))
        q, k, v = (x.astype(work) for x in (q, k, v))
        g = case.Hq // case.Hkv
        return work, "bfloat16", q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), work(case.effective_scale)

    def _p_format(self, case: Case, fmt: str | None) -> str | None:
        return "bfloat16"


KERNELS: dict[str, type[FormulationKernel]] = {
    cls.name: cls for cls in (F32Bf16, F32Tf32, F16Products, QPrescaled, FillAdd, RingMerge)
}


def with_bug(cls: type[FormulationKernel], bug: str) -> FormulationKernel:
    """``cls`` with one more departure: "mask-off-by-one" (the boolean mask shifted one key to the
    right) or "backward-scale" (the backward's scale 1 % off)."""
    attrs = {"mask-off-by-one": {"mask_shift": True}, "backward-scale": {"bwd_scale": 1.01}}[bug]
    sub = type(f"{cls.__name__}_{bug}", (cls,), {"name": f"{cls.name}+{bug}", **attrs})
    return sub()


def approximate(cls: type[FormulationKernel], how: str) -> FormulationKernel:
    """``cls`` only approximately following its formulation: "noise" (each score times 1 +- 2^-9:
    a few units of float16's precision) or "fill-1e4" (a fill of -1e4 instead of the declared one)."""
    attrs = {"noise": {"score_noise": 2.0**-9}, "fill-1e4": {"fill_override": -1.0e4}}[how]
    sub = type(f"{cls.__name__}_{how}", (cls,), {"name": f"{cls.name}~{how}", **attrs})
    return sub()


# Module-level kernels for ``--impl=tests.formulation_kernels:NAME``: ``all_bf16`` as it is, and each
# formulation kernel with a declaration that says nothing of its formulation (``bare_*``: what a user
# starts from before ``--discover``).
all_bf16 = AllBf16()


def _bare(cls: type[FormulationKernel]) -> FormulationKernel:
    kernel = cls()
    kernel.declaration = kernel.declaration.replace(
        float32_computed_as="float32",
        float16_computed_as="float32",
        scale_applied="scores",
        blocked_fill="-inf",
        normwise_merges=0,
        all_blocked="zeros",
    )
    return kernel


bare_f32_bf16, bare_f32_tf32, bare_f16_products, bare_q_prescaled, bare_fill_add, bare_ring_merge = (
    _bare(cls) for cls in KERNELS.values()
)

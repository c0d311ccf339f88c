"""Deliberately wrong kernels: the evidence that each clause can fail.

``BaseKernel`` is a plain, correct NumPy kernel written with one overridable hook per step of the
formula (scores, scale, blocked mask, head mapping, softmax, output cast, backward). Each mutant
overrides exactly one hook with a bug that real kernels have shipped or that the spec warns about.
The base itself must pass every clause (tests/test_clauses_bite.py checks that), so a mutant's
failure is due to its bug alone. Other self-test modules add mutants with :func:`mutant`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.contract import Case, Declaration, np_dtype

MUTANTS: dict[str, Callable[[], object]] = {}


def mutant(name: str) -> Callable[[type], type]:
    def register(cls: type) -> type:
        if name in MUTANTS:
            raise ValueError(f"mutant name {name!r} is registered twice: each mutant must be its own bug")
        MUTANTS[name] = lambda: cls(name)
        cls.mutant_name = name
        return cls

    return register


def validate_article(case: Case) -> None:
    """000 §8's preconditions as the article raises them (its exception types and messages)."""
    q, k, v = (np.asarray(x) for x in (case.query, case.key, case.value))
    if any(x.ndim != 4 for x in (q, k, v)):
        raise ValueError("Q、K、V 必须是四维张量")
    if q.dtype.kind != "f" and q.dtype != np_dtype("bfloat16"):
        raise TypeError("Q、K、V 必须为浮点张量")
    if any(x.dtype != q.dtype for x in (k, v)):
        raise ValueError("Q、K、V 必须使用相同的 dtype 和 device")
    b, h, _, d_k = q.shape
    if (
        k.shape[0] != b
        or v.shape[:2] != k.shape[:2]
        or h % max(k.shape[1], 1)
        or k.shape[3] != d_k
        or k.shape[2] != v.shape[2]
    ):
        raise ValueError("Q/K 特征维、K/V 长度和 batch/head 维度必须匹配")
    if min(*q.shape, *k.shape, *v.shape) <= 0:
        raise ValueError("各维度必须为正")
    if not 0.0 <= case.dropout_p <= 1.0:
        raise ValueError("dropout_p 必须位于 [0, 1]")


class BaseKernel:
    """A correct kernel with hooks; declares every feature so that every clause applies."""

    mutant_name = "base"

    def __init__(self, name: str = "mutant-base"):
        self.name = name
        self.declaration = Declaration(
            grad=True,
            dropout=False,
            gqa=True,
            bool_mask=True,
            float_mask=True,
            causal=True,
            custom_scale=True,
            all_blocked="zeros",
            returns_weights=False,
            validates_inputs=True,
            deterministic=True,
            batch_invariant=False,
            notes="self-test kernel",
        )

    # -- hooks -----------------------------------------------------------------------------------
    def validate(self, case: Case) -> None:
        """The article's checks (000 §8), its exception types and messages, since validates_inputs=True."""
        validate_article(case)

    def work(self, case: Case):
        return np.float64 if case.dtype == "float64" else np.float32

    def operands(self, case: Case):
        w = self.work(case)
        k = self.expand(case.key.astype(w), case.Hq)
        v = self.expand(case.value.astype(w), case.Hq)
        return case.query.astype(w), k, v

    def expand(self, x: np.ndarray, hq: int) -> np.ndarray:
        return np.repeat(x, hq // x.shape[1], axis=1)

    def raw_scores(self, case: Case, q, k, v):
        return q @ np.swapaxes(k, -1, -2)

    def scale(self, case: Case) -> float:
        return case.effective_scale

    def blocked(self, case: Case) -> np.ndarray:
        shape = case.weights_shape
        b = np.zeros(shape, dtype=bool)
        if case.mask is not None:
            b |= np.broadcast_to(np.asarray(case.mask, dtype=bool), shape)
        if case.is_causal:
            b |= self.causal(case.T, case.S)
        if case.bias is not None:
            b |= np.isneginf(np.broadcast_to(np.asarray(case.bias, dtype=np.float64), shape))
        return b

    def causal(self, T: int, S: int) -> np.ndarray:
        return np.triu(np.ones((T, S), dtype=bool), 1)

    def softmax(self, scores: np.ndarray, blocked: np.ndarray) -> np.ndarray:
        s = np.where(blocked, -np.inf, scores)
        empty = blocked.all(axis=-1, keepdims=True)
        s = np.where(empty, 0.0, s)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return np.where(empty, 0.0, p)

    def finish(self, out: np.ndarray, case: Case) -> np.ndarray:
        return out.astype(np_dtype(case.dtype))

    # -- the formula -----------------------------------------------------------------------------
    def weights(self, case: Case) -> np.ndarray:
        q, k, v = self.operands(case)
        w = self.work(case)
        scores = self.raw_scores(case, q, k, v) * w(self.scale(case))
        if case.bias is not None:
            bias = np.broadcast_to(np.asarray(case.bias, dtype=np.float64), case.weights_shape)
            scores = scores + np.where(np.isneginf(bias), 0.0, bias).astype(w)
        with np.errstate(invalid="ignore", over="ignore"):
            return self.softmax(scores.astype(w), self.blocked(case))

    def forward(self, case: Case) -> np.ndarray:
        self.validate(case)
        _, _, v = self.operands(case)
        p = self.weights(case)
        with np.errstate(invalid="ignore"):
            return self.finish(p @ v, case)

    def kernel_ran(self, case: Case) -> tuple[str, str]:
        """Which kernel ran (the optional perf contract, BACKEND-01): this one has a single path."""
        return "numpy-dense", "self-test kernel: one path, materialises the [B, H, T, S] scores and weights"

    def backward_weights(self, case: Case) -> np.ndarray:
        return self.weights(case)

    def vjp(self, case: Case, grad_out: np.ndarray):
        self.validate(case)
        q, k, v = self.operands(case)
        p = self.backward_weights(case)
        do = grad_out.astype(self.work(case))
        g = case.Hq // case.Hkv
        dp = do @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        scale = self.scale(case)
        dq = ds @ k * scale
        dk = np.swapaxes(ds, -1, -2) @ q * scale
        dv = np.swapaxes(p, -1, -2) @ do

        def fold(x):
            return x.reshape(case.B, case.Hkv, g, *x.shape[2:]).sum(axis=2)

        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), fold(dk).astype(lowp), fold(dv).astype(lowp)


MUTANTS["base"] = lambda: BaseKernel()


@mutant("softmax_query_axis")
class SoftmaxQueryAxis(BaseKernel):
    """误区二: softmax over the query axis (dim=-2) instead of the key axis."""

    def softmax(self, scores, blocked):
        s = np.where(blocked, -np.inf, scores)
        e = np.exp(s - s.max(axis=-2, keepdims=True))
        return np.nan_to_num(e / e.sum(axis=-2, keepdims=True))


@mutant("no_scaling")
class NoScaling(BaseKernel):
    def scale(self, case):
        return 1.0


@mutant("scale_by_dk")
class ScaleByDk(BaseKernel):
    def scale(self, case):
        return 1.0 / case.Dk


@mutant("scale_by_sqrt_dv")
class ScaleBySqrtDv(BaseKernel):
    """Uses the value head dim: indistinguishable from correct whenever Dk == Dv."""

    def scale(self, case):
        return case.Dv**-0.5 if case.scale is None else case.scale


@mutant("mask_after_softmax")
class MaskAfterSoftmax(BaseKernel):
    """§7.3: zero the blocked weights after softmax, without renormalising."""

    def softmax(self, scores, blocked):
        p = super().softmax(scores, np.zeros_like(blocked))
        return np.where(blocked, 0.0, p)


@mutant("mask_sense_inverted")
class MaskSenseInverted(BaseKernel):
    """§10: passes the suite's True = blocked mask to an API where True = may attend."""

    def blocked(self, case):
        if case.mask is None:
            return super().blocked(case)
        return super().blocked(case.replace(mask=~np.asarray(case.mask, dtype=bool)))


@mutant("nan_on_all_blocked")
class NanOnAllBlocked(BaseKernel):
    """Plain softmax over a row of -inf: NaN (nn.MultiheadAttention's long-standing behaviour)."""

    def softmax(self, scores, blocked):
        s = np.where(blocked, -np.inf, scores)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


@mutant("mean_v_on_all_blocked")
class MeanVOnAllBlocked(BaseKernel):
    """A finite fill (-1e9) instead of -inf: all-blocked rows silently average V."""

    def softmax(self, scores, blocked):
        s = np.where(blocked, -1e9, scores)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


@mutant("nan_backward_all_blocked")
class NanBackwardAllBlocked(BaseKernel):
    """§8: forward replaces the NaN after softmax, but the backward still runs through it."""

    def backward_weights(self, case):
        return NanOnAllBlocked.softmax(self, *self._scores_and_blocked(case))

    def _scores_and_blocked(self, case):
        q, k, v = self.operands(case)
        return self.raw_scores(case, q, k, v) * self.scale(case), self.blocked(case)


@mutant("no_upcast")
class NoUpcast(BaseKernel):
    """§8: QK^T formed and stored in the input's low precision (inf in float16 past 65504)."""

    def raw_scores(self, case, q, k, v):
        s = super().raw_scores(case, q, k, v)
        if case.dtype in ("float16", "bfloat16"):
            with np.errstate(over="ignore"):
                s = s.astype(np_dtype(case.dtype)).astype(np.float32)
        return s


@mutant("value_in_similarity")
class ValueInSimilarity(BaseKernel):
    """误区一: V takes part in the similarity (scores from Q·V^T where the shapes allow it)."""

    def raw_scores(self, case, q, k, v):
        if q.shape[-1] == v.shape[-1]:
            return q @ np.swapaxes(k + v, -1, -2)
        return super().raw_scores(case, q, k, v)


@mutant("output_length_s")
class OutputLengthS(BaseKernel):
    """误区三: treats cross-attention as square, producing S output rows instead of T."""

    def forward(self, case):
        out = super().forward(case)
        if case.S == case.T:
            return out
        idx = np.arange(case.S) % case.T
        return out[:, :, idx, :]


@mutant("weights_transposed")
class WeightsTransposed(BaseKernel):
    """Returns [B,H,S,T] weights from an otherwise correct kernel."""

    def __init__(self, name="weights_transposed"):
        super().__init__(name)
        self.declaration = self.declaration.replace(returns_weights=True)

    def forward_with_weights(self, case):
        w = self.weights(case)
        return self.forward(case), np.swapaxes(w, -1, -2).astype(np_dtype(case.dtype))


@mutant("output_float32")
class OutputFloat32(BaseKernel):
    """Returns float32 for float16/bfloat16 inputs: forgets to restore the input dtype."""

    def finish(self, out, case):
        return out.astype(np.float32) if case.dtype in ("float16", "bfloat16") else super().finish(out, case)


@mutant("causal_off_by_one")
class CausalOffByOne(BaseKernel):
    """Blocks the diagonal too (triu(0) instead of triu(1))."""

    def causal(self, T, S):
        return np.triu(np.ones((T, S), dtype=bool), 0)


@mutant("gqa_wrong_mapping")
class GqaWrongMapping(BaseKernel):
    """Query head h reads kv head h % Hkv instead of h // (Hq // Hkv) (tile instead of repeat)."""

    def expand(self, x, hq):
        return np.tile(x, (1, hq // x.shape[1], 1, 1))


@mutant("batch_mask_mixup")
class BatchMaskMixup(BaseKernel):
    """Uses the first batch item's mask for every item (wrong broadcast of a [B,...] mask)."""

    def blocked(self, case):
        if case.mask is None or np.ndim(case.mask) < 4 or np.shape(case.mask)[0] == 1:
            return super().blocked(case)
        m = np.asarray(case.mask, dtype=bool)
        return super().blocked(case.replace(mask=np.broadcast_to(m[:1], m.shape)))


@mutant("ignore_custom_scale")
class IgnoreCustomScale(BaseKernel):
    """Always 1/sqrt(Dk): the ``scale`` argument is accepted and dropped."""

    def scale(self, case):
        return case.Dk**-0.5


@mutant("decode_gqa_scale_from_dv")
class DecodeGqaScaleFromDv(BaseKernel):
    """A decode path specialised for T = 1 with grouped heads and Dk != Dv (latent attention, e.g.
    Dk = 192 against Dv = 128) that takes the softmax scale from the value head dim: every other
    shape runs the general path and is right."""

    def scale(self, case):
        if case.T == 1 and case.is_gqa and case.Dk != case.Dv and case.scale is None:
            return case.Dv**-0.5
        return super().scale(case)


@mutant("gqa_weights_of_first_head")
class GqaWeightsOfFirstHead(BaseKernel):
    """Returns weights materialised per kv head ([B, Hkv, T, S], the group's first query head) and
    repeated to Hq heads for the caller; the output itself is computed right."""

    def __init__(self, name="gqa_weights_of_first_head"):
        super().__init__(name)
        self.declaration = self.declaration.replace(returns_weights=True)

    def forward_with_weights(self, case):
        w = self.weights(case)
        g = case.Hq // case.Hkv
        w = np.repeat(w[:, ::g], g, axis=1)
        return self.forward(case), np.ascontiguousarray(w).astype(np_dtype(case.dtype))


@mutant("half_output_cast")
class HalfOutputCast(BaseKernel):
    """Restores every 16-bit input dtype through ``.half()`` (float16) before the final cast: right
    for float16, and for bfloat16 while |out| < 65504; larger bfloat16 outputs become inf."""

    def finish(self, out, case):
        if case.dtype == "bfloat16":
            with np.errstate(over="ignore"):
                out = out.astype(np.float16)
        return super().finish(out, case)

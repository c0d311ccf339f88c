"""Mutants for the dropout, gradient, metamorphic, determinism, input and bad-input clauses.

Three correct kernels live here beside the bugs, because ``BaseKernel`` declares neither dropout, nor
a backward split into steps, nor batch invariance: :class:`DropoutKernel` (inverted dropout after
softmax, the article's ``F.dropout(weights, ...)``), :class:`GradKernel` (the backward with one hook
per step) and :class:`BatchInvariantKernel` (each batch item computed alone). They are not
registered as mutants (nothing should kill them); each mutant below subclasses one of the correct
kernels and overrides exactly one hook.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, NotApplicable, np_dtype
from tests.mutants import BaseKernel, mutant


# -- dropout ---------------------------------------------------------------------------------------
class DropoutKernel(BaseKernel):
    """Correct: weights dropped after softmax with keep probability 1 - p, kept ones scaled by 1/(1-p),
    the keep mask drawn from ``case.seed`` (so forward and vjp agree, and a seed reproduces); the
    backward is the gradient of that dropped forward (DROPOUT-GRAD-01)."""

    def __init__(self, name: str = "dropout-base"):
        super().__init__(name)
        self.declaration = self.declaration.replace(dropout=True)

    def rng(self, case: Case) -> np.random.Generator:
        return np.random.default_rng(case.seed)

    def keep(self, case: Case) -> np.ndarray:
        return self.rng(case).random(case.weights_shape) >= case.dropout_p

    def factor(self, case: Case) -> np.ndarray:
        """keep / (1 - p) per weight; all zeros at p = 1."""
        if case.dropout_p >= 1.0:
            return np.zeros(case.weights_shape)
        return self.keep(case) / (1.0 - case.dropout_p)

    def drop(self, case: Case, p: np.ndarray) -> np.ndarray:
        if case.dropout_p <= 0:
            return p
        return (p * self.factor(case)).astype(p.dtype)

    def forward(self, case: Case) -> np.ndarray:
        self.validate(case)
        _, _, v = self.operands(case)
        with np.errstate(invalid="ignore"):
            return self.finish(self.drop(case, self.weights(case)) @ v, case)

    # -- the backward of the dropped forward, one hook per step (tests/mutants_dropout_grad.py) --------
    def backward_keep_scale(self, case: Case) -> np.ndarray:
        """Z the backward uses: the forward's own keep / (1 - p), regenerated from the seed."""
        return self.factor(case)

    def dv_weights(self, p: np.ndarray, z: np.ndarray) -> np.ndarray:
        """dV = W^T dO with W = P * Z, the weights the forward multiplied V by."""
        return p * z

    def dropout_score_grad(self, p: np.ndarray, z: np.ndarray, dw: np.ndarray) -> np.ndarray:
        """dS = P * (dP - D) with dP = Z * dW (dW = dO V^T) and D = rowsum(P * dP) = rowsum(dO * O)."""
        dp = dw * z
        return p * (dp - (p * dp).sum(axis=-1, keepdims=True))

    def vjp(self, case: Case, grad_out: np.ndarray):
        if case.dropout_p <= 0:
            return super().vjp(case, grad_out)
        self.validate(case)
        q, k, v = self.operands(case)
        w = self.work(case)
        p = self.backward_weights(case)
        z = self.backward_keep_scale(case).astype(w)
        do = grad_out.astype(w)
        g = case.Hq // case.Hkv
        ds = self.dropout_score_grad(p, z, do @ np.swapaxes(v, -1, -2))
        dq = ds @ k * self.scale(case)
        dk = np.swapaxes(ds, -1, -2) @ q * self.scale(case)
        dv = np.swapaxes(self.dv_weights(p, z), -1, -2) @ do

        def fold(x):
            return x.reshape(case.B, case.Hkv, g, *x.shape[2:]).sum(axis=2)

        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), fold(dk).astype(lowp), fold(dv).astype(lowp)


@mutant("dropout_no_rescale")
class DropoutNoRescale(DropoutKernel):
    """Zeroes dropped weights but forgets the 1/(1-p) of inverted dropout: the output shrinks by 1-p."""

    def factor(self, case):
        return self.keep(case).astype(np.float64)


@mutant("dropout_before_softmax")
class DropoutBeforeSoftmax(DropoutKernel):
    """Drops (zeroes and rescales) the scores, then softmaxes: §7.3 puts dropout after softmax."""

    def weights(self, case):
        q, k, v = self.operands(case)
        w = self.work(case)
        scores = self.raw_scores(case, q, k, v) * w(self.scale(case))
        if case.dropout_p > 0:
            scores = (scores * self.factor(case)).astype(w)
        with np.errstate(invalid="ignore", over="ignore"):
            return self.softmax(scores, self.blocked(case))

    def drop(self, case, p):
        return p


@mutant("dropout_ignores_seed")
class DropoutIgnoresSeed(DropoutKernel):
    """Draws the keep mask from a fresh, unseeded generator: nothing reproduces."""

    def rng(self, case):
        return np.random.default_rng()


@mutant("dropout_keep_prob_swapped")
class DropoutKeepProbSwapped(DropoutKernel):
    """Keeps each weight with probability p (the keep_prob / rate confusion), still scaling by 1/(1-p)."""

    def keep(self, case):
        return self.rng(case).random(case.weights_shape) < case.dropout_p

    def drop(self, case, p):  # no shortcut at p = 0, as in F.dropout(training=True)
        return (p * self.factor(case)).astype(p.dtype)


@mutant("dropout_p1_nan")
class DropoutP1Nan(DropoutKernel):
    """Divides by 1 - p unguarded: p = 1 gives 0 * inf = NaN instead of zeros."""

    def factor(self, case):
        with np.errstate(divide="ignore"):
            return self.keep(case) * np.divide(1.0, 1.0 - case.dropout_p)

    def drop(self, case, p):
        if case.dropout_p <= 0:
            return p
        with np.errstate(invalid="ignore"):
            return (p * self.factor(case)).astype(p.dtype)


# -- gradients -------------------------------------------------------------------------------------
class GradKernel(BaseKernel):
    """Correct backward, one hook per step (softmax Jacobian, dQ scale, fold of dK over a GQA group)."""

    def softmax_backward(self, p: np.ndarray, dp: np.ndarray) -> np.ndarray:
        return p * (dp - (dp * p).sum(axis=-1, keepdims=True))

    def dq_scale(self, case: Case) -> float:
        return self.scale(case)

    def fold_dk(self, x: np.ndarray, case: Case) -> np.ndarray:
        g = case.Hq // case.Hkv
        return x.reshape(case.B, case.Hkv, g, *x.shape[2:]).sum(axis=2)

    def vjp(self, case: Case, grad_out: np.ndarray):
        self.validate(case)
        q, k, v = self.operands(case)
        p = self.backward_weights(case)
        do = grad_out.astype(self.work(case))
        g = case.Hq // case.Hkv
        ds = self.softmax_backward(p, do @ np.swapaxes(v, -1, -2))
        dq = ds @ k * self.dq_scale(case)
        dk = np.swapaxes(ds, -1, -2) @ q * self.scale(case)
        dv = (np.swapaxes(p, -1, -2) @ do).reshape(case.B, case.Hkv, g, case.S, case.Dv).sum(axis=2)
        lowp = np_dtype(case.dtype)
        return dq.astype(lowp), self.fold_dk(dk, case).astype(lowp), dv.astype(lowp)


@mutant("grad_no_softmax_row_term")
class GradNoSoftmaxRowTerm(GradKernel):
    """dS = P * dP: forgets the row term -P * sum(dP * P) of the softmax Jacobian."""

    def softmax_backward(self, p, dp):
        return p * dp


@mutant("grad_dq_missing_scale")
class GradDqMissingScale(GradKernel):
    """dQ = dS K without the 1/sqrt(d_k) the forward multiplied by."""

    def dq_scale(self, case):
        return 1.0


@mutant("grad_dk_not_summed_over_group")
class GradDkNotSummedOverGroup(GradKernel):
    """GQA: dK[kv head] is overwritten by each query head of its group (``=`` for ``+=``), so only the
    last head's contribution survives."""

    def fold_dk(self, x, case):
        g = case.Hq // case.Hkv
        return x.reshape(case.B, case.Hkv, g, *x.shape[2:])[:, :, -1]


# -- metamorphic -----------------------------------------------------------------------------------
@mutant("softmax_no_max_subtraction")
class SoftmaxNoMaxSubtraction(BaseKernel):
    """exp(s) / sum exp(s) without subtracting the row max (003: "它避免直接计算过大的指数"):
    right for small scores, inf/inf or 0/0 = NaN once a row's scores are shifted far enough."""

    def softmax(self, scores, blocked):
        empty = blocked.all(axis=-1, keepdims=True)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(np.where(blocked | empty, -np.inf, scores))
            p = e / e.sum(axis=-1, keepdims=True)
        return np.where(empty, 0.0, p)


@mutant("online_softmax_no_rescale")
class OnlineSoftmaxNoRescale(BaseKernel):
    """Tiled online softmax that forgets to rescale the running sum when the running max grows:
    the result then depends on where the largest score sits, i.e. on the order of the keys."""

    TILE = 4

    def softmax(self, scores, blocked):
        s = np.where(blocked, -np.inf, scores)
        m = np.full(s.shape[:-1], -np.inf, dtype=s.dtype)
        total = np.zeros(s.shape[:-1], dtype=s.dtype)
        with np.errstate(invalid="ignore"):
            for start in range(0, s.shape[-1], self.TILE):
                tile = s[..., start : start + self.TILE]
                m = np.maximum(m, tile.max(axis=-1))
                safe = np.where(np.isneginf(m), 0.0, m)
                total = total + np.exp(tile - safe[..., None]).sum(axis=-1)  # old total not rescaled
            safe = np.where(np.isneginf(m), 0.0, m)
            p = np.exp(s - safe[..., None]) / np.where(total > 0, total, 1.0)[..., None]
        return np.where(blocked.all(axis=-1, keepdims=True), 0.0, p)


# -- determinism and batch invariance --------------------------------------------------------------
@mutant("nondeterministic_noise")
class NondeterministicNoise(BaseKernel):
    """Adds noise of a few ulps from an unseeded generator, like a kernel whose atomics reorder."""

    def finish(self, out, case):
        eps = float(np.finfo(np.float32).eps) if case.dtype != "float64" else float(np.finfo(np.float64).eps)
        lowp = np_dtype(case.dtype)
        if case.dtype in ("float16", "bfloat16"):
            eps = 2.0**-8 if case.dtype == "float16" else 2.0**-6
        noise = np.random.default_rng().standard_normal(out.shape) * eps * np.abs(out)
        return (out + noise).astype(lowp)


class BatchInvariantKernel(BaseKernel):
    """Correct and batch invariant by construction: each batch item is computed alone, so its bits
    cannot depend on the batch around it. Declares ``batch_invariant=True``, so that
    BATCH-INVARIANT-02 runs on a correct kernel (the base declares False and is not applicable)."""

    def __init__(self, name: str = "batch-invariant-base"):
        super().__init__(name)
        self.declaration = self.declaration.replace(batch_invariant=True)

    @staticmethod
    def _item(x, b: int, B: int):
        if x is None or np.ndim(x) < 4 or np.shape(x)[0] != B or B == 1:
            return x  # no batch axis of its own: broadcast over the batch as it is
        return np.asarray(x)[b : b + 1]

    def forward(self, case: Case) -> np.ndarray:
        self.validate(case)
        items = []
        for b in range(case.B):
            item = case.replace(
                query=case.query[b : b + 1],
                key=case.key[b : b + 1],
                value=case.value[b : b + 1],
                mask=self._item(case.mask, b, case.B),
                bias=self._item(case.bias, b, case.B),
            )
            items.append(super().forward(item))
        return np.concatenate(items, axis=0)


@mutant("batch_dependent_reduction")
class BatchDependentReduction(BaseKernel):
    """Splits the P·V reduction over keys into chunks whose size depends on the batch size (a split-K
    heuristic keyed on B): an item's bits change with the company it keeps."""

    def __init__(self, name="batch_dependent_reduction"):
        super().__init__(name)
        self.declaration = self.declaration.replace(batch_invariant=True)

    def forward(self, case):
        self.validate(case)
        _, _, v = self.operands(case)
        p = self.weights(case)
        chunk = max(1, case.S // (1 + case.B))
        out = np.zeros(p.shape[:-1] + (v.shape[-1],), dtype=p.dtype)
        with np.errstate(invalid="ignore"):
            for start in range(0, case.S, chunk):
                out = out + p[..., start : start + chunk] @ v[..., start : start + chunk, :]
        return self.finish(out, case)


# -- inputs ----------------------------------------------------------------------------------------
@mutant("scales_query_in_place")
class ScalesQueryInPlace(BaseKernel):
    """Multiplies the caller's query by 1/sqrt(d_k) in place (``query.mul_(scale)``), then uses it."""

    def forward(self, case):
        q = case.query
        np.multiply(q, np.asarray(self.scale(case), dtype=q.dtype), out=q, casting="unsafe")
        return super().forward(case.replace(scale=1.0))

    def scale(self, case):
        return case.effective_scale


@mutant("keeps_input_as_scratch")
class KeepsInputAsScratch(BaseKernel):
    """Keeps the caller's key array as a scratch buffer for the next call of the same shape (to save
    an allocation) and stages that call's keys in it: every call is right and leaves its own inputs
    alone, and the previous caller's key is overwritten after its call returned."""

    def __init__(self, name="keeps_input_as_scratch"):
        super().__init__(name)
        self._scratch: np.ndarray | None = None

    def forward(self, case):
        out = super().forward(case)
        buf, key = self._scratch, case.key
        if buf is not None and buf is not key and buf.shape == key.shape and buf.dtype == key.dtype:
            np.copyto(buf, key)
        self._scratch = key
        return out


@mutant("assumes_c_contiguous")
class AssumesCContiguous(BaseKernel):
    """Reads each array's raw memory in storage order and reshapes it as if it were C-contiguous."""

    def operands(self, case):
        raw = [np.asarray(x).ravel(order="K").reshape(np.shape(x)) for x in (case.query, case.key, case.value)]
        return super().operands(case.replace(query=raw[0], key=raw[1], value=raw[2]))


# -- bad input -------------------------------------------------------------------------------------
@mutant("validates_nothing")
class ValidatesNothing(BaseKernel):
    """Declares validates_inputs=True, checks nothing: broadcasting and casting turn bad calls into results."""

    def validate(self, case):
        return None

    def forward(self, case):
        try:
            return super().forward(case)
        except Exception:  # noqa: BLE001 - whatever NumPy raises, return *something*, as lax kernels do
            return np.zeros(np.shape(case.query)[:-1] + np.shape(case.value)[-1:], dtype=np.float32)


@mutant("validation_by_assert")
class ValidationByAssert(BaseKernel):
    """The article's checks and messages written as ``assert`` (gone under ``python -O``; AssertionError
    instead of the documented ValueError/TypeError)."""

    def validate(self, case):
        try:
            super().validate(case)
        except (ValueError, TypeError) as exc:
            raise AssertionError(str(exc)) from None


@mutant("rejects_everything")
class RejectsEverything(BaseKernel):
    """Raises ValueError on every call, valid or not (a validation condition written the wrong way
    round): every bad input is "rejected", so only the valid neighbours show that nothing works."""

    def validate(self, case):
        raise ValueError("invalid input")


@mutant("refuses_bad_input_as_not_applicable")
class RefusesBadInputAsNotApplicable(BaseKernel):
    """Turns its own validation errors into ``NotApplicable`` ("I do not take this case") instead of
    rejecting the input: a refusal, which the suite reports as not applicable, never as a rejection."""

    def forward(self, case):
        try:
            return super().forward(case)
        except (ValueError, TypeError) as exc:
            raise NotApplicable(f"unsupported input: {exc}") from None


@mutant("bad_input_crashes_keyerror")
class BadInputCrashesKeyError(BaseKernel):
    """Checks nothing itself and looks each problem up in a table of compiled kernels keyed by
    (rank, dtype, head ratio, ...): an invalid problem has no entry and ends in a KeyError, a crash
    that happens to stop the call, not a documented rejection."""

    def validate(self, case):
        try:
            super().validate(case)
        except (ValueError, TypeError):
            shapes = tuple(np.shape(x) for x in (case.query, case.key, case.value))
            raise KeyError(f"no kernel compiled for shapes {shapes}, dtype {np.asarray(case.query).dtype}") from None


# -- the V = I probe ---------------------------------------------------------------------------
@mutant("v_channel_scale_nan")
class VChannelScaleNan(BaseKernel):
    """Quantised P·V with a per-channel scale of V (as int8/fp8 kernels do): out = (P @ (V / s)) * s
    with s = max |V| per channel, unguarded, so a value channel that is all zero gives 0/0 = NaN.
    Real inputs never have such a channel; the widened V = I probe does, in its padding columns."""

    def forward(self, case):
        self.validate(case)
        _, _, v = self.operands(case)
        p = self.weights(case)
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.abs(v).max(axis=-2, keepdims=True)
            out = (p @ (v / s)) * s
        return self.finish(out, case)


@mutant("dropout_drops_everything")
class DropoutDropsEverything(DropoutKernel):
    """Treats any dropout_p > 0 as "drop all" (a keep test written ``r >= 1 - p`` on the wrong
    variable, here: keep nothing): the output is 0, and no kept weight is ever wrong."""

    def keep(self, case):
        return np.zeros(case.weights_shape, dtype=bool)


@mutant("dropout_tiny_rate_ignored")
class DropoutTinyRateIgnored(DropoutKernel):
    """A rate below 1 % is taken for none (a fast path for "practically no dropout"): nothing is dropped
    or rescaled at p = 0.001, right at every rate the statistics clauses used before."""

    def factor(self, case: Case) -> np.ndarray:
        if 0 < case.dropout_p < 0.01:
            return np.ones(case.weights_shape)
        return super().factor(case)


@mutant("dropout_high_rate_clamped")
class DropoutHighRateClamped(DropoutKernel):
    """The keep threshold is clamped at 0.95 (a guard against keeping nothing): at p = 0.995 five percent
    of the weights survive, rescaled by 1/(1 - p) as if one in two hundred did."""

    def keep(self, case: Case) -> np.ndarray:
        return self.rng(case).random(case.weights_shape) >= min(case.dropout_p, 0.95)

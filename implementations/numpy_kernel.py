"""A NumPy kernel, written independently of the oracle, as the embedded default adapter.

It is the shape of a production kernel rather than of the formula: keys are processed in tiles with
an online (running max, running sum) softmax, low-precision inputs are upcast to float32 before the
QK^T product (000_f3dcd408372d9e02.txt §8, "先提高精度，再做点积"), probabilities are formed in the
working precision, and every (batch, head) slice goes through the same operations as every other
(one GEMM per slice and key tile, reductions along each row only), so that an item's result never
depends on the rest of the batch: all slices are computed at once, a slice's numbers are those it
would get alone. Its backward recomputes the probabilities (as FlashAttention does) instead of
storing them, and ``forward`` never holds a whole score matrix: a first pass over the key tiles
finds each row's max and denominator, a second recomputes the tile's probabilities and accumulates
P V, so its peak extra memory grows linearly in S at T = S (declared ``memory_scaling="linear"`` and
measured by MEM-SCALING-01; ``forward_with_weights`` returns the weights, and the dropout path draws
a [B, H, T, S] keep-mask, so those two are quadratic). Both passes form the probabilities by the
formula ``forward_with_weights`` returns them by. Because it shares no code with
``conformance.oracle``, agreement between the two is evidence about both.

Conventions: boolean mask True = blocked (the suite's own); all-blocked rows give zero weights,
zero output and zero gradients; ``is_causal`` aligned top-left (configurable); GQA head h reads kv
head h // (Hq // Hkv); dropout keeps each weight with probability 1 - p from a generator seeded by
``case.seed`` and scales kept weights by 1 / (1 - p).

"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration, capabilities, np_dtype

TILE = 64  # keys per step of the online softmax (the first pass, and the weights path)
CHUNK = 256  # keys per P V product in the streaming forward's second pass (tiles of TILE in the first)


def _validate(case: Case) -> None:
    q, k, v = case.query, case.key, case.value
    if any(np.ndim(x) != 4 for x in (q, k, v)):
        raise ValueError("query, key and value must be 4-D [B, H, L, D]")
    floats = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np_dtype("bfloat16")}
    if any(np.asarray(x).dtype not in floats for x in (q, k, v)):
        raise TypeError("query, key and value must be floating point")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"query, key, value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, T, Dk = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[1] != v.shape[1]:
        raise ValueError("batch and kv-head dims of query, key, value must match")
    if Hq % k.shape[1]:
        raise ValueError(f"query heads {Hq} must be a multiple of kv heads {k.shape[1]}")
    if k.shape[3] != Dk or k.shape[2] != v.shape[2]:
        raise ValueError("key feature dim must equal query's, and key/value lengths must match")
    if min(*q.shape, *k.shape, *v.shape) <= 0:
        raise ValueError("every dimension must be positive")
    if not 0.0 <= case.dropout_p <= 1.0:
        raise ValueError("dropout_p must lie in [0, 1]")


def _finite(row_max: np.ndarray, work) -> np.ndarray:
    """A row max to subtract before ``exp``: 0 where the row has seen no key yet (max ``-inf``)."""
    return np.where(np.isneginf(row_max), 0.0, row_max).astype(work)


def _online_step(running_max: np.ndarray, running_sum: np.ndarray, s: np.ndarray, work):
    """One key tile of the online softmax: each row's (max, denominator) after the tile's scores ``s``.

    The streaming forward's first pass and ``_probabilities`` take the same steps, so that the two
    paths' probabilities are the very same numbers (written once here for that reason)."""
    new_max = np.maximum(running_max, s.max(axis=-1))
    safe = _finite(new_max, work)
    with np.errstate(invalid="ignore"):
        running_sum = running_sum * np.exp(np.where(np.isneginf(running_max), -np.inf, running_max - safe))
    return new_max, running_sum + np.exp(s - safe[..., None]).sum(axis=-1)


class NumpyAdapter:
    name = "numpy"

    def __init__(self, causal_alignment: str = "top-left", tile: int = TILE):
        self.tile = tile
        self.declaration = Declaration(
            **capabilities(returns_weights=True),
            causal_alignment=causal_alignment,
            all_blocked="zeros",
            mask_sense="blocked",
            batch_invariant=True,
            validates_inputs=True,
            presents=frozenset({"memory", "identity"}),  # it reads the case's own arrays, views and all
            memory_scaling="linear",
            backend="numpy-tiled",
            notes="tiled online-softmax NumPy kernel; float32 compute for float32/float16/bfloat16; "
            "forward without dropout streams keys (linear memory), the weights and dropout paths keep T x S",
        )

    framework = "numpy"

    # -- pieces ----------------------------------------------------------------------------------
    @staticmethod
    def _work(case: Case):
        return np.float64 if case.dtype == "float64" else np.float32

    def _operands(self, case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q [B, Hq, T, Dk], K^T [B, Hq, Dk, S] and V [B, Hq, S, Dv] in the working precision, each query
        head beside the kv head it reads (h // (Hq // Hkv)); K^T contiguous so that every tile's product
        is one GEMM per slice."""
        work = self._work(case)
        heads = np.arange(case.Hq) // (case.Hq // case.Hkv)
        q = np.asarray(case.query).astype(work)
        kt = np.ascontiguousarray(np.swapaxes(np.asarray(case.key)[:, heads], -1, -2)).astype(work)
        v = np.asarray(case.value)[:, heads].astype(work)
        return q, kt, v

    def _additive_tile(self, case: Case, start: int, stop: int) -> np.ndarray:
        """[B, Hq, T, stop - start]: key columns ``start:stop`` of the additive term (bias, and -inf where
        blocked), computed without the other columns."""
        work = self._work(case)
        full = (case.B, case.Hq, case.T, case.S)
        add = np.zeros((*full[:3], stop - start), dtype=work)
        if case.bias is not None:
            add += np.broadcast_to(np.asarray(case.bias, dtype=np.float64), full)[..., start:stop].astype(work)
        if case.mask is not None:
            add[np.broadcast_to(np.asarray(case.mask, dtype=bool), full)[..., start:stop]] = -np.inf
        if case.is_causal:
            shift = 0 if self.declaration.causal_alignment == "top-left" else case.S - case.T
            add[..., np.arange(start, stop)[None, :] > np.arange(case.T)[:, None] + shift] = -np.inf
        return add

    def _streamed(self, case: Case) -> np.ndarray:
        """The streaming forward's output, [B, Hq, T, Dv] in the working precision."""
        work = self._work(case)
        lowp = np_dtype(case.dtype)
        q, kt, v = self._operands(case)
        scale = work(case.effective_scale)
        S = case.S
        running_max = np.full(q.shape[:3], -np.inf, dtype=work)
        running_sum = np.zeros(q.shape[:3], dtype=work)
        for start in range(0, S, self.tile):  # pass 1: row max and denominator, as _probabilities
            stop = min(start + self.tile, S)
            s = (q @ kt[..., start:stop]) * scale + self._additive_tile(case, start, stop)
            running_max, running_sum = _online_step(running_max, running_sum, s, work)
        safe = _finite(running_max, work)[..., None]
        live = (running_sum > 0)[..., None]
        total = running_sum[..., None]
        acc = np.zeros((*q.shape[:3], case.Dv), dtype=work)
        for start in range(0, S, CHUNK):  # pass 2: the same probabilities, tile by tile, times V
            stop = min(start + CHUNK, S)
            s = (q @ kt[..., start:stop]) * scale + self._additive_tile(case, start, stop)
            e = np.exp(s - safe)
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(live, e / total, 0.0).astype(work)
            acc += p.astype(lowp).astype(work) @ v[..., start:stop, :]
        return acc

    def kernel_ran(self, case: Case) -> tuple[str, str]:
        """Which of this kernel's paths ``forward`` takes for ``case`` (self-reported: it is one kernel)."""
        if case.dropout_p > 0:
            return "numpy-weights", "forward with dropout goes through forward_with_weights (keeps T x S)"
        return "numpy-tiled", f"forward streams keys in tiles of {self.tile} then {CHUNK} (no T x S buffer)"

    @staticmethod
    def _keep(case: Case) -> np.ndarray | None:
        if case.dropout_p <= 0:
            return None
        rng = np.random.default_rng(case.seed)
        return rng.random((case.B, case.Hq, case.T, case.S)) >= case.dropout_p

    def _probabilities(self, case: Case, q: np.ndarray, kt: np.ndarray) -> np.ndarray:
        """Normalised weights [B, Hq, T, S] of :meth:`_operands`' Q and K^T, tile by tile with a running max
        (online softmax)."""
        work = self._work(case)
        scale = work(case.effective_scale)
        S = case.S
        running_max = np.full(q.shape[:3], -np.inf, dtype=work)
        running_sum = np.zeros(q.shape[:3], dtype=work)
        scores = np.empty((*q.shape[:3], S), dtype=work)
        for start in range(0, S, self.tile):
            stop = min(start + self.tile, S)
            s = (q @ kt[..., start:stop]) * scale + self._additive_tile(case, start, stop)
            scores[..., start:stop] = s
            running_max, running_sum = _online_step(running_max, running_sum, s, work)
        safe = _finite(running_max, work)
        e = np.exp(scores - safe[..., None])
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(running_sum[..., None] > 0, e / running_sum[..., None], 0.0).astype(work)
        return p

    # -- contract ----------------------------------------------------------------------------------
    def forward_with_weights(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        _validate(case)
        work = self._work(case)
        lowp = np_dtype(case.dtype)
        q, kt, v = self._operands(case)
        p = self._probabilities(case, q, kt)
        keep = self._keep(case)
        if keep is not None:
            kept = p / work(1.0 - case.dropout_p) if case.dropout_p < 1 else 0.0
            p = np.where(keep, kept, 0.0).astype(work)
        weights = p.astype(lowp)
        out = (weights.astype(work) @ v).astype(lowp)
        return out, weights

    def forward(self, case: Case) -> np.ndarray:
        if case.dropout_p > 0:
            return self.forward_with_weights(case)[0]
        _validate(case)
        return self._streamed(case).astype(np_dtype(case.dtype))

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        _validate(case)
        work = self._work(case)
        lowp = np_dtype(case.dtype)
        scale = work(case.effective_scale)
        q, kt, v = self._operands(case)
        p = self._probabilities(case, q, kt)
        keep = self._keep(case)
        if keep is not None:
            factor = keep / work(1.0 - case.dropout_p) if case.dropout_p < 1 else np.zeros_like(p)
        else:
            factor = work(1.0)
        do = np.asarray(grad_out).astype(work)
        dv = np.swapaxes(p * factor, -1, -2) @ do
        dp = (do @ np.swapaxes(v, -1, -2)) * factor
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        dq = (ds @ np.swapaxes(kt, -1, -2)) * scale
        dk = (np.swapaxes(ds, -1, -2) @ q) * scale
        # each query head's dK and dV, summed over the query heads that read one kv head, in head order
        fold = (case.B, case.Hkv, case.Hq // case.Hkv)
        dk = dk.reshape(*fold, *dk.shape[2:]).sum(axis=2)
        dv = dv.reshape(*fold, *dv.shape[2:]).sum(axis=2)
        return dq.astype(lowp), dk.astype(lowp), dv.astype(lowp)

"""MLX's ``mx.fast.scaled_dot_product_attention`` on the CPU, backward through ``mx.vjp``.

Translation of a ``Case`` (why each step exists):

* arrays: ``mx.array`` turns a float64 NumPy array into float32 unless told otherwise, so every
  input is created with its own dtype (``dtype=mx.float64`` ...), from a contiguous copy (``mx.array``
  copies anyway and refuses views with negative strides); results come back through float32 for
  bfloat16 (exact) and in their own dtype otherwise. Everything runs on ``mx.cpu``.
* layout [B, N, T, D] is MLX's own; GQA is native (k, v keep their kv heads).
* mask: a boolean array (True = keep: ``~mask``), an additive array, or the string ``"causal"``
  (aligned bottom-right: "the last query aligns with the last key"). One mask argument only, so a
  causal case with a mask gets the causal part folded into it, bottom-right (the declared
  alignment), and a boolean mask with a bias becomes one additive mask with ``-inf`` (declared
  ``masks_combined``). An additive mask "must promote to the promoted type of q, k, and v", so it is
  passed in the input dtype.
* ``scale`` is required by MLX: the case's effective scale. ``sinks`` (one logit per query head)
  go to MLX's ``sinks`` argument.

Measured (mlx 0.32.4 CPU; tests/test_adapter_declarations.py re-measures): rows all blocked by the
boolean mask give the mean of V, all ``-inf`` rows NaN; ``"causal"`` bottom-right; float64 computed
at float32 level (MLX's softmax "is performed in float32 regardless of the input precision").
No dropout argument.

Input validation (000 §8's preconditions; ``mx.fast.scaled_dot_product_attention`` called directly,
2026-12-05): inputs that are not 4-D, integer inputs, a batch, head count, feature dim or K/V length
that does not fit and masks that do not broadcast are refused with MLX's ValueError. Q, K and V of
different float dtypes are computed in their promoted type on purpose: its docstring speaks of "the
promoted type of ``q``, ``k``, and ``v``" (measured: a float32 query with a float64 key gives a float64
output, with a float16 key a float32 one); declared ``accepts_invalid``.

Its formulation (declared; conformance/oracle_formulations.py), reproduced by calling
``mx.fast.scaled_dot_product_attention`` directly with V = I (the weights themselves): for float16
and bfloat16 it multiplies Q by the scale *as a number of the input dtype* (``scale_applied=query``),
forms Q K^T in the input dtype (float32 accumulation, the result rounded: past 65504 it is inf;
``float16_computed_as=float16-masked``, ``bfloat16_computed_as=bfloat16-masked``), runs the softmax
in float32 and rounds P: the weights equal ``round(softmax(round(round(Q round(scale)) K^T)))`` bitwise
in 100 % of elements (8 cases, D = 48, scales 1/sqrt(48) and 0.3, each dtype; 2026-12-03), as MLX's
own fallback in mlx/fast.cpp writes it (``multiply(array(scale, dtype), q)``, then ``matmul``). A
boolean mask's blocked keys are *replaced* by ``finfo(scores.dtype).min`` there (``where``;
``blocked_fill=set:min``): a row blocked entirely is uniform, the mean of V. An additive mask is
taken in the input dtype and added to the rounded product there, so s + M is rounded once more
(``-masked``; ``-products`` is the same without M): on a bfloat16 case with M (q[1,5,127,6], a
boolean mask, M in [-2, 2] with -inf entries, causal), MLX's output equals that computation bitwise
on every element, and is 1.24 x the ``-products`` allowance away from ``-products``' answer where P V
cancels (2026-12-03).
"""

from __future__ import annotations

import importlib.metadata

import numpy as np

from conformance.contract import DTYPES, Case, Declaration, NotApplicable, capabilities, np_dtype
from implementations._masks import bias_with, blocked

try:  # the optional extra ``mlx``; without it the adapter says why it cannot run
    import mlx.core as mx
except ImportError as exc:  # pragma: no cover - exercised where the extra is not installed
    mx = None
    _IMPORT_ERROR: str | None = str(exc)
else:
    _IMPORT_ERROR = None

__all__ = ["MlxAttention", "mlx_cpu"]


def _mx_dtype(name: str):
    return {"float64": mx.float64, "float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[name]


def _to_mx(a: np.ndarray, dtype: str | None = None):
    # mx.array copies its input anyway, but refuses a view with negative strides ("Cannot convert
    # DLPack arrays with negative strides"); an MLX user's arrays never are one, so copy first.
    a = np.ascontiguousarray(a)
    name = dtype or ("bfloat16" if a.dtype == np_dtype("bfloat16") else a.dtype.name)
    try:
        target = _mx_dtype(name)
    except KeyError:
        return mx.array(a)  # integer inputs: MLX's own array, for MLX to accept or reject
    if name == "bfloat16":
        return mx.array(a.astype(np.float32)).astype(mx.bfloat16)
    return mx.array(a, dtype=target)


def _to_numpy(a) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        return np.array(a.astype(mx.float32)).astype(np_dtype("bfloat16"))
    return np.array(a, copy=True)


class MlxAttention:
    """``mx.fast.scaled_dot_product_attention`` on ``mx.cpu``."""

    framework = "numpy"
    # The releases its declaration and expectations file were measured with (constraints.txt pins them);
    # the verdict line names an installed release that differs.
    measured_with = {"mlx": "0.32.4"}

    def __init__(self, name: str, declaration: Declaration) -> None:
        self.name = name
        self.declaration = declaration
        try:
            self.version = f"mlx {importlib.metadata.version('mlx')}"
        except importlib.metadata.PackageNotFoundError:
            self.version = None

    def __repr__(self) -> str:
        return f"MlxAttention({self.name!r})"

    def unavailable_reason(self) -> str | None:
        if _IMPORT_ERROR is not None:
            return f"needs mlx (pip install 'sdpa-conformance[mlx]'): {_IMPORT_ERROR}"
        return None

    def _inputs(self, case: Case):
        if case.dropout_p:  # any but 0, an invalid -0.1 too: dropped, it would answer a call nobody made
            raise NotApplicable("mx.fast.scaled_dot_product_attention has no dropout")
        q, k, v = (_to_mx(x) for x in (case.query, case.key, case.value))
        only_causal = case.is_causal and case.mask is None and case.bias is None
        mask = "causal" if only_causal else None
        if not only_causal:
            folded = blocked(case, fold_causal=True, alignment=self.declaration.causal_alignment)
            if case.bias is not None:
                mask = _to_mx(bias_with(folded, case.bias), case.dtype if case.dtype in DTYPES else None)
            elif folded is not None:
                mask = mx.array(np.ascontiguousarray(~folded))
        kwargs = {"scale": float(case.effective_scale), "mask": mask}
        if case.sinks is not None:
            kwargs["sinks"] = _to_mx(np.asarray(case.sinks, dtype=np.float64), case.dtype)
        return (q, k, v), kwargs

    def forward(self, case: Case) -> np.ndarray:
        (q, k, v), kwargs = self._inputs(case)
        out = mx.fast.scaled_dot_product_attention(q, k, v, stream=mx.cpu, **kwargs)
        mx.eval(out)
        return _to_numpy(out)

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        (q, k, v), kwargs = self._inputs(case)

        def attention(q, k, v):
            return mx.fast.scaled_dot_product_attention(q, k, v, stream=mx.cpu, **kwargs)

        _, grads = mx.vjp(attention, [q, k, v], [_to_mx(grad_out, case.dtype)])
        mx.eval(grads)
        return tuple(_to_numpy(g) for g in grads)


mlx_cpu = MlxAttention(
    "mlx",
    Declaration(
        **capabilities(dropout=False, sinks=True),
        causal_alignment="bottom-right",
        all_blocked="mean-v",
        all_blocked_float_mask="nan",
        masks_combined=True,
        float64_computed_as="float32",
        float16_computed_as="float16-masked",
        bfloat16_computed_as="bfloat16-masked",
        scale_applied="query",
        blocked_fill="set:min",
        mask_sense="attend",
        causal_with_mask=False,
        accepts_invalid=frozenset({"mixed-dtype"}),  # q, k, v computed in their promoted type, as MLX documents
        backend="mlx-fast",
        notes=(
            "mlx 0.32 mx.fast.scaled_dot_product_attention on mx.cpu, backward by mx.vjp. Measured: bool rows all "
            "blocked -> mean of V, -inf rows -> NaN; 'causal' bottom-right (folded into a given mask, bottom-right); "
            "float64 at float32 level (float32 softmax); native GQA; sinks; no dropout. Formulation (bitwise, "
            "V = I): float16/bfloat16 Q times the scale in the input dtype, Q K^T rounded to it, blocked keys "
            "set to finfo(dtype).min. Accepts on purpose (declared): q, k, v of different float dtypes, computed in "
            "their promoted type."
        ),
    ),
)

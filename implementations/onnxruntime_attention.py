"""The ONNX ``Attention`` operator (opset 23) run by ONNX Runtime on its CPU execution provider.

Translation of a ``Case`` (why each step exists):

* one tiny model per input signature, built with ``onnx.helper``: Q, K, V [B, H, T, D] with symbolic
  dimensions, an optional ``attn_mask`` and the attributes ``is_causal`` and ``scale``; sessions are
  cached by (dtype, input ranks, mask kind / dtype / rank, is_causal, scale), so one session serves
  every shape of a signature (building one costs a few ms; a run meets a few dozen signatures).
* GQA: 4-D inputs carry the head counts in their shapes; ``q_num_heads`` / ``kv_num_heads`` "must be
  used with 3D inputs" (the operator's schema), so they are not set.
* mask sense: the operator's boolean mask means "take part in attention", the suite's True =
  blocked: ``~mask``. A float mask is added to the scores (float64 for float64 cases, float32
  otherwise: ORT takes a float32 mask with float16 inputs, and the bias stays exact). A boolean mask
  together with a bias becomes one float mask with ``-inf``. Masks keep their own (broadcast) shape:
  how the runtime broadcasts them is under test.
* ``is_causal`` goes to the attribute, together with the mask when there is one (the operator
  composes both).
* float64 cases run a float64 model; bfloat16 is refused (NotApplicable) because the CPU provider
  has no bfloat16 Attention kernel ("Could not find an implementation for Expand(13)").

Measured (onnxruntime 1.32.0, onnx 1.23.2, CPU; tests/test_adapter_declarations.py re-measures):
causal with T != S is aligned top-left (the schema, since its errata, says bottom-right; ORT's CPU
kernel without a ``past_key`` uses offset 0); a row whose keys are all blocked (bool or all -inf
float mask) gives zeros; GQA head h reads kv head h // (Hq/Hkv); Dk != Dv runs; a mask of rank 1 or
one broadcast along the query axis ([B, 1, 1, S]) is refused ("inconsistent q_sequence_length");
float64 carries float32-level error (see the declaration). No gradient, no dropout.

Input validation (000 §8's preconditions; a one-node Attention model run directly, 2026-12-05): the
float32 and float16 kernel refuses every invalid input with its own ``Fail`` (shapes, mixed dtypes) or
``InvalidGraph`` (int32 inputs), declared ``rejects_with``: the classes its Python binding raises; float64, which
has no CPU kernel and runs the operator's function body, answers a K/V batch of 1 against 2 and a 5-D
mask (implementations/expectations/onnxruntime.toml).

Its float16 formulation (declared; conformance/oracle_formulations.py), reproduced with a one-node
Attention model run by onnxruntime directly with V = I (2026-12-03): the scale is the GEMM's alpha and
the float16 scores are ``round(scale Q K^T)``, accumulated in float32 and rounded to float16 once
(``float16_computed_as=float16-products``, ``scale_applied=product``; past 65504 they are inf); the
softmax runs in float32 and P is rounded: the weights equal ``round(softmax(round(scale Q K^T)))``
bitwise in 100 % of elements (8 cases, D = 48, two scales). Its rows blocked entirely are zeros, so
no fill is declared.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import numpy as np

from conformance import releases
from conformance.contract import Case, Declaration, NotApplicable, capabilities, dtype_name
from implementations._masks import bias_dtype, bias_with

try:  # the optional extra ``onnxruntime``; without it the adapter says why it cannot run
    import onnxruntime
    from onnx import helper
except ImportError as exc:  # pragma: no cover - exercised where the extra is not installed
    onnxruntime = helper = None
    _IMPORT_ERROR: str | None = str(exc)
else:
    _IMPORT_ERROR = None

__all__ = ["OnnxRuntimeAttention", "onnxruntime_cpu"]

OPSET = 23


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class OnnxRuntimeAttention:
    """ONNX ``Attention`` (opset 23) in an ``onnxruntime.InferenceSession`` on the CPU provider."""

    # The releases its declaration and expectations file were measured with (constraints.txt pins them);
    # the verdict line names an installed release that differs.
    measured_with = {"onnxruntime": "1.32.0", "onnx": "1.23.2"}

    def __init__(self, name: str, declaration: Declaration) -> None:
        self.name = name
        self.declaration = declaration
        self.version = f"onnxruntime {_version('onnxruntime')}, onnx {_version('onnx')}"  # also in the certificate
        self._sessions: dict[tuple, Any] = {}

    def __repr__(self) -> str:
        return f"OnnxRuntimeAttention({self.name!r})"

    def unavailable_reason(self) -> str | None:
        if _IMPORT_ERROR is not None:
            return f"needs onnxruntime and onnx (pip install 'sdpa-conformance[onnxruntime]'): {_IMPORT_ERROR}"
        if "CPUExecutionProvider" not in onnxruntime.get_available_providers():
            return "onnxruntime has no CPUExecutionProvider"
        return None

    def _session(self, feeds: dict[str, np.ndarray], is_causal: bool, scale: float | None) -> Any:
        key = tuple((n, a.dtype.str if a.dtype.kind != "V" else dtype_name(a.dtype), a.ndim) for n, a in feeds.items())
        key += (is_causal, scale)
        if key not in self._sessions:
            inputs = [
                helper.make_tensor_value_info(n, _onnx_type(a.dtype), [f"{n}{i}" for i in range(a.ndim)])
                for n, a in feeds.items()
            ]
            names = ["Q", "K", "V"] + (["attn_mask"] if "attn_mask" in feeds else [])
            attrs: dict[str, Any] = {"is_causal": int(is_causal)}
            if scale is not None:
                attrs["scale"] = float(scale)
            node = helper.make_node("Attention", names, ["Y"], **attrs)
            out = helper.make_tensor_value_info("Y", _onnx_type(feeds["Q"].dtype), None)
            model = helper.make_model(
                helper.make_graph([node], "sdpa", inputs, [out]), opset_imports=[helper.make_opsetid("", OPSET)]
            )
            model.ir_version = min(model.ir_version, 10)
            options = onnxruntime.SessionOptions()
            options.log_severity_level = 4  # errors come back as exceptions; the log would repeat them on stderr
            options.intra_op_num_threads = 1
            self._sessions[key] = onnxruntime.InferenceSession(
                model.SerializeToString(),
                options,
                providers=["CPUExecutionProvider"],
            )
        return self._sessions[key]

    def forward(self, case: Case) -> np.ndarray:
        if case.dropout_p:  # any but 0, an invalid -0.1 too: dropped, it would answer a call nobody made
            raise NotApplicable("the ONNX Attention operator has no dropout")
        if case.dtype == "bfloat16":
            raise NotApplicable("onnxruntime's CPU provider has no bfloat16 Attention kernel")
        feeds = {"Q": np.array(case.query), "K": np.array(case.key), "V": np.array(case.value)}
        mask = None if case.mask is None else np.asarray(case.mask, dtype=bool)
        if case.bias is not None:
            feeds["attn_mask"] = bias_with(mask, case.bias).astype(bias_dtype(case.dtype))
        elif mask is not None:
            feeds["attn_mask"] = np.ascontiguousarray(~mask)
        session = self._session(feeds, bool(case.is_causal), case.scale)
        return session.run(["Y"], feeds)[0]

    framework = "numpy"


def _onnx_type(dtype: np.dtype) -> int:
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError) as exc:
        raise TypeError(f"no ONNX tensor type for {np.dtype(dtype)}") from exc


# ORT's own exception classes (onnxruntime.capi.onnxruntime_pybind11_state) derive from Exception
# only; these are the ones it raises for invalid models and inputs.
_ORT_ERRORS = frozenset({"Fail", "InvalidArgument", "InvalidGraph", "NotImplemented", "RuntimeException"})

# Where an older release declares otherwise (conformance.releases.for_release, read from the installed
# release; docs/expectations.md). Measured by calling the operator directly (a one-node Attention model
# whose row 0 lets no key take part, 2026-12-05): onnxruntime 1.27.0 gives that row the mean of V in
# float32 and float16 under a boolean attn_mask, and NaN under a float attn_mask of -inf (float32); 1.28.0
# and later give zeros (the operator's errata: a fully-masked row gives zeros). Float64's NaN there (1.27,
# 1.28) is a bug, not a convention: an expectations entry.
DECLARED_BY_RELEASE = {"<1.28": {"all_blocked": "mean-v", "all_blocked_float_mask": "nan"}}

onnxruntime_cpu = OnnxRuntimeAttention(
    "onnxruntime",
    Declaration(
        **capabilities(dtypes=frozenset({"float64", "float32", "float16"}), grad=False, dropout=False),
        causal_alignment="top-left",
        all_blocked="zeros",
        float64_computed_as="float32",
        float16_computed_as="float16-products",
        scale_applied="product",
        mask_sense="attend",
        rejects_with=frozenset({"ValueError", "RuntimeError", "TypeError"}) | _ORT_ERRORS,
        causal_with_mask=True,
        masks_combined=True,
        backend="onnxruntime-cpu",
        notes=(
            "ONNX Attention opset 23 on onnxruntime's CPU provider. Measured: bool mask True = take part; "
            "all-blocked rows (bool or -inf) -> zeros; is_causal top-left when T != S (the schema says "
            "bottom-right); is_causal composed with a mask; GQA h -> h // (Hq/Hkv) from 4-D shapes; Dk != Dv; "
            "no bfloat16 kernel; masks of rank 1 or broadcast along the query axis refused; no gradient, no dropout. "
            "Formulation (bitwise, V = I): float16 scale * Q K^T in a float32 GEMM, rounded to float16."
        ),
    ).replace(**releases.for_release(DECLARED_BY_RELEASE, _version("onnxruntime"))),
)

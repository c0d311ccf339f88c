"""keras 3's ``dot_product_attention`` on its JAX backend (``keras.src.backend.jax.nn``), jitted.

What a keras user with ``KERAS_BACKEND=jax`` runs: keras converts and casts the inputs, then calls
``jax.nn.dot_product_attention(implementation="xla")`` on the CPU (its cuDNN and TPU splash paths
need those devices); when jax raises (Dk != Dv), keras logs the exception and falls back to its own
copy of jax's xla reference. keras's jax trainer jit-compiles its steps, so the call is jitted here
too (``is_causal`` and ``scale`` static), the backward through ``jax.vjp`` inside the same jit.
float16 is not declared on the CPU: the jitted call does not compile there ("The precision
'F16_F16_F32' is not supported by dot_general on CPU"), and running it op by op (what works for a
keras user calling the op eagerly) costs ~5 s of XLA compilations per new shape (forward 2-4 s,
VJP 6-9 s measured), beyond the default run's budget. Where another case fails to compile (XLA CPU's
bfloat16 dot with T == S == 1), it runs op by op, as a user whose jitted call fails would run it.

Measured (keras 3.15.1, jax 0.10.2 CPU; tests/test_adapter_declarations.py re-measures):
boolean-mask rows all blocked give the mean of V, all ``-inf`` bias rows NaN (jax's conventions);
is_causal top-left; GQA h -> h // (Hq/Hkv) (jax's); float64 cast to float32 by keras (not declared);
Dk != Dv fails: jax refuses it (ValueError), keras logs that and falls back to its own copy of the
reference, whose last reshape to the query's shape raises TypeError ("cannot reshape array of shape
(2, 16, 2, 1, 64) ... into shape (2, 16, 2, 32)"), hence ``requires_dk_eq_dv``. No dropout argument.

Input validation (000 §8's preconditions, keras called directly, 2026-12-05): keras refuses inputs that
are not 4-D (ValueError), jax mismatched lengths, heads and feature dims; a key of another float dtype is
cast to keras's ``result_type`` on purpose (declared ``accepts_invalid``); integer inputs (an int32
output, all 0) and a key and value of batch 1 against 2 (jax refuses it, keras's fallback copy of jax's
reference broadcasts it) are answered by accident: implementations/expectations/keras-jax.toml.
"""

from __future__ import annotations

import functools

import numpy as np

from conformance.contract import Case, Declaration, NotApplicable, capabilities, np_dtype
from implementations import _keras

keras, _nn, _UNAVAILABLE = _keras.load("jax")
try:
    import jax
except ImportError:  # pragma: no cover - keras's jax backend imported it already when it loaded
    jax = None

__all__ = ["KerasJax", "keras_jax"]


def _attention(q, k, v, bias, mask, *, is_causal: bool, scale: float | None):
    """The contract's layout in and out; keras's [B, T, N, H] in between (head and length axes counted from the
    end, as implementations/_keras.py's ``to_keras_layout``: an array of another rank reaches keras in it)."""
    t = functools.partial(jax.numpy.swapaxes, axis1=-3, axis2=-2)
    return t(_nn.dot_product_attention(t(q), t(k), t(v), bias=bias, mask=mask, scale=scale, is_causal=is_causal))


def _vjp(q, k, v, bias, mask, g, *, is_causal: bool, scale: float | None):
    f = functools.partial(_attention, bias=bias, mask=mask, is_causal=is_causal, scale=scale)
    _, pullback = jax.vjp(f, q, k, v)
    return pullback(g)


# Why float16 is not declared on the CPU (measured, jax 0.10.2): a jitted model step does not compile.
FLOAT16_CPU_REASON = (
    "keras's jitted dot_product_attention does not compile for float16 on XLA's CPU backend "
    "(\"The precision 'F16_F16_F32' is not supported by dot_general on CPU\"); only op-by-op calls run"
)


def _is_compile_refusal(exc: Exception) -> bool:
    text = str(exc)
    return "not supported" in text.lower() and ("UNIMPLEMENTED" in text or "Algorithm" in text or "precision" in text)


class KerasJax(_keras.KerasAdapter):
    """``keras.src.backend.jax.nn.dot_product_attention`` under ``jax.jit``."""

    framework = "jax"
    framework_version = getattr(jax, "__version__", None)
    # The releases its declaration and expectations file were measured with (constraints.txt pins them);
    # the verdict line names an installed release that differs.
    measured_with = {"keras": "3.15.1", "jax": "0.10.2", "jaxlib": "0.10.2"}
    load_error = _UNAVAILABLE

    def __init__(self, name: str, declaration: Declaration) -> None:
        super().__init__(name, declaration)
        self._jit = None

    def _jitted(self):
        if self._jit is None:
            static = ("is_causal", "scale")
            self._jit = (jax.jit(_attention, static_argnames=static), jax.jit(_vjp, static_argnames=static))
        return self._jit

    def _args(self, case: Case) -> tuple[list, dict]:
        _keras.check_case(case)
        if case.dtype == "float16" and jax.default_backend() == "cpu":
            raise NotApplicable(FLOAT16_CPU_REASON)
        arrays = [jax.device_put(np.array(x, copy=True)) for x in (case.query, case.key, case.value)]
        bias, mask = _keras.bias_f32(case), _keras.attend(case)
        arrays += [None if bias is None else jax.device_put(bias), None if mask is None else jax.device_put(mask)]
        return arrays, {"is_causal": bool(case.is_causal), "scale": None if case.scale is None else float(case.scale)}

    def _run(self, jitted, eager, *args, **static):
        try:
            return jitted(*args, **static)
        except Exception as exc:  # jaxlib's XlaRuntimeError has no stable import path
            if not _is_compile_refusal(exc):
                raise
        try:  # what a keras user calling the op eagerly gets: jax's own op-by-op fallback
            return eager(*args, **static)
        except Exception as exc:
            if _is_compile_refusal(exc):
                raise NotApplicable(f"XLA on the CPU cannot compile this case: {str(exc).splitlines()[0]}") from exc
            raise

    def forward(self, case: Case) -> np.ndarray:
        arrays, static = self._args(case)
        return np.array(self._run(self._jitted()[0], _attention, *arrays, **static), copy=True)

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arrays, static = self._args(case)
        g = jax.device_put(np.asarray(grad_out).astype(np_dtype(case.dtype)))
        grads = self._run(self._jitted()[1], _vjp, *arrays, g, **static)
        return tuple(np.array(x, copy=True) for x in grads)


keras_jax = KerasJax(
    "keras-jax",
    Declaration(
        **capabilities(dtypes=_keras.KERAS_DTYPES - {"float16"}, dropout=False, requires_dk_eq_dv=True),
        causal_alignment="top-left",
        all_blocked="mean-v",
        all_blocked_float_mask="nan",
        blocked_fill="set:-0.7max-float32",  # jax.nn.dot_product_attention's (implementations/jax_attention.py)
        mask_sense="attend",
        causal_with_mask=True,
        accepts_invalid=_keras.ACCEPTS_INVALID,
        backend="keras-jax",
        compiles_per_shape=True,  # under jax.jit: XLA compiles every new shape
        notes=(
            "keras 3.15 jax backend dot_product_attention (jax.nn.dot_product_attention, xla) under jax.jit; "
            "float16 op by op where XLA CPU cannot compile it. Measured: bool rows all blocked -> mean of V, "
            "-inf rows -> NaN; top-left causal; GQA; Dk != Dv fails (TypeError in keras's fallback); float64 cast to "
            "float32 by keras (not declared); no dropout. " + _keras.ACCEPTS_INVALID_NOTE
        ),
    ),
)

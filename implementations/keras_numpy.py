"""keras 3's ``dot_product_attention`` on its NumPy backend (``keras.src.backend.numpy.nn``).

What a keras user with ``KERAS_BACKEND=numpy`` gets from ``keras.ops.dot_product_attention``; it
follows ``jax.nn.dot_product_attention``'s xla reference (the keras source says so). The call gets
the suite's case through keras's own arguments (implementations/_keras.py: layout, mask sense):
``mask`` (True = take part), ``bias``, ``is_causal`` and ``scale``, all together where a case has them.

Measured (keras 3.15.1, numpy 2.4; tests/test_adapter_declarations.py re-measures):

* a row whose keys are all blocked by the boolean mask gives the mean of V (keras fills masked
  logits with -0.7 x the dtype's maximum); a row of ``-inf`` bias gives NaN;
* ``is_causal`` is ``np.tril`` on [T, S]: top-left;
* float64 inputs are cast to float32 and the output is float32 (keras's 64 -> 32-bit rule), so
  float64 is not declared (the adapter refuses it with that reason);
* QK^T is an ``np.einsum`` in the input dtype (float16 products are not upcast; bfloat16 is computed
  in float32 because ``np.einsum`` has no bfloat16), then cast to float32 for the softmax;
* no GQA: the einsum needs as many key heads as query heads (Hq != Hkv raises ValueError);
* its formulation (declared; conformance/oracle_formulations.py), reproduced by calling
  ``keras.src.backend.numpy.nn.dot_product_attention`` directly (2026-12-03): float16 Q K^T is an
  einsum over the head dim accumulated in float32 and rounded to float16 (V = I weights equal
  ``round(softmax(round(Q K^T) scale))`` bitwise in 100 % of elements, 8 cases), and P V an einsum over
  the keys whose running sum is rounded to float16 at every key (equal to a float16 running sum in
  100 % of elements at S = 260; float32 accumulation and one rounding: 12 %):
  ``float16_computed_as=float16-sums``. Blocked logits are *replaced* by -0.7 x float32's largest
  (``np.where``, logits in float32 for every input: ``blocked_fill=set:-0.7max-float32``): a row blocked
  by the mask and by -inf together is uniform over the masked keys alone (measured: the mean of V over
  the 3 masked keys, not over all 5);
* Dk != Dv runs; no dropout argument; no gradient (NumPy), hence ``grad=False``;
* input validation (000 §8's preconditions; keras's numpy ``dot_product_attention`` called directly,
  2026-12-05): a query that is not 4-D is refused (keras's ValueError), a 5-D key where keras unpacks
  its shape, K/V of different lengths and heads that do not fit in the einsums (ValueError); a key of
  another float dtype is cast to keras's ``result_type`` on purpose (declared ``accepts_invalid``);
  integer inputs (an int32 output, all 0) and a key and value of batch 1 against 2 (``np.einsum``
  broadcasts it) are answered by accident: implementations/expectations/keras-numpy.toml.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration, capabilities
from implementations import _keras

keras, _nn, _UNAVAILABLE = _keras.load("numpy")

__all__ = ["KerasNumpy", "keras_numpy"]


class KerasNumpy(_keras.KerasAdapter):
    """``keras.src.backend.numpy.nn.dot_product_attention``."""

    framework = "numpy"
    framework_version = np.__version__
    # The releases its declaration and expectations file were measured with (constraints.txt pins them);
    # the verdict line names an installed release that differs.
    measured_with = {"keras": "3.15.1"}
    load_error = _UNAVAILABLE

    def forward(self, case: Case) -> np.ndarray:
        _keras.check_case(case)
        q, k, v = (_keras.to_keras_layout(x) for x in (case.query, case.key, case.value))
        out = _nn.dot_product_attention(
            q,
            k,
            v,
            bias=_keras.bias_f32(case),
            mask=_keras.attend(case),
            scale=case.scale,
            is_causal=bool(case.is_causal),
        )
        return _keras.from_keras_layout(out)


keras_numpy = KerasNumpy(
    "keras-numpy",
    Declaration(
        **capabilities(dtypes=_keras.KERAS_DTYPES, grad=False, dropout=False, gqa=False),
        causal_alignment="top-left",
        all_blocked="mean-v",
        all_blocked_float_mask="nan",
        float16_computed_as="float16-sums",
        blocked_fill="set:-0.7max-float32",
        mask_sense="attend",
        batch_invariant=True,
        causal_with_mask=True,
        accepts_invalid=_keras.ACCEPTS_INVALID,
        backend="keras-numpy",
        notes=(
            "keras 3.15 numpy backend dot_product_attention. Measured: bool-mask rows all blocked -> mean of V, "
            "-inf bias rows -> NaN; is_causal top-left; no GQA; float64 cast to float32 by keras (not declared); "
            "float16 QK^T in float16; no dropout, no gradient. Formulation (bitwise): float16 Q K^T rounded, "
            "P V summed in float16 (np.einsum); blocked logits replaced by -0.7 x float32's largest. "
            + _keras.ACCEPTS_INVALID_NOTE
        ),
    ),
)

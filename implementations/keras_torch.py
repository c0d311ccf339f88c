"""keras 3's ``dot_product_attention`` on its torch backend (``keras.src.backend.torch.nn``), CPU.

What a keras user with ``KERAS_BACKEND=torch`` gets: keras casts the inputs, turns a boolean mask
into an additive one (0 where attended, -0.7 x the dtype's maximum where not; the causal part, when
``is_causal`` comes with a mask, folded into it top-left), repeats key heads for GQA
(``repeat_interleave``), and calls ``torch.nn.functional.scaled_dot_product_attention`` with
``attn_mask`` / ``is_causal`` / ``scale``. The backward is torch autograd through that call.

keras refuses ``bias`` together with ``mask`` ("Only one of `bias` and `mask` can be provided"), so
a case with both gets them as one additive mask here (blocked -> ``-inf``), declared
``masks_combined``: such a row then follows the ``-inf`` policy. keras passes ``is_causal`` on to
torch together with a bias, which torch's math path refuses ("Explicit attn_mask should not be set
when is_causal=True"; its CPU flash path takes the pair): on that refusal the causal part is folded
into the bias (top-left, ``-inf``), as keras folds it into a boolean mask, and the refusal recorded. Inputs go through
implementations/_torch.py (bfloat16 via float32, copies); the layout via implementations/_keras.py.

Measured (keras 3.15.1, torch 2.13.0+cpu; tests/test_adapter_declarations.py re-measures): rows all
blocked by the boolean mask give the mean of V (keras's finite fill), all ``-inf`` bias rows zeros
(torch's); is_causal top-left; GQA h -> h // (Hq/Hkv); Dk != Dv runs; float64 cast to float32 by
keras (not declared). No dropout argument in keras's function. Input validation (000 §8's preconditions,
keras called directly, 2026-12-05): keras refuses inputs that are not 4-D (ValueError), torch integer
inputs and heads or feature dims that do not fit; a key of another float dtype is cast to keras's
``result_type`` on purpose (declared ``accepts_invalid``); a key and value of batch 1 against 2 (torch
broadcasts it) and K/V of different lengths (torch's CPU flash path) are answered by accident:
implementations/expectations/keras-torch.toml.

Its fill (declared; conformance/oracle_formulations.py), reproduced by calling
``keras.src.backend.torch.nn.dot_product_attention`` directly (2026-12-03): -0.7 x the input dtype's
largest (float16: -0.7 x 65500 = -45856 once a float16 number) is ADDED to blocked scores, in torch's
float32 SDPA (``blocked_fill=add:-0.7max``). Its consequences, each measured: in float32 and bfloat16 a
row blocked entirely is uniform (the mean of V) but passes a gradient to dQ (d(row)/dq = [0.407,
0.743, 0.066], 0 under -inf); in float16 the fill does not swamp the scores, so such a row is their
own softmax ([0.1554, -0.5811, 0.4143] against the unmasked softmax's [0.155, -0.5825, 0.414]; the
mean of V is [0.5208, -0.32, 0.3957]) and a blocked key scoring +25000 beside keys near -25000 keeps
all the weight (1.0). Not the formulation: torch's CPU flash backward recomputes the weights of such
a row from a log-sum-exp formed at the fill's magnitude, where log(S) is lost (each weight 1, not
1/S: dV S times too large); that stays an expected failure (implementations/expectations/keras-torch.toml).
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, Declaration, capabilities
from implementations import _keras
from implementations._masks import causal_blocked

keras, _nn, _UNAVAILABLE = _keras.load("torch")
try:
    import torch

    from implementations._torch import to_numpy, to_torch
except ImportError:  # pragma: no cover - keras's torch backend imported torch already when it loaded
    torch = None

__all__ = ["KerasTorch", "keras_torch"]


class KerasTorch(_keras.KerasAdapter):
    """``keras.src.backend.torch.nn.dot_product_attention`` on CPU tensors."""

    framework = "torch"
    framework_version = getattr(torch, "__version__", None)
    # The releases its declaration and expectations file were measured with (constraints.txt pins them);
    # the verdict line names an installed release that differs.
    measured_with = {"keras": "3.15.1", "torch": "2.13.0"}
    load_error = _UNAVAILABLE

    def __init__(self, name: str, declaration: Declaration) -> None:
        super().__init__(name, declaration)
        self.combination_refusals: list[str] = []  # torch's refusals of keras's bias + is_causal call

    def _call(self, case: Case, requires_grad: bool):
        _keras.check_case(case)
        layout = (_keras.to_keras_layout(x) for x in (case.query, case.key, case.value))
        q, k, v = (to_torch(x, requires_grad=requires_grad) for x in layout)
        mask, bias = _keras.attend(case), _keras.bias_f32(case)
        if bias is not None and mask is not None:  # keras takes one of the two: one additive mask
            bias, mask = np.where(mask, bias, -np.inf).astype(np.float32), None
        is_causal = bool(case.is_causal)

        def call(bias, is_causal):
            return _nn.dot_product_attention(
                q,
                k,
                v,
                bias=None if bias is None else torch.from_numpy(bias),
                mask=None if mask is None else torch.from_numpy(mask),
                scale=case.scale,
                is_causal=is_causal,
            )

        try:
            out = call(bias, is_causal)
        except RuntimeError as exc:
            # keras hands torch a bias together with is_causal, which torch's math path refuses ("Explicit
            # attn_mask should not be set when is_causal=True"); keras folds causal into a boolean mask
            # itself, so the causal part is folded into the bias here, as keras does for a mask (top-left).
            if not (is_causal and bias is not None and "should not be set when is_causal" in str(exc)):
                raise
            self.combination_refusals.append(f"{type(exc).__name__}: {exc}")
            out = call(np.where(causal_blocked(case.T, case.S), -np.inf, bias).astype(np.float32), False)
        return (q, k, v), out.transpose(-3, -2)  # _keras.to_keras_layout's inverse

    def forward(self, case: Case) -> np.ndarray:
        with torch.no_grad():
            _, out = self._call(case, requires_grad=False)
        return to_numpy(out)

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with torch.enable_grad():
            (q, k, v), out = self._call(case, requires_grad=True)
            g = to_torch(grad_out).to(out.dtype)
            dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_outputs=g)
        return tuple(to_numpy(x.transpose(-3, -2)) for x in (dq, dk, dv))


keras_torch = KerasTorch(
    "keras-torch",
    # Reads like hf_sdpa.py's declaration (both end in torch's SDPA, one combined mask): data, measured apiece
    Declaration(
        **capabilities(dtypes=_keras.KERAS_DTYPES, dropout=False),
        causal_alignment="top-left",
        all_blocked="mean-v",
        all_blocked_float_mask="zeros",
        masks_combined=True,
        blocked_fill="add:-0.7max",
        mask_sense="attend",
        causal_with_mask=True,
        accepts_invalid=_keras.ACCEPTS_INVALID,
        backend="keras-torch",
        notes=(
            "keras 3.15 torch backend dot_product_attention (torch SDPA, CPU). Measured: bool rows all blocked -> "
            "mean of V (keras's -0.7 x max fill), -inf rows -> zeros (torch's); top-left causal; GQA via "
            "repeat_interleave; bias + mask handed over as one -inf mask (keras takes one); float64 cast to float32 "
            "by keras (not declared); no dropout. Formulation: -0.7 x the dtype's largest added to blocked scores "
            "(float16: -45856, in torch's float32 SDPA). " + _keras.ACCEPTS_INVALID_NOTE
        ),
    ),
)

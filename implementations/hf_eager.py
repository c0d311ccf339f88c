"""transformers' ``eager_attention_forward`` (Llama), called as ``LlamaAttention`` calls it (implementations/_hf.py).

The function has no causal argument and no boolean mask: a model hands it an additive mask built by
``transformers.masking_utils.eager_mask``, which takes ``sdpa_mask``'s boolean mask (True = attend;
for causal models ``causal_mask_function``, ``kv_idx <= q_idx``) and turns it into 0 where attended
and ``torch.finfo(dtype).min`` where not. The adapter builds the mask the same way: the causal part
from ``masking_utils.sdpa_mask`` (q_offset 0: top-left, as a prefill without cache), AND-ed with the
case's boolean mask (per head where the case has one: the utilities build [B, 1, T, S] only), then
0 / finfo(query dtype).min exactly as ``eager_mask`` converts it. A case with an additive bias gets
the bias (float32, float64 for float64: exact) with its blocked entries at ``-inf`` (declared
``masks_combined``: such a row follows the ``-inf`` policy).

Measured (transformers 5.24.0, torch 2.13.0+cpu; tests/test_adapter_declarations.py re-measures):

* a row blocked entirely by the boolean mask (finfo.min everywhere) gives the mean of V; a row of
  ``-inf`` gives NaN (``softmax`` of all ``-inf``);
* float64: ``softmax(..., dtype=torch.float32)``: float32-level error (declared);
* GQA through ``repeat_kv`` (h -> h // groups); dropout on the weights (torch's, 1/(1-p));
* QK^T in the input dtype (no upcast in float16/bfloat16; the softmax is float32).

Its formulation (declared; conformance/oracle_formulations.py), reproduced by calling
``eager_attention_forward`` directly with V = I (2026-12-03): ``torch.matmul(query, key^T) * scaling``
runs in the input dtype, so float16 and bfloat16 scores are the product rounded to it and scaled
there, rounded again (``float16_computed_as=float16-scores``, ``bfloat16_computed_as=bfloat16-scores``):
the weights equal ``round(softmax(round(round(Q K^T) scale)))`` bitwise in 100 % of elements (8 cases,
D = 48, two scales, each dtype). The mask adds ``finfo(dtype).min`` to blocked scores in that dtype
(``blocked_fill=add:min``): a row blocked entirely is the softmax of its filled scores (the mean of V
where the fill swamps them), its gradient passes to dQ and dK (measured: d(row)/dq = [0.598, 0.279,
-0.486], 0 under -inf), and in float64 ``finfo(float64).min`` is -inf in the float32 softmax, so such a
row is NaN (measured: row [nan, nan, nan]; float32: the mean of V).

Input validation (000 §8's preconditions), measured by calling ``eager_attention_forward`` directly
(2026-12-05): the function checks nothing itself; torch's ops refuse mixed dtypes, a key/value length
or feature dim that does not fit, and ``F.dropout`` refuses ``dropout`` outside [0, 1] (ValueError). A key
and value of batch 1 against a query batch of 2 broadcast through ``torch.matmul`` (equal to the call
with them expanded, difference 0.0): transformers means its attention functions to take a broadcast
batch (``sdpa_attention_forward``: "SDPA broadcasts it (e.g. learned queries with batch 1)"), so that
is declared (``accepts_invalid``). A 3-D query, integer inputs and a 5-D mask are answered too, none of
it on purpose: implementations/expectations/hf-eager.toml.
"""

from __future__ import annotations

import numpy as np
import torch

from conformance.contract import Case, Declaration, capabilities
from implementations import _hf, _torch

__all__ = ["hf_eager"]


def _load():
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return eager_attention_forward


def _attend(case: Case) -> torch.Tensor | None:
    """True = attend, [.., T, S]: the causal part from transformers' masking utilities, AND the case's mask."""
    attend = None
    if case.is_causal:
        from transformers.masking_utils import sdpa_mask

        attend = sdpa_mask(batch_size=1, q_length=case.T, kv_length=case.S, allow_is_causal_skip=False)
    if case.mask is not None:
        visible = torch.from_numpy(~np.asarray(case.mask, dtype=bool))
        attend = visible if attend is None else (attend & visible)
    return attend


def _attention_mask(case: Case, dtype: torch.dtype) -> torch.Tensor | None:
    attend = _attend(case)
    if case.bias is not None:
        return _hf.bias_mask(case.bias, attend, dtype)
    if attend is None:
        return None
    return torch.where(attend, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)  # masking_utils.eager_mask


hf_eager = _hf.HFAttention(
    "hf-eager",
    Declaration(
        # the float mask and the scalars are built as transformers builds them
        presents=_torch.PRESENTS - {"bias_dtype", "scalars"},
        **capabilities(),
        causal_alignment="top-left",
        all_blocked="mean-v",
        all_blocked_float_mask="nan",
        masks_combined=True,
        float64_computed_as="float32",
        float16_computed_as="float16-scores",
        bfloat16_computed_as="bfloat16-scores",
        blocked_fill="add:min",
        mask_sense="attend",  # masking_utils' boolean masks, before eager_mask makes them additive
        causal_with_mask=False,
        accepts_invalid=frozenset({"batch"}),  # a broadcast batch, as transformers' attention functions take one
        backend="hf-eager",
        notes=(
            "transformers 5.24 eager_attention_forward (Llama) with a Llama-like module; mask 0 / finfo.min as "
            "masking_utils.eager_mask builds it, causal from masking_utils.sdpa_mask (top-left). Measured: bool rows "
            "all blocked -> mean of V, -inf rows -> NaN; softmax in float32 (float64 at float32 level); repeat_kv GQA. "
            "Formulation (bitwise, V = I): float16/bfloat16 Q K^T rounded, scaled in the input dtype; finfo.min "
            "added to blocked scores (float64: -inf in the float32 softmax, rows blocked entirely NaN). Accepts on "
            "purpose (declared): a key and value of batch 1 against a query batch of 2, broadcast by torch.matmul."
        ),
    ),
    _load,
    _attention_mask,
)

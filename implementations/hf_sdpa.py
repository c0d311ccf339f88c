"""transformers' ``sdpa_attention_forward``, called as ``LlamaAttention`` calls it (implementations/_hf.py).

A model hands this function the boolean mask ``transformers.masking_utils.sdpa_mask`` builds (True =
attend, [B, 1, T, S]) or ``None`` when the mask is purely causal (``allow_is_causal_skip``), and the
module's ``is_causal`` (True in Llama) decides the rest: the function passes ``is_causal`` to torch's
SDPA only when ``q_length > 1 and attention_mask is None``. The adapter gives it what the case
says, through those same arguments: ``module.is_causal = case.is_causal``, the case's boolean mask
as True = attend (its own shape, per head where it has heads), an additive bias as a float mask
(float32, float64 for float64: exact; with a boolean mask too, the blocked entries at ``-inf``,
declared ``masks_combined``). So a causal case with a mask, or a causal decode (T = 1), reaches the
function with ``is_causal`` True and sees what it does with it.

Measured (transformers 5.24.0, torch 2.13.0+cpu; tests/test_adapter_declarations.py re-measures):
rows all blocked give zeros (torch's SDPA), with a boolean mask or all ``-inf``; causal top-left
(with T < S the function crops the keys to the first T, equivalent); GQA through ``enable_gqa`` or
``repeat_kv``; float64 in float64; dropout through torch's SDPA. ``is_causal`` is dropped when an
``attention_mask`` is given and when T = 1 (see implementations/expectations/hf-sdpa.toml).

Input validation (000 §8's preconditions), measured by calling ``sdpa_attention_forward`` directly
(2026-12-05): what torch's SDPA refuses is refused (integer and mixed dtypes, heads, feature dims,
masks that do not broadcast; ``dropout=-0.1`` by the flash kernel the default backend takes). A key
and value of batch 1 against a query batch of 2 are answered on purpose (equal to the call with them
expanded, to 4e-16): the function takes its output's batch from torch "as SDPA broadcasts it (e.g.
learned queries with batch 1)", its own comment; declared (``accepts_invalid``). A 5-D key and K/V of
different lengths are answered too, by accident: implementations/expectations/hf-sdpa.toml.
"""

from __future__ import annotations

import numpy as np
import torch

from conformance.contract import Case, Declaration, capabilities
from implementations import _hf, _torch

__all__ = ["hf_sdpa"]


def _load():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _attention_mask(case: Case, dtype: torch.dtype) -> torch.Tensor | None:
    attend = None if case.mask is None else torch.from_numpy(np.ascontiguousarray(~np.asarray(case.mask, dtype=bool)))
    if case.bias is not None:
        return _hf.bias_mask(case.bias, attend, dtype)
    return attend


hf_sdpa = _hf.HFAttention(
    "hf-sdpa",
    # Reads like keras_torch.py's declaration (both end in torch's SDPA, one combined mask): data, measured apiece
    Declaration(
        # the float mask and the scalars are built as transformers builds them
        presents=_torch.PRESENTS - {"bias_dtype", "scalars"},
        **capabilities(),
        causal_alignment="top-left",
        all_blocked="zeros",
        masks_combined=True,
        mask_sense="attend",
        causal_with_mask=True,
        accepts_invalid=frozenset({"batch"}),  # the function broadcasts the batch on purpose (its own comment)
        backend="hf-sdpa",
        notes=(
            "transformers 5.24 sdpa_attention_forward with a Llama-like module (is_causal from the case), boolean "
            "mask True = attend as masking_utils.sdpa_mask builds it. Measured: zeros on blocked rows, top-left "
            "causal, GQA, float64 kept; is_causal dropped with a mask and at T = 1. Accepts on purpose (declared): "
            "a key and value of batch 1 against a query batch of 2, which torch's SDPA broadcasts."
        ),
    ),
    _load,
    _attention_mask,
)

"""A deterministic case brought within a declaration, for the features its clause does not test.

A clause is not applicable for the fields it tests (its ``requires=``) and for nothing else: a clause
about ALiBi that builds its cases with grouped heads, is_causal or a boolean mask must still run on a
kernel that has ALiBi and none of those, or a wrong ALiBi is certified as "not applicable". The drawn
space does this for generated cases (``space.Structure.admitted``); :func:`admitted` does it for a
built one, keeping what the case asks of the kernel wherever the declaration allows another way of
saying it, and the answer the oracle computes for the case it returns:

- grouped heads (GQA) without ``gqa``: each kv head repeated over its group (the same attention);
- ``is_causal`` without ``causal``: folded into the boolean mask, else into the additive mask as
  ``-inf`` (the same blocked set, in the declared alignment), else dropped; on a case with per-sequence
  lengths, whose causal offsets are per sequence, dropped;
- a boolean mask without ``bool_mask``: ``-inf`` entries of the additive mask, else dropped;
- an additive mask without ``float_mask``: a boolean mask where it holds only 0 and ``-inf``, else
  dropped.

What is dropped is named in the case's label, so a failure says which case ran. Features a clause
tests are in its ``requires`` and so declared; nothing here touches them.
"""

from __future__ import annotations

import numpy as np

from conformance import oracle
from conformance.contract import Case, Declaration


def _relabel(case: Case, notes: list[str]) -> Case:
    if not notes:
        return case
    return case.replace(label=(case.label + f" ({'; '.join(notes)}: not declared)").strip())


def _causal_folded(case: Case, decl: Declaration, notes: list[str]) -> Case:
    if case.is_varlen or not (decl.bool_mask or decl.float_mask):
        notes.append("is_causal dropped")
        return case.replace(is_causal=False)
    blocked = oracle.causal_blocked(case.T, case.S, decl.causal_alignment)
    if decl.bool_mask:
        mask = blocked if case.mask is None else np.asarray(case.mask, dtype=bool) | blocked
        notes.append("is_causal folded into the boolean mask")
        return case.replace(is_causal=False, mask=mask)
    bias = np.zeros(blocked.shape) if case.bias is None else np.asarray(case.bias, dtype=np.float64)
    notes.append("is_causal folded into the additive mask")
    return case.replace(is_causal=False, bias=np.where(blocked, -np.inf, bias))


def admitted(case: Case, decl: Declaration) -> Case:
    """``case`` with each feature ``decl`` lacks said another way the declaration admits, or dropped
    (see the module docstring); ``case`` itself when the declaration admits it as it is."""
    notes: list[str] = []
    if case.is_gqa and not decl.gqa and case.Hkv and case.Hq % case.Hkv == 0:
        case = case.replace(key=oracle.expand_kv(case.key, case.Hq), value=oracle.expand_kv(case.value, case.Hq))
        notes.append("grouped kv heads repeated")
    if case.is_causal and not decl.causal:
        case = _causal_folded(case, decl, notes)
    if case.mask is not None and not decl.bool_mask:
        mask = np.asarray(case.mask, dtype=bool)
        if decl.float_mask:
            bias = 0.0 if case.bias is None else np.asarray(case.bias, dtype=np.float64)
            case = case.replace(mask=None, bias=np.where(mask, -np.inf, bias))
            notes.append("boolean mask given as -inf entries of the additive mask")
        else:
            case = case.replace(mask=None)
            notes.append("boolean mask dropped")
    if case.bias is not None and not decl.float_mask:
        bias = np.asarray(case.bias, dtype=np.float64)
        if decl.bool_mask and np.all((bias == 0) | np.isneginf(bias)):
            mask = np.isneginf(bias) if case.mask is None else np.asarray(case.mask, dtype=bool) | np.isneginf(bias)
            case = case.replace(bias=None, mask=mask)
            notes.append("additive 0 / -inf mask given as a boolean mask")
        else:
            case = case.replace(bias=None)
            notes.append("additive mask dropped")
    return _relabel(case, notes)

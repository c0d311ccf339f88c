"""The cells of the case space: which features (mask forms, rows blocked entirely, causal with
masks, GQA ratios, layouts, ...) and shape classes (T < S, T == S, T > S, decode T = 1, S = 1) a
case exercises, and which cells a declaration admits.

The vocabulary is the drawn space's (``harness.cases.space``: its mask forms and tile-tail lengths), so a
cell names what ``harness.cases.strategies.configs`` can draw. Counting the cells a run reaches is
``harness.run.coverage``'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from conformance.contract import Case, Declaration
from conformance.harness.cases import preconditions
from conformance.harness.cases.space import MASK_FORMS
from conformance.harness.cases.space import TAIL_LENGTHS as _TAIL_LENGTHS

SHAPE_CLASSES: tuple[str, ...] = ("T < S", "T == S", "T > S", "decode T = 1", "S = 1")
TAIL_LENGTHS = frozenset(_TAIL_LENGTHS)
LONG_KEYS = 4096
FORMS: tuple[str, ...] = tuple(f for f in MASK_FORMS if f != "none")
SEP = " \u00d7 "  # " × " between a feature and a shape class

Admits = Callable[[Declaration], bool]


def _always(d: Declaration) -> bool:
    return True


def _form_feature(kind: str, form: str) -> str:
    return f"{kind} padding {form}" if form == "[B,1,1,S]" else f"{kind} {form}"


# Every feature the table shows, in its order, with the declarations that admit it.
FEATURES: dict[str, Admits] = {
    "no mask, not causal": _always,
    **{_form_feature("bool mask", f): (lambda d: d.bool_mask) for f in FORMS},
    **{_form_feature("float mask", f): (lambda d: d.float_mask) for f in FORMS},
    "bool + float mask": lambda d: d.bool_mask and d.float_mask,
    "row blocked entirely: bool": lambda d: d.bool_mask,
    "row blocked entirely: float -inf": lambda d: d.float_mask,
    "causal": lambda d: d.causal,
    "causal + bool mask": lambda d: d.causal and d.bool_mask,
    "causal + float mask": lambda d: d.causal and d.float_mask,
    "B > 1 and H > 1": _always,
    "GQA 2:1": lambda d: d.gqa,
    "GQA 4:1": lambda d: d.gqa,
    "GQA 8:1": lambda d: d.gqa,
    "GQA 3, 5, 6 or 7:1": lambda d: d.gqa,
    "MQA (Hkv = 1 < Hq)": lambda d: d.gqa,
    "custom scale": lambda d: d.custom_scale,
    "Dk != Dv": lambda d: not d.requires_dk_eq_dv,
    "head dim not a multiple of 8": _always,
    "tile-tail T or S (31..129)": _always,
    "tile-tail head dim (31..129)": lambda d: d.max_head_dim is None or d.max_head_dim >= 31,
    "non-contiguous input": _always,
    "broadcast (stride 0) input": _always,
    "dropout": lambda d: d.dropout,
    "long keys S >= 4096": _always,
}


def _letter(size: int, full: int, letter: str) -> str:
    return letter if size == full and full > 1 else "1"


def form_of(shape: tuple[int, ...], case: Case) -> str | None:
    """The broadcast form of a mask of ``shape`` in ``case`` ("[B,1,1,S]", ...); None if unnamed.

    An axis of size 1 reads "1" even where the full axis is 1 too (B = 1, T = 1): such a form is
    indistinguishable from the one without that axis, and is counted as that one.
    """
    if len(shape) == 2:
        name = f"[{_letter(shape[0], case.T, 'T')},S]"
    elif len(shape) == 4:
        b, h, t, _ = shape
        name = f"[{_letter(b, case.B, 'B')},{_letter(h, case.Hq, 'H')},{_letter(t, case.T, 'T')},S]"
    else:
        return None
    return name if name in FORMS else None


def _ratio_feature(case: Case) -> str | None:
    if case.Hq == case.Hkv or case.Hkv <= 0 or case.Hq % case.Hkv:
        return None
    g = case.Hq // case.Hkv
    return {2: "GQA 2:1", 4: "GQA 4:1", 8: "GQA 8:1"}.get(g, "GQA 3, 5, 6 or 7:1" if g < 8 else None)


def _layouts(arrays: Iterable[np.ndarray]) -> list[str]:
    out = []
    arrays = [np.asarray(a) for a in arrays]
    if any(any(s == 0 and n > 1 for n, s in zip(a.shape, a.strides)) for a in arrays):
        out.append("broadcast (stride 0) input")
    elif any(not a.flags.c_contiguous for a in arrays):
        out.append("non-contiguous input")
    return out


def features_of(case: Case) -> list[str]:
    """The features of the table that ``case`` exercises."""
    feats: list[str] = []
    mask = None if case.mask is None else np.asarray(case.mask)
    bias = None if case.bias is None else np.asarray(case.bias)
    if mask is None and bias is None and not case.is_causal:
        feats.append("no mask, not causal")
    for kind, arr in (("bool mask", mask), ("float mask", bias)):
        form = None if arr is None else form_of(arr.shape, case)
        if form is not None:
            feats.append(_form_feature(kind, form))
    if mask is not None and bias is not None:
        feats.append("bool + float mask")
    if mask is not None and mask.size and mask.shape[-1] == case.S and mask.all(axis=-1).any():
        feats.append("row blocked entirely: bool")
    if bias is not None and bias.size and bias.shape[-1] == case.S and np.isneginf(bias).all(axis=-1).any():
        feats.append("row blocked entirely: float -inf")
    if case.is_causal:
        feats.append("causal")
        feats += ["causal + bool mask"] * (mask is not None) + ["causal + float mask"] * (bias is not None)
    if case.B > 1 and case.Hq > 1:
        feats.append("B > 1 and H > 1")
    ratio = _ratio_feature(case)
    if ratio:
        feats.append(ratio)
    if case.Hkv == 1 and case.Hq > 1:
        feats.append("MQA (Hkv = 1 < Hq)")
    if case.scale is not None:
        feats.append("custom scale")
    if case.Dk != case.Dv:
        feats.append("Dk != Dv")
    if case.Dk % 8 or case.Dv % 8:
        feats.append("head dim not a multiple of 8")
    if case.T in TAIL_LENGTHS or case.S in TAIL_LENGTHS:
        feats.append("tile-tail T or S (31..129)")
    if case.Dk in TAIL_LENGTHS or case.Dv in TAIL_LENGTHS:
        feats.append("tile-tail head dim (31..129)")
    feats += _layouts((case.query, case.key, case.value))
    if case.dropout_p > 0:
        feats.append("dropout")
    if case.S >= LONG_KEYS:
        feats.append("long keys S >= 4096")
    return feats


def shape_classes(case: Case) -> list[str]:
    rel = "T < S" if case.T < case.S else ("T == S" if case.T == case.S else "T > S")
    return [rel] + ["decode T = 1"] * (case.T == 1) + ["S = 1"] * (case.S == 1)


def cells_of(case: Case) -> list[str]:
    """Every (feature, shape class) cell ``case`` falls in, as "feature × class" strings."""
    if preconditions.broken(case):  # a bad input of a precondition clause is in no cell of the valid space
        return []
    try:
        feats, classes = features_of(case), shape_classes(case)
    except Exception:  # noqa: BLE001 - a malformed case (a bad-input clause's) is in no cell
        return []
    return [f"{f}{SEP}{c}" for f in feats for c in classes]


def _possible(feature: str, shape_class: str) -> bool:
    """Cells that no case can occupy, or that read as another cell (a form with a T axis at T = 1)."""
    if feature.startswith(("bool mask [", "float mask [")) and "T" in feature.split("[")[1]:
        return shape_class != "decode T = 1"
    if feature == "long keys S >= 4096":
        return shape_class == "T < S"
    return True


def admitted(decl: Declaration) -> list[str]:
    """Every cell ``decl`` admits, in table order."""
    return [f"{f}{SEP}{c}" for f, admits in FEATURES.items() if admits(decl) for c in SHAPE_CLASSES if _possible(f, c)]

"""The vocabulary of likely causes: what one kernel call exercised, as short feature strings.

``harness.causes.likely`` sets the failing cases' features against the passing cases' ones; a feature here
is worth having when a real kernel gets exactly that wrong (a dtype computed in another precision,
a mask kind or form, rows blocked entirely, causal when T != S, decode, a GQA ratio, a head dim
class, scores too large for the input dtype, a custom or negative scale, dropout, the backward, and
what the suite folded before the kernel saw it). It differs from ``harness.cases.cells`` (the coverage
table) in carrying the dtype, the call and the magnitudes, and in naming the unions a cause is
often stated in ("causal, T != S"). A call's features travel as one string, :data:`JOIN`-joined, so
that the counters of a run cross pytest-xdist workers as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from conformance.contract import PRECONDITIONS, Case, Declaration
from conformance.harness.cases import preconditions
from conformance.harness.cases.cells import form_of

JOIN = "; "
FLOAT16_MAX = 65504.0
LARGE_SCORE = 64.0  # |scale * QK^T| past this: exp() of the raw scores overflows float32 without the max subtracted
_EXACT_WORK = 4_000_000  # multiply-adds up to which QK^T is computed exactly; larger cases: first 64 query rows
BACKWARD_CALLS = frozenset({"vjp"})
LOW_PRECISION = frozenset({"float16", "bfloat16"})


def call_feature(what: str) -> str:
    """The guarded call a case went through, as a feature: the backward apart from every forward."""
    return "backward (vjp)" if what in BACKWARD_CALLS else f"forward ({what})"


def _raw_scores_max(case: Case) -> float:
    """max |Q K^T| before scaling (what overflows float16 when QK^T is not upcast); grouped heads
    are compared with their kv head. Large cases are sampled on their first 64 query rows."""
    q = np.asarray(case.query, dtype=np.float64)
    k = np.asarray(case.key, dtype=np.float64)
    if q.ndim != 4 or k.ndim != 4 or q.shape[-1] != k.shape[-1] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        return 0.0
    if q.size * k.shape[2] > _EXACT_WORK:
        q = q[:, :, :64]
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    if q.size == 0 or k.size == 0:
        return 0.0
    return float(np.max(np.abs(q @ np.swapaxes(k, -1, -2))))


def _form(shape: tuple[int, ...], case: Case) -> str:
    """The broadcast form of a mask ("[B,1,T,S]"; "1" for an axis of size 1), named for any shape."""
    named = form_of(shape, case)
    if named is not None:
        return named
    full = (case.B, case.Hq, case.T, case.S)[-len(shape) :]
    return "[" + ",".join("1" if n == 1 else "BHTS"[4 - len(shape) + i] if n == f else str(n)
                          for i, (n, f) in enumerate(zip(shape, full))) + "]"  # fmt: skip


def _mask_features(case: Case, alignment: str) -> list[str]:
    mask = None if case.mask is None else np.asarray(case.mask)
    bias = None if case.bias is None else np.asarray(case.bias)
    out = []
    kinds = [k for k, a in (("bool", mask), ("float", bias)) if a is not None]
    out.append({(): "no mask", ("bool",): "bool mask", ("float",): "float mask"}.get(tuple(kinds), "bool + float mask"))
    for kind, arr in (("bool", mask), ("float", bias)):
        if arr is None:
            continue
        out.append(f"{kind} mask {_form(arr.shape, case)}")
        out += _broadcast_features(arr.shape, case)
        if kind == "float" and np.isneginf(arr).any():
            out.append("float mask with -inf entries")
            finite = arr[np.isfinite(arr)]
            if finite.size and float(np.max(np.abs(finite))) >= 1e4:
                out.append("float mask with |M| >= 1e4")
    return out + _blocked_rows(case, mask, bias, alignment)


def _broadcast_features(shape: tuple[int, ...], case: Case) -> list[str]:
    """Which sequence axis a mask is broadcast along (size 1, or absent, where the scores have more):
    what a kernel that indexes the mask by query or key position gets wrong, or refuses."""
    out = []
    if case.T > 1 and (len(shape) < 2 or shape[-2] == 1):
        out.append("mask broadcast along T")
    if case.S > 1 and shape and shape[-1] == 1:
        out.append("mask broadcast along S")
    return out


def _blocked_rows(case: Case, mask, bias, alignment: str) -> list[str]:
    """Rows with every key blocked, by the union of the masks and causal (in the declared alignment),
    named by the policy that decides their fill (``Declaration.all_blocked_policy``)."""
    blocked = np.zeros((case.T, case.S), dtype=bool)
    if case.is_causal:
        blocked = ~np.tri(case.T, case.S, case.S - case.T if alignment == "bottom-right" else 0, dtype=bool)
    if mask is not None:
        blocked = blocked | mask
    if bias is not None:
        blocked = blocked | np.isneginf(bias)
    if not (blocked.size and blocked.all(axis=-1).any()):
        return _rows_without_keys(case)
    if bias is not None and mask is None:
        return ["row blocked entirely: float -inf"]
    return [f"row blocked entirely: {'bool' if mask is not None else 'causal'}"]


def _rows_without_keys(case: Case) -> list[str]:
    """A sequence of a varlen case with no keys (``seqlens_k`` 0) leaves its query rows without a key to see,
    the same fill question as a mask blocking them all (a kernel that gives them NaN does so for both)."""
    lens = case.seqlens_k
    if lens is not None and case.T and (np.asarray(lens) == 0).any():
        return ["row blocked entirely: lengths"]
    return []


def _causal_features(case: Case, folded: bool) -> list[str]:
    if not case.is_causal:
        return []
    out = ["causal"] + ["causal, T != S"] * (case.T != case.S)
    if case.mask is not None or case.bias is not None:
        out.append("causal + mask")
    if folded:
        out.append("suite folded causal into the mask")
    return out


def _head_dim_features(case: Case) -> list[str]:
    d = max(case.Dk, case.Dv)
    out = []
    if d <= 8:
        out.append("head dim <= 8")
    elif d > 128:
        out.append("head dim > 128")
    if case.Dk % 8 or case.Dv % 8:
        out.append("head dim not a multiple of 8")
    if case.Dk != case.Dv:
        out.append("Dk != Dv")
    return out


def _magnitude_features(case: Case) -> list[str]:
    raw = _raw_scores_max(case)
    scale = case.scale if case.scale is not None else 1.0 / np.sqrt(max(case.Dk, 1))
    out = []
    if raw > FLOAT16_MAX:
        out.append("|QK^T| > 65504 (float16 max)")
    if raw * abs(scale) >= LARGE_SCORE:
        out.append(f"large |scores| (>= {LARGE_SCORE:g})")
    return out


def features(case: Case, what: str = "forward", folded: bool = False, alignment: str = "top-left") -> list[str]:
    """Every feature of one call on ``case``; ``what`` is the guarded call, ``folded`` whether the
    adapter folded ``is_causal`` into the mask for it, ``alignment`` the declared causal alignment."""
    feats = [f"dtype={case.dtype}", call_feature(what)]
    if case.dtype in LOW_PRECISION:
        feats.append("dtype float16 or bfloat16")
    feats += _mask_features(case, alignment)
    feats.append("T < S" if case.T < case.S else ("T == S" if case.T == case.S else "T > S"))
    feats += _causal_features(case, folded)
    if case.T == 1:
        feats.append("decode T = 1")
    if case.S == 1:
        feats.append("S = 1")
    if case.Hq != case.Hkv and case.Hkv > 0 and case.Hq % case.Hkv == 0:
        feats.append(f"GQA {case.Hq // case.Hkv}:1" + (" (MQA)" if case.Hkv == 1 else ""))
    feats += _head_dim_features(case)
    feats += _magnitude_features(case)
    if case.scale is not None:
        feats.append("negative scale" if case.scale < 0 else "custom scale")
        if case.scale == 0:  # softmax of the mask alone: -inf * 0 = NaN in a kernel that masks before it scales
            feats.append("zero scale")
    if case.dropout_p > 0:
        feats.append("dropout")
    feats += [name for name, size in EMPTY_SIZES if getattr(case, size) == 0]
    return feats + _variant_features(case) + _presentation_features(case, what)


def _memory(a) -> str:
    a = np.asarray(a)
    if any(st == 0 and n > 1 for n, st in zip(a.shape, a.strides)):
        return "an input expanded (stride 0)"
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is not a and a.size and a.__array_interface__["data"][0] != root.__array_interface__["data"][0]:
        return "an input at a storage offset"
    return "" if a.flags.c_contiguous else "a non-contiguous input"


def _presentation_features(case: Case, what: str) -> list[str]:
    """How the case reached the kernel besides its values: a kernel wrong only there is named by it."""
    out = sorted({m for m in (_memory(x) for x in (case.query, case.key, case.value)) if m})
    if case.query is case.key or case.key is case.value:
        out.append("one object for two arguments")
    pres = case.presentation
    if pres is None:
        return out
    if pres.requires_grad is not None:
        out.append("M asks for its gradient" if "bias" in pres.requires_grad else "some inputs ask for a gradient")
    if what not in BACKWARD_CALLS and pres.grad_mode != "no_grad":
        out.append({"grad": "forward under autograd", "inference": "forward under inference mode"}[pres.grad_mode])
    if what in BACKWARD_CALLS and pres.backward == "twice":
        out.append("backward twice over one graph")
    if pres.default_dtype == "float64":
        out.append("default dtype float64")
    if pres.threads is not None:
        out.append("another thread count")
    return out


# The empty sizes a caller meets (a batch with no prompts, no token yet, no key cached yet), as features: a
# kernel may refuse them or answer them, never crash (EMPTY-SIZES-*), and a cause can be scoped to them.
EMPTY_SIZES = (("no queries (T = 0)", "T"), ("no keys (S = 0)", "S"), ("no batch items (B = 0)", "B"))


def _variant_features(case: Case) -> list[str]:
    """The variants of FlashAttention's signature a case uses: a kernel that ignores one (a window it
    drops when no mask is given) is wrong on those cases alone, and the cause should say which."""
    named = (("sliding window", case.window is not None), ("softcap", bool(case.softcap)),
             ("ALiBi", case.alibi_slopes is not None), ("attention sinks", case.sinks is not None),
             ("varlen lengths", case.is_varlen))  # fmt: skip
    return [name for name, used in named if used]


def key(case: Case, what: str = "forward", folded: bool = False, alignment: str = "top-left") -> str | None:
    """The features of one call as one string (a Counter key that survives JSON): for a case that breaks
    a precondition of 000 §8, which ones (``bad input: kv-length``) and its dtype; None for a case the
    vocabulary cannot read otherwise."""
    try:
        bad = preconditions.features(case)
        if bad:
            return JOIN.join([*bad, f"dtype={case.dtype}"])
        return JOIN.join(features(case, what, folded, alignment))
    except Exception:  # noqa: BLE001 - a malformed case has no features; the call is still checked
        return None


# Every feature :func:`features` can produce, for checking one written by hand (an expectations file's
# ``when``): the fixed ones, and patterns for those that carry a value (a dtype, a call, a mask form,
# a GQA ratio).
FIXED = frozenset(
    {
        "dtype float16 or bfloat16", "no mask", "bool mask", "float mask", "bool + float mask",
        "float mask with -inf entries", "float mask with |M| >= 1e4", "row blocked entirely: bool",
        "row blocked entirely: causal", "row blocked entirely: float -inf", "row blocked entirely: lengths",
        "T < S", "T == S", "T > S",
        "causal", "causal, T != S", "causal + mask", "suite folded causal into the mask", "decode T = 1",
        "S = 1", "head dim <= 8", "head dim > 128", "head dim not a multiple of 8", "Dk != Dv",
        "|QK^T| > 65504 (float16 max)", f"large |scores| (>= {LARGE_SCORE:g})", "negative scale",
        "custom scale", "zero scale", "dropout", call_feature("vjp"), "mask broadcast along T",
        "mask broadcast along S", "sliding window", "softcap", "ALiBi", "attention sinks", "varlen lengths",
        *(name for name, _ in EMPTY_SIZES), "an input expanded (stride 0)", "an input at a storage offset",
        "a non-contiguous input", "one object for two arguments", "M asks for its gradient",
        "some inputs ask for a gradient", "forward under autograd", "forward under inference mode",
        "backward twice over one graph", "default dtype float64", "another thread count",
    }
)  # fmt: skip
_PATTERNS = (
    re.compile(r"dtype=(float64|float32|float16|bfloat16)"),
    re.compile(r"forward \((forward|forward_with_weights|forward_with_lse)\)"),
    re.compile(r"(bool|float) mask \[[0-9A-Z,]+\]"),
    re.compile(r"GQA [0-9]+:1( \(MQA\))?"),
    re.compile(re.escape(preconditions.FEATURE) + "(" + "|".join(map(re.escape, PRECONDITIONS)) + ")"),
)
EXAMPLES = ("causal + mask", "dtype=float16", "backward (vjp)", "bool mask [B,1,1,S]", "decode T = 1")


def is_known(feature: str) -> bool:
    """Whether :func:`features` can produce ``feature`` (spelled exactly as it prints it)."""
    return feature in FIXED or any(p.fullmatch(feature) for p in _PATTERNS)


def split(k: str) -> frozenset[str]:
    return frozenset(k.split(JOIN)) if k else frozenset()


def folded_by(adapter: object, decl: Declaration, case: Case, refusals_before: int | None) -> bool:
    """Whether the adapter folded ``is_causal`` into the mask on this call: it says so by the growth
    of its ``combination_refusals`` (implementations/function.py), or it always folds
    (``causal_with_mask=False``)."""
    if not case.is_causal or (case.mask is None and case.bias is None):
        return False
    if decl.causal_with_mask is False:
        return True
    now = getattr(adapter, "combination_refusals", None)
    return refusals_before is not None and now is not None and len(now) > refusals_before


def refusal_count(adapter: object) -> int | None:
    refusals = getattr(adapter, "combination_refusals", None)
    return None if refusals is None else len(refusals)


def cap(counter: Iterable[tuple[str, int]], limit: int = 200) -> dict[str, int]:
    """The ``limit`` most common feature strings of a counter (JSON-sized); the rest are dropped."""
    return dict(sorted(counter, key=lambda kv: -kv[1])[:limit])

"""000 §8's preconditions, one by one: what each asks of a call, and which of them a case breaks.

The article's kernel states them as code (its ``raise`` lines): 4-D floating tensors of one dtype;
matching batch and head dims, feature dims of Q and K, lengths of K and V; a mask that broadcasts to
[B, H, T, S] (§4, §7.1); ``dropout_p`` in [0, 1]; and, where the signature has a GQA flag, grouped
heads only with it (§4's "batch 和 head 数一致"; 003 names grouped heads as their own structure). A
kernel that returns a number for a call that breaks one has answered a question nobody asked: a
caller's bug (a [B, S] padding mask passed as is, K and V of different lengths) becomes a plausible
array. Each precondition has a name (``contract.PRECONDITIONS``) that ``--declare accepts_invalid=``
takes and the verdict prints; :func:`broken` reads them off a case, so that a failure's likely cause
and an expectations file can name the precondition ("bad input: kv-length").
"""

from __future__ import annotations

import numpy as np

from conformance.contract import PRECONDITIONS, Case, np_dtype

# What each precondition asks, in the words the verdict uses ("accepts <what is broken>").
WORDS: dict[str, str] = {
    "rank": "a query, key or value that is not 4-D",
    "integer": "integer query, key and value",
    "mixed-dtype": "a key whose dtype differs from the query's",
    "batch": "key and value batch 1 against query batch 2",
    "heads": "query heads not a multiple of the key heads",
    "gqa-flag": "grouped heads without the GQA flag",
    "feature": "a key feature dim that differs from the query's",
    "kv-length": "key and value of different lengths",
    "mask-shape": "a mask that does not broadcast to [B, H, T, S]",
    "mask-larger": "a mask larger than [B, H, T, S] (an extra leading axis)",
    "dropout-range": "dropout_p outside [0, 1]",
}
assert tuple(WORDS) == PRECONDITIONS
FEATURE = "bad input: "  # the likely-cause feature of a case that breaks a precondition


def _floats() -> set:
    return {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np_dtype("bfloat16")}


def broken(case: Case) -> list[str]:
    """The preconditions ``case`` breaks, by name, in :data:`PRECONDITIONS` order (empty for a valid case)."""
    q, k, v = (np.asarray(x) for x in (case.query, case.key, case.value))
    out: list[str] = []
    if any(x.ndim != 4 for x in (q, k, v)):
        return ["rank"]  # nothing else is read off arrays of another rank
    floats = _floats()
    if any(x.dtype not in floats for x in (q, k, v)):
        out.append("integer")
    elif k.dtype != q.dtype or v.dtype != q.dtype:
        out.append("mixed-dtype")
    if k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        out.append("batch")
    hkv = k.shape[1]
    if hkv == 0 or q.shape[1] % hkv or v.shape[1] != hkv:
        out.append("heads")
    elif q.shape[1] != hkv and case.enable_gqa is False:
        out.append("gqa-flag")
    if k.shape[3] != q.shape[3]:
        out.append("feature")
    if k.shape[2] != v.shape[2]:
        out.append("kv-length")
    if case.mask is not None:
        m = np.shape(case.mask)
        full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if len(m) > 4:
            out.append("mask-larger")
        elif any(a not in (1, b) for a, b in zip(m[::-1], full[::-1])):
            out.append("mask-shape")
    if not 0.0 <= case.dropout_p <= 1.0:
        out.append("dropout-range")
    return out


def features(case: Case) -> list[str]:
    """``bad input: <name>`` for each precondition ``case`` breaks."""
    return [FEATURE + name for name in broken(case)]

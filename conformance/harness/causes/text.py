"""Likely causes in words: the measured error in units of the relevant precision, the ``--declare``
a cause's failing outputs match, and the summary lines and Markdown section (``harness.causes.likely``
computes them; the plugin's summary and the certificate print them)."""

from __future__ import annotations

import statistics
from collections import Counter

from conformance.harness.causes import conflicts, gross
from conformance.harness.causes.blocked_weight import BLOCKED_WEIGHT
from conformance.harness.causes.conventions import CAUSAL_IGNORED, FINITE_ADDITIVE, FINITE_FILL, in_units

# What a matched convention (or a feature without one) most likely means, in a few words.
_HINTS = {
    "float64_computed_as=float32": "float64 computed in float32?",
    "causal_alignment=bottom-right": "causal mask aligned bottom-right (the KV-cache offset)?",
    "causal_alignment=top-left": "causal mask aligned top-left?",
    "mask_sense=attend": "boolean mask read as True = may attend?",
    "mask_sense=blocked": "boolean mask read as True = blocked?",
    "all_blocked=mean-v": "rows blocked entirely give the mean of V (a finite fill instead of -inf?)",
    "all_blocked=nan": "rows blocked entirely give NaN",
    "all_blocked=zeros": "rows blocked entirely give zeros",
    "all_blocked_float_mask=mean-v": "rows of -inf in a float mask give the mean of V",
    "all_blocked_float_mask=nan": "rows of -inf in a float mask give NaN",
    "all_blocked_float_mask=zeros": "rows of -inf in a float mask give zeros",
    FINITE_ADDITIVE: "blocked keys (the mask's, or causal's) get a finite additive fill (such as -1e4 or -1e9) "
    "instead of -inf: keys scoring far above it keep their weight (000 §3: a finite negative number is not blocking)",
    FINITE_FILL: "rows blocked entirely give the softmax over every key: blocked keys get a finite fill "
    "(e.g. -1e4) instead of -inf (000 §7.3)?",
    CAUSAL_IGNORED: "is_causal ignored: the output is that of the same case without causal?",
}
# Formulations (conformance/oracle_formulations.py): the field's hint, whatever its value.
_FIELD_HINTS = {
    "float32_computed_as": "float32 products take lower-precision operands (TF32, bfloat16 or float16)?",
    "float16_computed_as": "float16 QK^T formed in float16, not upcast first (000 §8)?",
    "bfloat16_computed_as": "bfloat16 QK^T formed in bfloat16, not upcast first (000 §8)?",
    "scale_applied": "Q multiplied by the scale in the input dtype before the product?",
    "blocked_fill": "blocked keys get a finite fill instead of -inf (000 §3)?",
}
_FEATURE_HINTS = {
    BLOCKED_WEIGHT: "blocked keys get a non-zero weight (000 §7.3 / §8 require exactly 0: -inf before softmax, "
    "not a clipped exp or a finite fill)",
    "|QK^T| > 65504 (float16 max)": "QK^T overflows float16: not upcast before QK^T (000 §8)?",
    "large |scores| (>= 64)": "large scores mishandled (no max subtracted, or a finite fill for blocked keys)?",
    "row blocked entirely: bool": "the fill of rows blocked entirely (000 §8: weights and output 0)?",
    "row blocked entirely: float -inf": "the fill of rows of -inf in a float mask?",
    "row blocked entirely: lengths": "the fill of rows whose sequence has no keys (000 §8: output 0)?",
    "row blocked entirely": "the fill of rows with no key to see (000 §8: weights and output 0)?",
    "zero scale": "a scale of 0: the mask applied before the scale (-inf x 0 = NaN), or 0 read as no scale?",
    "negative scale": "a negative scale: the mask applied before the scale (-inf x -s = +inf), or sqrt(scale) "
    "on Q and K?",
    "causal, T != S": "causal alignment when T != S?",
    "sliding window": "the sliding window not applied, or at another offset (keys outside it keep their weight)?",
    "softcap": "the softcap not applied, or applied after the mask or the scale?",
    "ALiBi": "the ALiBi bias not applied, or with the slopes or the distance's sign wrong?",
    "attention sinks": "the attention sinks left out of the softmax's denominator?",
    "varlen lengths": "per-sequence lengths misread (a sequence's padding attended, or its rows misaligned)?",
    "backward (vjp)": "the backward pass?",
    "dtype=float64": "float64 computed in a lower precision (000 §8 keeps float64)?",
    "dtype=float16": "float16 computed in float16: QK^T or the softmax not upcast to float32 (000 §8)?",
    "dtype=bfloat16": "bfloat16 computed in bfloat16: QK^T or the softmax not upcast to float32 (000 §8)?",
    "dtype float16 or bfloat16": "low precision computed in the input dtype: not upcast to float32 (000 §8)?",
}


# A --declare (or finding) is suggested for a cause only when it is about one of the cause's features.
_ABOUT = {
    "float64_computed_as": ("dtype=float64",),
    "causal_alignment": ("causal",),
    "mask_sense": ("bool mask",),
    "all_blocked": ("row blocked entirely",),
    "all_blocked_float_mask": ("row blocked entirely",),
    FINITE_FILL: ("row blocked entirely",),
    CAUSAL_IGNORED: ("causal",),
    "float32_computed_as": ("dtype=float32",),
    "float16_computed_as": ("dtype=float16", "dtype float16 or bfloat16", "|QK^T| > 65504", "large |scores|"),
    "bfloat16_computed_as": ("dtype=bfloat16", "dtype float16 or bfloat16", "large |scores|"),
    "scale_applied": ("dtype=float16", "dtype=bfloat16", "dtype float16 or bfloat16", "large |scores|"),
    "blocked_fill": ("row blocked entirely", "bool mask", "causal", "large |scores|"),
    FINITE_ADDITIVE: ("causal", "bool mask", "float mask", "large |scores|", "|QK^T|", "row blocked entirely"),
}


def about(match: str, features: list[str]) -> bool:
    """Whether the convention ``match`` (a ``--declare`` or a finding) is about one of ``features``."""
    prefixes = _ABOUT.get(match.split("=")[0], ())
    return any(f.startswith(prefixes) for f in features) if prefixes else False


def names_a_mechanism(features: list[str]) -> int:
    """How specifically a feature of the set names a known way kernels fail: 0 for none, higher for
    an earlier (more specific) entry of :data:`_FEATURE_HINTS`."""
    order = list(_FEATURE_HINTS)
    return max((len(order) - order.index(f) for f in features if f in _FEATURE_HINTS), default=0)


def _votes(rows: list[dict], features: list[str]) -> Counter:
    return Counter(m for r in rows for m in (r["failure"].get("matches") or []) if about(m, features))


def conflicting(rows: list[dict], features: list[str]) -> dict[str, list[str]]:
    """Fields about ``features`` whose failing outputs match more than one value (causes.conflicts)."""
    return conflicts.conflicts(rows, lambda m: about(m, features))


# Conventions a declaration states for every dtype at once: matched by the failures of one dtype alone,
# they are that dtype's behaviour (jax 0.10.0's float64 rows blocked entirely give NaN, its float32 rows
# the declared mean of V), which no --declare says.
_EVERY_DTYPE = ("all_blocked", "all_blocked_float_mask", "causal_alignment", "mask_sense")


def dtype_scope(features: list[str], convention: str | None) -> str | None:
    """The one dtype a cause is stated in (``dtype=float64``) when its convention is one a declaration
    states for every dtype: the convention then holds for that dtype alone; None otherwise."""
    if not convention or convention.split("=")[0] not in _EVERY_DTYPE:
        return None
    dtypes = [f.partition("=")[2] for f in features if f.startswith("dtype=")]
    return dtypes[0] if len(dtypes) == 1 else None


def suggestion(rows: list[dict], features: list[str]) -> tuple[str | None, int, int]:
    """(convention, failing outputs that match it, outputs it could be checked on): the convention
    about ``features`` that most of the checked failing outputs match, or (None, 0, checked)."""
    checked = sum(1 for r in rows if r["failure"].get("checked"))
    votes = _votes(rows, features)
    if not votes or conflicting(rows, features):
        return None, 0, checked
    # Ties: a setting over a finding, and an allowed convention over a formulation (a departure).
    best, n = max(votes.items(), key=lambda kv: (kv[1], "=" in kv[0], kv[0].split("=")[0] not in _FIELD_HINTS))
    best, n = _per_dtype_formulations(rows, votes, best, n)
    return (best, n, checked) if 2 * n >= max(checked, 1) else (None, 0, checked)


_PER_DTYPE = ("float16_computed_as", "bfloat16_computed_as", "float32_computed_as", "float64_computed_as")


def _per_dtype_formulations(rows: list[dict], votes: Counter, best: str, n: int) -> tuple[str, int]:
    """A cause whose failures span dtypes, each matching its own dtype's formulation (float16 products
    in float16, bfloat16 products in bfloat16), is one ``--declare`` per dtype: the best match of each
    such field, joined, counted over the outputs matching any of them."""
    field = best.split("=")[0]
    if field not in _PER_DTYPE:
        return best, n
    picks = {}
    for match, _ in votes.most_common():
        f = match.split("=")[0]
        if f in _PER_DTYPE and f not in picks:
            picks[f] = match
    if len(picks) < 2:
        return best, n
    chosen = list(picks.values())
    hit = sum(1 for r in rows if any(m in chosen for m in (r["failure"].get("matches") or ())))
    return " --declare ".join(chosen), hit


def _unit_dtype(dtype: str, rel: float) -> str:
    """float64 errors of rounding size past float64's own are read in float32 units (computed in float32?)."""
    return "float32" if dtype == "float64" and 2.0**-40 < rel < 2.0**-10 else dtype


def errors_summary(rows: list[dict]) -> dict[str, dict]:
    """Per dtype: the median worst relative error, in units of the relevant precision, and how
    far past the allowance, with the maximum of each beside it (one case of 1e30 among rounding slips
    must show); NaN outputs counted apart."""
    out: dict[str, dict] = {}
    by_dtype: dict[str, list[dict]] = {}
    for r in rows:
        if r["failure"].get("measure"):
            by_dtype.setdefault(str(r["failure"].get("dtype") or r["dtype"]), []).append(r["failure"])
    for dtype, failures in sorted(by_dtype.items()):
        ms = [f["measure"] for f in failures]
        rels = [m["rel_err"] for m in ms if isinstance(m.get("rel_err"), float)]
        ratios = [m["err"] / m["allowed"] for m in ms if _num(m.get("err")) and _num(m.get("allowed")) and m["allowed"]]
        entry: dict = {"cases": len(ms), "nan_cases": sum(1 for m in ms if m.get("nan"))}
        if rels:
            med = statistics.median(rels)
            entry.update(median_rel_err=med, in_units=in_units(med, _unit_dtype(dtype, med)), max_rel_err=max(rels))
        if ratios:
            entry["times_allowed"] = statistics.median(ratios)
        worst = max(failures, key=gross.severity)
        top = gross.ratio(worst["measure"])
        entry["max_times_allowed"] = top if top != float("inf") else "inf"  # JSON-safe (the certificate)
        entry["worst"] = gross.describe(worst)
        out[dtype] = entry
    return out


def _num(x) -> bool:
    return isinstance(x, float | int) and x == x and abs(x) != float("inf")


# Hints that say a precision: they fit rounding-size errors, never wrong values (NaN in a row is no precision).
_PRECISION_HINTS = frozenset(
    {"dtype=float64", "dtype=float16", "dtype=bfloat16", "dtype float16 or bfloat16", "|QK^T| > 65504 (float16 max)"}
)
_NAN_HINTS = {
    "row blocked entirely: bool": "rows blocked entirely give NaN (the softmax of a row of -inf: 0/0), "
    "not 000 §8's zeros",
    "row blocked entirely: float -inf": "rows of -inf in a float mask give NaN (0/0), not 000 §8's zeros",
    "row blocked entirely: causal": "rows causal blocks entirely give NaN (0/0), not 000 §8's zeros",
    "row blocked entirely: lengths": "rows of a sequence with no keys give NaN (0/0), not 000 §8's zeros",
    "row blocked entirely": "rows blocked entirely (by a mask, a float mask of -inf, causal or a sequence with no "
    "keys) give NaN (0/0), not 000 §8's zeros",
}


def measured(cause: dict) -> str:
    """What the failing outputs show, measured, for a cause no hypothesis fits: the error the kernel
    raised, the NaN it returned, or how far its values are off."""
    parts = []
    if cause.get("raised"):
        r = cause["raised"]
        parts.append(f"the kernel raised {r['error']}: {r['message']} ({r['tests']} of {r['of']} failing clause tests)")
    errors = cause.get("errors") or {}
    nan = sum(e.get("nan_cases", 0) for e in errors.values())
    cases = sum(e.get("cases", 0) for e in errors.values())
    if nan:
        parts.append(f"NaN where the oracle gives numbers in {nan} of {cases} measured failing outputs")
    rels = [e["max_rel_err"] for e in errors.values() if isinstance(e.get("max_rel_err"), float)]
    if rels and not nan:
        top = within_allowance(cause)
        if cause.get("wrong_values"):
            parts.append(f"values off by up to {max(rels):.3g} relative (past any rounding)")
        elif top is not None:
            parts.append(f"errors of up to {max(rels):.3g} relative, within the allowance ({top:.3g}x)")
        else:
            parts.append(f"errors of up to {max(rels):.3g} relative, past the allowance")
    if not parts and cause.get("calls"):
        parts.append("failed checks without a measured error (" + ", ".join(sorted(cause["calls"])) + " calls)")
    return "measured: " + "; ".join(parts) if parts else ""


def hint(cause: dict) -> str:
    """What the cause most likely is, in a few words: from the matched convention, else its features
    (the float16 overflow only where every failing case is float16 or bfloat16; no precision for
    wrong values), else what the failing outputs show (:func:`measured`)."""
    found = _hint(cause)
    return found or measured(cause)


def within_allowance(cause: dict) -> float | None:
    """The worst error over allowance of a cause whose every measured failure is within the allowance (and none
    NaN): a rule beyond the error model failed (a bitwise claim, a count, a structure); None otherwise."""
    errors = (cause.get("errors") or {}).values()
    tops = [e.get("max_times_allowed") for e in errors]
    if not tops or any(e.get("nan_cases") for e in errors) or not all(_num(t) and t <= 1.0 for t in tops):
        return None
    return max(float(t) for t in tops)


def _hint(cause: dict) -> str:
    top = within_allowance(cause)
    if top is not None and not cause.get("raised") and not cause.get("blocked_weight"):
        return (
            f"errors within the allowance (up to {top:.3g}x allowed): not a precision or a formulation; the rule "
            f"{', '.join(cause.get('clause_ids') or ['of the clause'])} states beyond the error model failed "
            "(a bitwise claim, a count, a structure: its message says which)"
        )
    if cause.get("blocked_weight"):
        return (
            f"blocked keys get weight up to {cause['blocked_weight']:.3g} (000 §7.3 / §8 require exactly 0: "
            "-inf before softmax, not a clipped exp or a finite fill)"
        )
    if cause.get("precision"):
        return f"every dtype computed at {cause['precision']} precision (its products' operands or results rounded)?"
    if cause.get("declare") in _HINTS:
        scope = dtype_scope(cause["features"], cause["declare"])
        text = _HINTS[cause["declare"]]
        return f"{text.rstrip('?')} in {scope} only (the other dtypes follow the declaration)" if scope else text
    field = str(cause.get("declare") or "").split("=")[0]
    if field in _FIELD_HINTS:
        return _FIELD_HINTS[field]
    if cause.get("conflicts"):
        return "; ".join(
            f"the failing outputs match {field} = {' in some cases, '.join(values)} in others: it depends on the "
            "case (its size, its dtype), which no declaration says"
            for field, values in cause["conflicts"].items()
        )
    low = set(cause.get("dtypes") or ()) <= {"float16", "bfloat16"}
    feats = [f for f in cause["features"] if low or f != "|QK^T| > 65504 (float16 max)"]
    if not low and len(feats) < len(cause["features"]):
        feats.append("large |scores| (>= 64)")
    nan = any(e.get("nan_cases") for e in (cause.get("errors") or {}).values())
    if nan:
        found = next((_NAN_HINTS[f] for f in cause["features"] if f in _NAN_HINTS), None)
        if found:
            dtypes = [f.partition("=")[2] for f in cause["features"] if f.startswith("dtype=")]
            return found + (f", in {dtypes[0]} only" if len(dtypes) == 1 else "")
    if cause.get("wrong_values") or nan or cause.get("raised"):
        feats = [f for f in feats if f not in _PRECISION_HINTS]
    found = next((_FEATURE_HINTS[f] for f in feats if f in _FEATURE_HINTS), "")
    if found and cause.get("raised"):
        found += "; " + measured(cause)
    return found


def _times(ratio: float | str) -> str:
    ratio = float(ratio)
    return (
        "a non-finite error" if ratio == float("inf") else f"{ratio:.3g}x allowed" if ratio < 1e6 else ">1e6x allowed"
    )


def _errors_line(errors: dict[str, dict]) -> str:
    parts = []
    for dtype, e in errors.items():
        rel = e.get("median_rel_err")
        if rel is None:
            text = dtype
        elif rel < 2.0**-6:
            text = f"{dtype} ~{e['in_units']} relative"
        else:
            text = f"{dtype} relative error {rel:.3g}"
        if "times_allowed" in e:
            text += f", {_times(e['times_allowed'])}"
        if e.get("nan_cases"):
            text += f", NaN in {e['nan_cases']} of {e['cases']}"
        text += f" (median of {e['cases']}"
        higher = float(e.get("max_times_allowed", 0)) > e.get("times_allowed", 0)
        if e["cases"] > 1 and (e.get("max_rel_err", 0) > (rel or 0) or higher):
            top = e.get("max_rel_err")
            text += (
                "; max " + (f"relative error {top:.3g}, " if top is not None else "") + _times(e["max_times_allowed"])
            )
        parts.append(text + ")")
    return "; ".join(parts)


def _title(n: int, cause: dict) -> str:
    """ "n. features", prefixed "wrong values, not rounding:" for a cause of errors past any rounding."""
    wrong = f"{gross.WRONG_VALUES}: " if cause.get("wrong_values") else ""
    return f"{n}. {wrong}{' + '.join(cause['features'])}"


def cause_lines(n: int, cause: dict) -> list[str]:
    """One cause in the summary: its features and counts, its errors, its hint and ``--declare``."""
    calls = ", ".join(f"{k} {v}" for k, v in sorted(cause["calls"].items()))
    lines = [
        f"{_title(n, cause)}: {cause['clause_tests']} failing clause tests of "
        f"{cause['clauses']} clauses ({calls}); in {cause['passing_cases_with_it']} of {cause['passing_cases']} "
        "passing cases"
    ]
    if cause["errors"]:
        lines.append(f"   errors: {_errors_line(cause['errors'])}")
        if cause.get("wrong_values"):
            worst = max(cause["errors"].values(), key=lambda e: float(e.get("max_times_allowed", 0)))
            lines.append(f"   worst: {worst['worst']}")
    text = hint(cause)
    if cause.get("declare"):
        scoped = dtype_scope(cause["features"], cause["declare"])
        what = f"--declare {cause['declare']}" if "=" in cause["declare"] and not scoped else "measured"
        text += (
            f" {what} (the failing output matches it in {cause['declare_matched']} of the "
            f"{cause['declare_checked']} failing outputs checked)"
        )
    if cause.get("not_declarable"):
        text += f" (no field says it of {', '.join(cause['not_declarable'])})"
    if text:
        lines.append(f"   {text.strip()}")
    lines.append(f"   clauses: {', '.join(cause['clause_ids'][:8])}{' ...' if len(cause['clause_ids']) > 8 else ''}")
    return lines


def summary_lines(spec: str, found: dict) -> list[str]:
    """The ``likely causes`` lines of one adapter (empty when it had no failure)."""
    if not found.get("failures"):
        return []
    lines = [f"{spec}: {found['failures']} failing clause tests"]
    for n, cause in enumerate(found["causes"], 1):
        lines += ["  " + ln for ln in cause_lines(n, cause)]
    if found["unexplained"]:
        shown = ", ".join(found["unexplained"][:10])
        more = " ..." if len(found["unexplained"]) > 10 else ""
        lines.append(f"  not explained by a feature set: {shown}{more}")
    return lines


def markdown(found: dict | None) -> list[str]:
    """The certificate's ``Likely causes`` section for one adapter."""
    if not found or not found.get("failures"):
        return []
    out = [
        "## Likely causes\n",
        f"{found['failures']} failing clause tests, grouped by the smallest feature "
        "sets present in the failing cases and absent or rare in the passing ones (root cause first).\n",
    ]
    for n, cause in enumerate(found["causes"], 1):
        first, *rest = cause_lines(n, cause)
        head = _title(n, cause)
        out.append(f"{n}. **{head[len(str(n)) + 2 :]}**{first[len(head) :]}")
        out += [f"   - {ln.strip()}" for ln in rest]
    if found["unexplained"]:
        out.append(f"\nNot explained by a feature set: {', '.join(found['unexplained'])}")
    return out + [""]

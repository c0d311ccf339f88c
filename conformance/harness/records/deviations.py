"""Declared deviations from the spec: which declaration values depart from a rule the spec states.

A declaration says what a kernel does, and the clauses test it *as declared*, so a kernel that fills
rows blocked entirely with the mean of V passes every clause under ``all_blocked=mean-v``. That is
conformance to its declaration, not to the spec: the verdict says ``CONFORMS AS DECLARED`` and lists
each value below with the spec sentence it departs from (harness.records.verdict). Only rules the spec
*states* are deviations:

* 000 §8: a row whose keys are all blocked has weights and output 0 (``all_blocked``, and
  ``all_blocked_float_mask`` for rows of ``-inf`` in an additive mask; ``mean_v_keys="buffer"`` is
  which mean a ``mean-v`` fill takes, so it departs from the same sentence).
* 000 §8: float64 inputs stay float64 (``float64_computed_as="float32"``).
* 000 §8: the products are formed after raising the precision, with no reduced-precision matmul
  (``float32_computed_as`` tf32 / bfloat16 / float16; ``float16_computed_as`` and
  ``bfloat16_computed_as`` ``-products`` / ``-scores``; ``scale_applied="query"``, Q scaled in the
  input dtype before the upcast).
* 000 §3: blocked positions get -inf; a finite number "is not strictly equivalent to blocking"
  (``blocked_fill``; the mean of V it gives a row blocked entirely is listed with it, not again as
  ``all_blocked=mean-v``, which 000 §8's zero rows would otherwise list).
* 003 "逐步推导": each weight is exp(s_ij - m_i) over its row's sum, so its error is relative to
  itself; a merge whose error is relative to the output's norm departs from it (``normwise_merges``).
* 000 §8: the preconditions (4-D floating tensors of one dtype, matching dims, ...) are refused
  when broken (``validates_inputs=False``: none is; ``accepts_invalid``: the named ones are not).

These formulations are judged against the oracle re-run under them (conformance/oracle_formulations.py),
so a kernel that follows one exactly passes every clause, and the verdict says which it follows.

What the spec leaves open or a kernel merely lacks is not a deviation: capability limits (no
dropout, no GQA, fewer dtypes, a maximum head dim, Dk == Dv, no custom scale, no float mask), the
boolean mask's sense (000 §10 documents both), causal alignment when T != S (000 §9
notes the offset a KV cache needs), and the variants' conventions (``lse_base``, ``lse_empty``),
which the seed does not define. The rule reads the final declaration only, so a ``--declare``
override (or discovery) that sets one of these values creates the deviation too.

The quoted sentences are checked verbatim against the seed by tests/test_citations.py, as the
clauses' own are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conformance.contract import PRECONDITIONS as PRECONDITION_NAMES
from conformance.contract import Declaration
from conformance.harness.cases.preconditions import WORDS
from conformance.harness.spec.clause import Source

ALL_BLOCKED_ZERO = Source("000", "§8 最小 PyTorch 实现", "本实现明确约定该行的权重和输出为 0，避免 NaN。")
FLOAT64_KEPT = Source("000", "§8 最小 PyTorch 实现", "float64 输入则保留 float64。")
PRECISION_FIRST = Source(
    "000", "§8 最小 PyTorch 实现", "先提高精度，再做点积；禁用外层 autocast 对这里矩阵乘法的降精度。"
)
UPCAST_FIRST = Source("000", "§8 为什么在点积之前提高精度", "这里将低精度输入转为 float32 后才计算点积和 softmax")
SCALE_AFTER_UPCAST = Source("000", "§8 最小 PyTorch 实现", "先提高精度，再做点积")
NEG_INF = Source(
    "000",
    "§3 矩阵形式",
    "禁止注意的位置加 $-\\infty$ 。用有限负数替代时，要结合 dtype 和分数范围选择数值；它并不严格等价于屏蔽。",
)
PER_WEIGHT = Source("003", "逐步推导", "p_ij = exp(s_ij - m_i) / Σ_j exp(s_ij - m_i)")
PRECONDITIONS = Source(
    "000", "§8 最小 PyTorch 实现", "要求 Q、K、V 是同设备、同 dtype 的有限浮点张量，batch 和 head 数一致"
)


@dataclass(frozen=True)
class Deviation:
    """One declared value that departs from a rule the spec states."""

    field: str
    value: Any
    what: str  # what the kernel does instead, in words
    source: Source  # the spec sentence it departs from

    def describe(self) -> str:
        """One line: ``field=value`` (what it does), departing from the cited sentence."""
        return f"{self.field}={self.value} ({self.what}) departs from {self.source.cite()}"

    def as_dict(self) -> dict:
        return {
            "field": self.field,
            "value": self.value,
            "what": self.what,
            "file": self.source.file,
            "section": self.source.section,
            "sentence": self.source.text,
            "citation": self.source.cite(),
        }


_FILL = {"nan": "NaN", "mean-v": "the mean of V"}

# (field, does this declaration deviate?, what the kernel does, the sentence it departs from)
RULES: tuple[tuple[str, Callable[[Declaration], bool], Callable[[Declaration], str], Source], ...] = (
    (
        "all_blocked",
        # under a declared finite fill the mean of V is what the fill gives: listed with the fill
        lambda d: d.all_blocked != "zeros" and not (d.all_blocked == "mean-v" and d.blocked_fill != "-inf"),
        lambda d: f"a row whose keys a boolean mask blocks entirely gets {_FILL.get(d.all_blocked, d.all_blocked)}",
        ALL_BLOCKED_ZERO,
    ),
    (
        "mean_v_keys",
        lambda d: d.all_blocked == "mean-v" and d.mean_v_keys == "buffer",
        lambda d: (
            "the mean of V a row that sees no key gets is over every slot of the padded key buffer, past-the-end "
            "padding included"
        ),
        ALL_BLOCKED_ZERO,
    ),
    (
        "all_blocked_float_mask",
        lambda d: d.all_blocked_float_mask not in (None, "zeros"),
        lambda d: (
            "a row of -inf in an additive mask gets "
            + _FILL.get(str(d.all_blocked_float_mask), str(d.all_blocked_float_mask))
        ),
        ALL_BLOCKED_ZERO,
    ),
    (
        "float64_computed_as",
        lambda d: d.float64_computed_as != "float64",
        lambda d: f"float64 inputs are computed in {d.float64_computed_as}",
        FLOAT64_KEPT,
    ),
    (
        "float32_computed_as",
        lambda d: d.float32_computed_as != "float32",
        lambda d: f"float32 products take {d.float32_computed_as} operands (Q, K, P, V rounded; float32 sums)",
        PRECISION_FIRST,
    ),
    (
        "float16_computed_as",
        lambda d: d.float16_computed_as != "float32",
        lambda d: _lowp_what("float16", d.float16_computed_as),
        UPCAST_FIRST,
    ),
    (
        "bfloat16_computed_as",
        lambda d: d.bfloat16_computed_as != "float32",
        lambda d: _lowp_what("bfloat16", d.bfloat16_computed_as),
        UPCAST_FIRST,
    ),
    (
        "scale_applied",
        lambda d: d.scale_applied == "query",
        lambda d: "Q is multiplied by the scale in the input dtype, before the upcast and the product",
        SCALE_AFTER_UPCAST,
    ),
    (
        "blocked_fill",
        lambda d: d.blocked_fill != "-inf",
        lambda d: _fill_what(d.blocked_fill),
        NEG_INF,
    ),
    (
        "validates_inputs",
        lambda d: not d.validates_inputs,
        lambda d: "inputs the preconditions rule out are not refused (what each returned is listed with the run)",
        PRECONDITIONS,
    ),
    (
        "accepts_invalid",
        lambda d: d.validates_inputs and bool(d.accepts_invalid),
        lambda d: "accepts " + "; ".join(WORDS[n] for n in PRECONDITION_NAMES if n in d.accepts_invalid),
        PRECONDITIONS,
    ),
    (
        "normwise_merges",
        lambda d: d.normwise_merges > 0,
        lambda d: f"{d.normwise_merges} merges of partial outputs err relative to the output's norm, not each weight",
        PER_WEIGHT,
    ),
)


def _lowp_what(dtype: str, how: str) -> str:
    what = f"{dtype} Q K^T is formed in {dtype} (rounded: past its range it is inf), not after an upcast"
    if how.endswith("-masked"):
        return what + f", and the additive mask M is taken and added in {dtype}"
    return what + (f", and scaled in {dtype}" if how.endswith("-scores") else "")


def _fill_what(fill: str) -> str:
    mode, _, value = fill.partition(":")
    where = "added to" if mode == "add" else "in place of"
    return (
        f"blocked keys get the finite {value} {where} their scores, not -inf: a row blocked entirely gets "
        "what the fill gives (the mean of V where it swamps the scores)"
    )


def deviations(declaration: Declaration) -> list[Deviation]:
    """The declaration's departures from rules the spec states, in :data:`RULES` order (empty: none)."""
    return [
        Deviation(name, _value(getattr(declaration, name)), what(declaration), source)
        for name, deviates, what, source in RULES
        if deviates(declaration)
    ]


def _value(v: Any) -> Any:
    """A declared value as ``--declare`` spells it (a set: its names, comma-separated, in table order)."""
    if isinstance(v, frozenset):
        return ",".join(sorted(v, key=lambda n: PRECONDITION_NAMES.index(n) if n in PRECONDITION_NAMES else 99))
    return v


def grouped(deviations: list[dict]) -> list[dict]:
    """The deviations (as dicts) one per spec sentence departed from, in first-seen order: the verdict's
    lines and the matrix's notes. One rule broken in two dtypes (float16 and bfloat16 products formed
    without the upcast) is one departure, told once with each declared value: ``{"declare": "f=v, g=w",
    "what": ..., "citation": ..., "fields": [f, g]}``. The certificate's table keeps a row per field."""
    by_sentence: dict[str, dict] = {}
    for d in deviations:
        key = str(d.get("citation") or d.get("field"))
        group = by_sentence.setdefault(
            key,
            {"fields": [], "declare": [], "what": [], **{k: d.get(k) for k in ("citation", "file", "section")}},
        )
        group["fields"].append(d.get("field"))
        group["declare"].append(f"{d.get('field')}={d.get('value')}")
        if d.get("what") and d["what"] not in group["what"]:
            group["what"].append(d["what"])
    return [{**g, "declare": ", ".join(g["declare"]), "what": "; ".join(g["what"])} for g in by_sentence.values()]


def sources() -> list[Source]:
    """Every spec sentence a deviation can cite (for the citation self-test)."""
    return [source for _, _, _, source in RULES]


def of_resolved(resolved: Any) -> list[dict]:
    """The deviations of a resolved ``--impl`` (harness.calls.registry.Resolved) as plain dicts, for the
    verdict; none for an adapter that is unavailable here (its verdict is NOT RUN anyway)."""
    adapter = getattr(resolved, "adapter", None)
    declaration = getattr(adapter, "declaration", None)
    return [d.as_dict() for d in deviations(declaration)] if isinstance(declaration, Declaration) else []

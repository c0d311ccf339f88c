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

What the spec leaves open or a kernel merely lacks is not a deviation: capability limits (no
dropout, no GQA, fewer dtypes, a maximum head dim, Dk == Dv, no custom scale, no float mask, no
validation), the boolean mask's sense (000 §10 documents both), causal alignment when T != S (000 §9
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

from conformance.contract import Declaration
from conformance.harness.spec.clause import Source

ALL_BLOCKED_ZERO = Source("000", "§8 最小 PyTorch 实现", "本实现明确约定该行的权重和输出为 0，避免 NaN。")
FLOAT64_KEPT = Source("000", "§8 最小 PyTorch 实现", "float64 输入则保留 float64。")


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
        lambda d: d.all_blocked != "zeros",
        lambda d: f"a row whose keys a boolean mask blocks entirely gets {_FILL.get(d.all_blocked, d.all_blocked)}",
        ALL_BLOCKED_ZERO,
    ),
    (
        "mean_v_keys",
        lambda d: d.all_blocked == "mean-v" and d.mean_v_keys == "buffer",
        lambda d: "that mean is over every slot of the padded key buffer, past-the-end padding included",
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
)


def deviations(declaration: Declaration) -> list[Deviation]:
    """The declaration's departures from rules the spec states, in :data:`RULES` order (empty: none)."""
    return [
        Deviation(name, getattr(declaration, name), what(declaration), source)
        for name, deviates, what, source in RULES
        if deviates(declaration)
    ]


def sources() -> list[Source]:
    """Every spec sentence a deviation can cite (for the citation self-test)."""
    return [source for _, _, _, source in RULES]


def of_resolved(resolved: Any) -> list[dict]:
    """The deviations of a resolved ``--impl`` (harness.calls.registry.Resolved) as plain dicts, for the
    verdict; none for an adapter that is unavailable here (its verdict is NOT RUN anyway)."""
    adapter = getattr(resolved, "adapter", None)
    declaration = getattr(adapter, "declaration", None)
    return [d.as_dict() for d in deviations(declaration)] if isinstance(declaration, Declaration) else []

"""Fail fast: clause tests run cheapest and broadest first, slow and statistical ones last.

A broken kernel usually breaks the formula everywhere (a wrong scale, an inverted mask, a causal
triangle off by one), and a clause that checks the whole formula on a tiny case sees it in
milliseconds; so ``pytest -x --impl=X`` should meet such a clause first and stop, instead of
spending its first minute on long sequences, statistics over many dropout draws, or a
property-based clause that, once it fails, shrinks its example. The order is a fixed list of
clause ids (not timings, which vary by machine): :data:`FIRST` in the order given, then every
other clause in collection order, then :data:`LAST`. Within one clause the adapters and dtypes
keep their collection order. Items that are not clauses (the project's self-tests) keep their
places: clause items are reordered among the slots clause items occupied, so a mixed run still
meets module-scoped fixtures in the same places.

Registered as a sub-plugin by ``conformance.harness.plugin``. The order is a pure function of the
collected items, so every pytest-xdist worker computes the same one (xdist requires that).
"""

from __future__ import annotations

import pytest

from conformance.harness.spec.clause import info_of

# Each checks the whole formula, or one convention every kernel needs, on a case of a few elements.
FIRST: tuple[str, ...] = (
    "WORKED-EXAMPLE-01",
    "SHAPE-OUT-01",
    "DTYPE-OUT-03",
    "SOFTMAX-AXIS-01",
    "SCALE-DEFAULT-02",
    "MASK-SENSE-07",
    "MASK-BEFORE-SOFTMAX-01",
    "CAUSAL-TRIANGLE-01",
    "GQA-MAP-01",
    "SCALE-CUSTOM-03",
    "FLOAT-MASK-ADD-12",
    "MASK-EXACT-ZERO-10",
    "ALL-BLOCKED-02",
    "UPCAST-01",
    "CAUSAL-WITH-MASK-ARGS-05",
    "MASK-PADDING-SELF-14",
    "GRAD-VJP-01",
    "INPUTS-UNTOUCHED-01",
)
# Slow (long sequences, many examples, fixture sets, statistics) or narrow: after everything else.
LAST: tuple[str, ...] = (
    "COVER-PAIRS-01",  # ~70 small cases, every admitted pair of value classes (harness.covering.array)
    "COVER-PAIRS-GRAD-02",
    "ORACLE-AGREE-01",
    "GRAD-VJP-SPACE-04",
    "META-PERMUTE-01",
    "META-ROW-SHIFT-02",
    "META-LINEAR-V-03",
    "META-HULL-04",
    "META-INDEPENDENT-05",
    "GOLDEN-01",
    "SCALE-VAR-01",
    "DROPOUT-INDEPENDENT-06",
    "DROPOUT-RATE-02",
    "DROPOUT-MEAN-05",
    "MEM-SCALING-01",
    "LONG-SEQ-CI-03",
    "LONG-SEQ-01",
    "LONG-SEQ-02",
)
_RANK = {cid: i for i, cid in enumerate(FIRST)}
_RANK.update({cid: len(FIRST) + 1 + i for i, cid in enumerate(LAST)})
_MIDDLE = len(FIRST)


def rank(clause_id: str) -> int:
    """Sort key of a clause: its place in FIRST, then the middle, then its place in LAST."""
    return _RANK.get(clause_id, _MIDDLE)


def order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the clause items reordered by :func:`rank` (stable) in the slots they held."""
    slots = []
    clauses = []
    for i, item in enumerate(items):
        info = info_of(getattr(item, "function", None))
        if info is not None:
            slots.append(i)
            clauses.append((rank(info.id), len(clauses), item))
    out = list(items)
    for slot, (_, _, item) in zip(slots, sorted(clauses, key=lambda t: t[:2])):
        out[slot] = item
    return out


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = order(items)

"""Helpers that clauses of several modules share; no clause lives here.

A helper that belongs to one spec section stays in that section's clause module and the others
import it from there (the cotangents of test_gradients.py, the variant checks of test_variants.py,
the declared fill of all-blocked rows in test_masks.py); what belongs to no section is here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from conformance.contract import Case
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases import buckets


def supported(impl: GuardedAdapter, cases: Sequence[Case]) -> list[Case]:
    """The cases the kernel declares it supports, in order, each first brought within the declaration
    for what the clause does not test (``GuardedAdapter.admitted``); the clause is not applicable (for
    the first case's reasons) when there is none."""
    runnable = [c for c in map(impl.admitted, cases) if impl.supports(c)]
    if not runnable:
        impl.not_applicable("; ".join(impl.declaration.not_supported_reasons(cases[0])))
    return runnable


def cross_dims(impl: GuardedAdapter) -> dict[str, int]:
    """B = 2, Hq = 2, T = 4, S = 6, Dk = 8: a small T < S shape, the palette's (harness.cases.buckets),
    which a kernel compiling per shape gets in the ci profile and has built for other clauses already."""
    return buckets.dims(impl, "cross", B=2, Hq=2, T=4, S=6, Dk=8)


def key_padding(lengths: Sequence[int], S: int) -> np.ndarray:
    """The [B, 1, 1, S] key padding mask (True = blocked) of sequences of ``lengths`` keys out of S:
    the article's ``key_padding_mask[:, None, None, :]`` (000 §7.1)."""
    return (np.arange(S)[None, :] >= np.asarray(lengths)[:, None])[:, None, None, :]

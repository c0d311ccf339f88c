"""The ci profile's examples of every property-based clause are pinned to what the suite was validated on.

hypothesis derives a derandomized test's examples from the test's own source (its code and docstring;
comments and decorators do not count). So editing a property-based clause's body or docstring changes
the cases the ci profile checks, and with them what the self-tests proved: when the harness moved into
rooms, a rewritten docstring path and one changed expression gave ORACLE-AGREE-01 and
GRAD-VJP-SPACE-04 new examples, on which three library adapters failed GRAD-VJP-SPACE-04 outside their
expectations and the mutant head_dim_one_unit_scale escaped it. A refactoring must leave these digests
alone. An intended change updates this table after re-running tests/test_clauses_bite.py, the zoo and
the library certifications on the new examples.
"""

from __future__ import annotations

from hypothesis.internal.reflection import function_digest

from conformance.harness.spec.clause import load_all

# clause id -> the first 16 hex digits of hypothesis' digest of the clause function (its examples' seed)
DIGESTS = {
    "GRAD-VJP-SPACE-04": "e83cd154dd1d47fe",
    "META-HULL-04": "76b656b3d771c61b",
    "META-INDEPENDENT-05": "3f467f14139c8126",
    "META-LINEAR-V-03": "29a5564c8c0e0864",
    "META-PERMUTE-01": "6089eb5db3966c71",
    "META-ROW-SHIFT-02": "9654e03d383c6dde",
    "ORACLE-AGREE-01": "b720e5768a2b3cea",
}


def test_property_clauses_draw_the_examples_they_were_validated_on():
    got = {}
    for cid, info in load_all().items():
        wrapped = getattr(info.func, "hypothesis", None)
        if wrapped is not None:
            got[cid] = function_digest(wrapped.inner_test).hex()[:16]
    changed = {c: (DIGESTS.get(c), got.get(c)) for c in set(DIGESTS) | set(got) if DIGESTS.get(c) != got.get(c)}
    assert not changed, (
        "the ci examples of these property-based clauses changed (pinned, now): "
        + "; ".join(f"{c}: {a} -> {b}" for c, (a, b) in sorted(changed.items()))
        + ". A refactoring must keep a clause function's code and docstring as they were (comments may change)."
    )

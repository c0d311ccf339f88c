"""A folded mask is judged by the mask kind the kernel received.

A plain function gets a boolean mask and an additive M as one additive mask (-inf where the boolean
mask blocks), so a row emptied by their union reaches it as a row of -inf and takes the declared
``all_blocked_float_mask`` policy; an adapter that passes the two separately keeps the boolean one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conformance.contract import Case, Declaration

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")
CLAUSES = Path(__file__).resolve().parents[1] / "conformance" / "clauses"


def _case(mask: bool, bias: bool) -> Case:
    q = np.zeros((1, 1, 2, 4), np.float32)
    kv = np.zeros((1, 1, 3, 4), np.float32)
    return Case(
        q,
        kv,
        kv,
        mask=np.ones((1, 1, 2, 3), bool) if mask else None,
        bias=np.zeros((1, 1, 2, 3)) if bias else None,
    )


@pytest.mark.parametrize("combined", [False, True])
def test_policy_follows_the_mask_kind_received(combined):
    decl = Declaration(all_blocked="mean-v", all_blocked_float_mask="nan", float_mask=True, masks_combined=combined)
    assert decl.all_blocked_policy(_case(mask=True, bias=False)) == "mean-v"
    assert decl.all_blocked_policy(_case(mask=False, bias=True)) == "nan"
    assert decl.all_blocked_policy(_case(mask=True, bias=True)) == ("nan" if combined else "mean-v")


def test_sdpa_signature_functions_receive_one_combined_mask():
    from conformance.harness.calls import registry

    res = registry.resolve("tests.folded_kernels:bool_mean_v_float_nan")
    assert res.adapter.declaration.masks_combined


def _run(pytester, *extra: str):
    declares = [
        "all_blocked=mean-v",
        "all_blocked_float_mask=nan",
        "dropout=false",
        "causal_alignment=bottom-right",
        *extra,
    ]
    return pytester.runpytest_inprocess(
        str(CLAUSES / "test_combinations.py"),
        str(CLAUSES / "test_mask_kinds.py"),
        str(CLAUSES / "test_mask_values.py"),
        "--impl=tests.folded_kernels:bool_mean_v_float_nan",
        *[a for d in declares for a in ("--declare", d)],
        "--allow-partial",
        "-p",
        "no:cacheprovider",
        "-q",
    )


def test_a_function_whose_bool_and_float_policies_differ_passes_the_mask_clauses(pytester):
    """MLX-like: causal folded into the combined mask empties rows (T > S, bottom-right) as -inf."""
    result = _run(pytester)
    text = result.stdout.str()
    assert result.ret == 0, text[-4000:]
    assert "failed" not in text.split("sdpa-conformance summary")[-1], text[-4000:]


def test_judged_by_the_boolean_policy_it_would_fail(pytester):
    """Control: the same kernel judged as if it had received the boolean mask (the old rule)."""
    result = _run(pytester, "masks_combined=false")
    text = result.stdout.str()
    assert "failed: CAUSAL-WITH-MASK-ARGS-05" in text, text[-4000:]

"""The golden set: the kernel against frozen float64 answers, with forward, weights and gradients.

Every other clause recomputes its expectation with today's oracle. The golden fixtures
(fixtures/golden/, see docs/fixtures.md) hold the oracle's answers as they were on the recorded
spec revision, hash-checked before use, so this clause pins the same numbers on every machine and
release: a kernel is compared with stored values for the cases the seeds name (self/cross attention,
each mask shape, causal in the declared alignment, GQA, custom scale, all-blocked rows in the
declared policy, large logits, every dtype, the 003 worked example). Fixtures are selected by the
kernel's declaration: its conventions must be among those the fixture encodes, and
``Declaration.not_supported_reasons`` must be empty for the case.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from conformance import fixtures
from conformance.harness.calls.guarded import UndeclaredRefusal
from conformance.harness.calls.probes import observe_weights
from conformance.harness.judge import compare, tolerance
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation, fail, mismatch_report

CHECK_FIXED = Source(
    "003",
    "工程实现",
    "验证时应固定 B、h、T_q、T_k、d、dtype、is_causal，分别检查输出容差、反向梯度、峰值显存和延迟。",
)
ENV_DIR = "SDPA_GOLDEN_DIR"


def golden_dir() -> Path:
    """The set under test: ``$SDPA_GOLDEN_DIR`` if set, else the repository's fixtures/golden."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else fixtures.default_dir()


def _check_fixture(impl, fx: fixtures.GoldenFixture) -> list[tuple[str, str]]:
    """What this fixture observed wrong, as (guarded call, message) (empty: it matched); skips
    propagate to the caller."""
    case, decl = fx.case, impl.declaration
    dtype = decl.tolerance_dtype(case)
    found = []
    want = _under_formulation(fx, decl)
    out = impl.forward(case)
    try:
        compare.assert_close(out, want["out"], case=case, decl=decl)
    except ClauseViolation as exc:
        found.append(("forward", str(exc)))
    w = observe_weights(impl, case)
    allowed = compare.weights_allowance(case, decl)
    msg = mismatch_report(
        "weights (observed)", w, want["weights"], allowed, tolerance.describe(dtype, "observed weights")
    )
    if msg:
        found.append(("forward", msg))
    nan_rows = decl.all_blocked_policy(case) == "nan" and bool(np.isnan(want["out"]).any())
    if decl.grad and fx.params.get("grad", True) and not nan_rows:
        grads = impl.vjp(case, fx.grad_out)
        allowances = compare.grad_allowance(case, fx.grad_out, decl)
        for name, got, allowed in zip(("dq", "dk", "dv"), grads, allowances):
            exp = want[name]
            msg = mismatch_report(
                name, np.asarray(got, dtype=np.float64), exp, allowed, tolerance.describe(dtype, name)
            )
            if msg:
                found.append(("vjp", msg))
    return found


def _under_formulation(fx: fixtures.GoldenFixture, decl) -> dict:
    """The fixture's stored answers, or, where the kernel declares a formulation that changes the
    answer for its case (conformance.oracle_formulations), the oracle re-run under it: the stored
    float64 numbers are the spec's, and the formulation is the oracle with named roundings."""
    case = fx.case
    if not compare.formulated(case, decl):
        return fx.expected
    fwd = compare.expected(case, decl)
    want = {"out": fwd.out, "weights": fwd.weights}
    if decl.grad and fx.params.get("grad", True):
        want.update(zip(("dq", "dk", "dv"), compare.expected_vjp(case, fx.grad_out, decl)))
    return want


@clause(
    "GOLDEN-01",
    "on the hash-checked golden set, output, observed weights and (if declared) dQ/dK/dV match the stored float64 answers",
    CHECK_FIXED,
    kills=[
        "output_drift_1e-3@float32",
        "gqa_grad_first_head_only",
        "causal_off_by_one",
        "mask_sense_inverted",
        "gqa_wrong_mapping",
        "ignore_custom_scale",
        "nan_on_all_blocked",
        "mean_v_on_all_blocked",
        "causal_bottom_right_undeclared",
    ],
    tolerance="the error model (harness.judge.tolerance) of each fixture's case, against the stored expectation",
)
def test_golden(impl, dtype):
    try:
        golden = fixtures.load_set(golden_dir())
    except fixtures.FixtureError as exc:
        fail(
            "the golden set is not the one its manifest describes, so it cannot vouch for anything:\n  "
            + "\n  ".join(exc.problems)
        )
    decl = impl.declaration
    chosen = [
        fx
        for fx in golden
        if fx.case.dtype == dtype and fx.valid_for(decl.all_blocked_policy(fx.case), decl.causal_alignment)
    ]
    failures: list[tuple[str, str]] = []
    first = None  # the first disagreeing fixture's (case, call, kind): what the failure's cause is read from
    checked, refused, undeclared = 0, [], []
    for fx in chosen:
        reasons = decl.not_supported_reasons(fx.case)
        if reasons:
            refused.append(f"{fx.name} ({'; '.join(reasons)})")
            continue
        try:
            found = _check_fixture(impl, fx)
        except pytest.skip.Exception as exc:
            refused.append(f"{fx.name} ({str(exc).removeprefix('Skipped: ')})")
            continue
        except UndeclaredRefusal as exc:  # a refused fixture the declaration covers is not a checked one
            undeclared.append((fx.name, str(exc)))
            continue
        except ClauseViolation as exc:  # the kernel raised (AdapterError) or returned garbage
            found, kind = [("forward", str(exc))], type(exc)
        else:
            kind = ClauseViolation
        checked += 1
        failures += [(fx.name, m) for _, m in found]
        if found and first is None:
            first = (fx.case, found[0][0], kind)
    if undeclared:
        names = [n for n, _ in undeclared]
        raise UndeclaredRefusal(
            f"{len(names)} of {len(chosen)} golden fixtures in {dtype} were refused although the declaration covers "
            f"them (checked {checked}): {', '.join(names)}\n[{names[0]}] {undeclared[0][1]}"
            + (f"\nand {len(failures)} disagreement(s) on the fixtures checked" if failures else "")
        )
    if not checked:
        impl.not_applicable(
            f"no golden fixture in {dtype} applies (all_blocked={decl.all_blocked}, "
            f"causal_alignment={decl.causal_alignment}); refused: {', '.join(refused) or 'none'}"
        )
    if failures:
        names = sorted({n for n, _ in failures})
        detail = "\n".join(f"[{n}] {m}" for n, m in failures[:6])
        more = f"\n... and {len(failures) - 6} more" if len(failures) > 6 else ""
        case, call, kind = first
        raise kind(
            f"{len(names)} of {checked} golden fixtures checked in {dtype} disagree with their stored answers "
            f"({golden_dir()}): {', '.join(names)}\n{detail}{more}",
            case,
            call=call,
        )

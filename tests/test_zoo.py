"""Positive controls for the error model: every zoo kernel passes every clause.

The zoo (tests/zoo_kernels.py) is eight correct kernels written the way production kernels are:
P rounded or kept, exp(s - lse), exp2 with log2(e) in the scale, online softmax with odd tiles,
split-KV merged by log-sum-exps, float64 throughout, GQA by grouped queries, reversed and pairwise
sums. A clause that fails one of them has an allowance that refuses an honest formulation, which
is the failure the error model exists to prevent. Clauses the zoo's declarations rule out (dropout,
input validation, returned weights, batch invariance) are not applicable, and say so.

tests/zoo_more.py adds seventeen held-out kernels: formulations (FA2 tiles of 64 x 128 with its
backward, a finite -FLT_MAX running max with skipped tiles, FlashAttention-4's conditional
rescaling, the denominator from the rounded P, D from the fp32 output, FA2's split-KV combine,
Hugging Face's finfo.min mask, GQA by index arithmetic, float64 pairwise sums, fast-math ex2/rcp,
a split-KV forward and a backward with every rounding a kernel may make) and kernels that declare
a convention and follow it (causal bottom-right, NaN on empty rows, float64 computed in float32,
returned weights, FA2's dropout). Running all of them on every clause in every dtype costs ~17
kernels' worth of clause time, so the default (ci) run deals each (clause, dtype) pair to one of
them, round robin over the kernels the clause applies to: every pair is run once, on some
held-out kernel, for about one kernel's cost. ``--conformance-profile=thorough`` runs every one of
them on every pair (and the random-seed runs in docs/tolerance.md ran each in full).

tests/zoo_more2.py adds round two (Kahan sums, uneven and empty splits, PackGQA, a two-pass softmax
with e stored, xformers' cutlass tiles with a base-2 lse, split-K decode over 16 parts, causal
bottom-right with skipped tiles, FlashDecoding++'s unified max, dK/dV accumulated in the input dtype
per 32 query rows as torch's CPU backward does), dealt with zoo_more's as one pool;
its refused formulations are checked to be refused where their docstrings say (NOT_ADMITTED2), and
the open ones (OPEN: correct, refused today) are strict expected failures.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import oracle
from conformance.contract import DTYPES
from conformance.harness.cases.build import random_case
from conformance.harness.run import runstate
from tests.clause_runner import LONG_SEQUENCE, NOT_IN_CI, PERF, dtypes_for, load_clauses, run_clause
from tests.zoo_kernels import ZOO
from tests.zoo_more import MORE
from tests.zoo_more2 import MORE2, NOT_ADMITTED2, OPEN

CLAUSES = load_clauses()
# The held-out kernels, dealt together: zoo_more's seventeen and zoo_more2's round two.
HELD_OUT = {**MORE, **MORE2}


# The clause modules a ci-profile certification leaves out (clause_runner.NOT_IN_CI): clause_runner
# calls the clause itself, past that gate. The performance clauses measure memory and which backend
# ran, not the numbers the zoo controls for, and a zoo kernel's Python tile loop at S = 2048 cost 11 s
# of the default run: in the default run they run on the correct bases of test_clauses_bite only.
#
# Running the eight zoo kernels on every (clause, dtype) pair cost 136 s of the default run's 20 min
# of test time. The default run deals each pair to one of them, round robin (the held-out kernels
# below are dealt the same way), so every pair runs on two correct formulations, a zoo kernel and a
# held-out one, and every zoo kernel on an eighth of the pairs; the rest is test_zoo_kernels_pass_rest,
# in the thorough tier (`pytest tests -m thorough`, which .ci/run runs), so CI runs every zoo kernel on
# every pair.
ZOO_PER_PAIR = 1


def _zoo_pairs(clause_id: str, *, rest: bool) -> list[tuple[str, str | None]]:
    """(zoo kernel, dtype) pairs of ``clause_id``: the default run's deal, or (``rest``) the others."""
    info = CLAUSES[clause_id]
    names = sorted(ZOO)
    start = sorted(CLAUSES).index(clause_id)
    per = 0 if info.func.__module__ == PERF else 1 if info.func.__module__ == LONG_SEQUENCE else ZOO_PER_PAIR
    pairs = []
    for i, d in enumerate(dtypes_for(info)):
        dealt = {names[(start + i + j * (len(names) // max(per, 1))) % len(names)] for j in range(per)}
        pairs += [(k, d) for k in names if (k in dealt) != rest]
    return pairs


def _run_zoo(clause_id: str, pairs: list[tuple[str, str | None]]) -> None:
    info = CLAUSES[clause_id]
    for kernel, d in pairs:
        verdict = run_clause(info, ZOO[kernel](), d)
        assert not verdict.startswith("failed"), f"{clause_id} [{d}] refuses the correct kernel {kernel}: {verdict}"
        if verdict.startswith("skipped"):
            assert "not applicable" in verdict or "declares" in verdict, f"{clause_id} [{d}] {kernel}: {verdict}"


@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
def test_zoo_kernels_pass(clause_id):
    pairs = _zoo_pairs(clause_id, rest=False)
    if not pairs:
        pytest.skip(f"{clause_id} runs on the zoo kernels in the thorough tier (`pytest tests -m thorough`)")
    _run_zoo(clause_id, pairs)


@pytest.mark.thorough
@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
def test_zoo_kernels_pass_rest(clause_id):
    """Every zoo kernel on every pair the default run's deal gave to others."""
    _run_zoo(clause_id, _zoo_pairs(clause_id, rest=True))


def test_the_deal_runs_every_pair_once_and_every_kernel():
    """Default deal plus rest is every (kernel, clause, dtype) once; the deal gives each clause outside
    the performance file to ZOO_PER_PAIR kernels per dtype, and each kernel a fair share."""
    share = dict.fromkeys(ZOO, 0)
    for clause_id, info in CLAUSES.items():
        dealt, rest = _zoo_pairs(clause_id, rest=False), _zoo_pairs(clause_id, rest=True)
        assert not set(dealt) & set(rest) and len(dealt) + len(rest) == len(ZOO) * len(dtypes_for(info)), clause_id
        if info.func.__module__ != PERF:
            assert len(dealt) == ZOO_PER_PAIR * len(dtypes_for(info)), clause_id
        for kernel, _ in dealt:
            share[kernel] += 1
    total = sum(share.values())
    assert all(n >= total / len(ZOO) / 2 for n in share.values()), share


def _thorough(request: pytest.FixtureRequest) -> bool:
    return runstate.getoption(request.config, runstate.OPT_PROFILE) == "thorough"


def _dealt(clause_id: str, thorough: bool) -> list[tuple[str, str | None]]:
    """(held-out kernel, dtype) pairs to run ``clause_id`` on: all of them (thorough), or each dtype
    once, dealt round robin over the kernels the clause applies to (ci)."""
    info = CLAUSES[clause_id]
    if not thorough and info.func.__module__ in NOT_IN_CI:
        return []
    start = sorted(CLAUSES).index(clause_id)
    pairs = []
    for i, d in enumerate(dtypes_for(info)):
        fits = [name for name in sorted(HELD_OUT) if not info.not_applicable_reasons(HELD_OUT[name]().declaration, d)]
        if thorough:
            pairs += [(name, d) for name in fits]
        elif fits:
            pairs.append((fits[(start + i) % len(fits)], d))
    return pairs


@pytest.mark.parametrize("clause_id", sorted(CLAUSES))
def test_held_out_zoo_kernels_pass(request, clause_id):
    thorough = _thorough(request)
    pairs = _dealt(clause_id, thorough)
    if not pairs and not thorough and CLAUSES[clause_id].func.__module__ in NOT_IN_CI:
        pytest.skip(f"not in profile: {clause_id} runs on the held-out zoo kernels with --conformance-profile=thorough")
    if not pairs:
        pytest.skip(f"{clause_id} applies to none of the held-out zoo kernels' declarations")
    for kernel, d in pairs:
        verdict = run_clause(CLAUSES[clause_id], HELD_OUT[kernel](), d)
        assert not verdict.startswith("failed"), f"{clause_id} [{d}] refuses the correct kernel {kernel}: {verdict}"


def test_zoo_is_large_enough_and_has_backward_kernels():
    assert len(ZOO) >= 8 and len(MORE) >= 8 and len(MORE2) >= 8
    assert len({**ZOO, **HELD_OUT}) == len(ZOO) + len(MORE) + len(MORE2), "a kernel name is used twice"
    with_grad = [name for name, cls in {**ZOO, **HELD_OUT}.items() if cls().declaration.grad]
    assert len(with_grad) >= 7, with_grad


def test_dealing_covers_every_applicable_pair_once():
    """In the ci profile each (clause, dtype) pair some held-out kernel admits runs exactly once."""
    for clause_id, info in CLAUSES.items():
        if info.func.__module__ in NOT_IN_CI:
            continue
        dealt = _dealt(clause_id, thorough=False)
        admitted = [
            d
            for d in dtypes_for(info)
            if any(not info.not_applicable_reasons(cls().declaration, d) for cls in HELD_OUT.values())
        ]
        assert [d for _, d in dealt] == admitted, clause_id


@pytest.mark.parametrize("kernel", sorted({**ZOO, **HELD_OUT}))
@pytest.mark.parametrize("dtype", DTYPES)
def test_zoo_kernel_is_honest_not_exact(kernel, dtype):
    """Each zoo kernel lands near the oracle, and (below float64) not bitwise on it: a control that
    matched the oracle exactly would say nothing about the allowance."""
    case = random_case(5, B=2, Hq=4, Hkv=2, T=9, S=23, Dk=16, Dv=8, dtype=dtype, is_causal=True)
    adapter = {**ZOO, **HELD_OUT}[kernel]()
    decl = adapter.declaration
    got = np.asarray(adapter.forward(case), dtype=np.float64)
    want = oracle.forward(case, all_blocked=decl.all_blocked, causal_alignment=decl.causal_alignment).out
    err = float(np.max(np.abs(got - want)))
    scale = {"float64": 1e-13, "float32": 1e-5, "float16": 1e-2, "bfloat16": 6e-2}[decl.tolerance_dtype(case)]
    assert err < scale, f"{kernel} [{dtype}] is {err:.3g} from the oracle"
    if dtype in ("float16", "bfloat16"):
        assert err > 0


# (kernel, clause, dtype): where each refused formulation is refused (docstrings in tests/zoo_more2.py).
REFUSED = {
    "zoo-tf32-qk": ("GOLDEN-01", "float32"),  # Q, K rounded to 10 mantissa bits: not float32 scores
    "zoo-bwd-lse-lowp": ("GRAD-VJP-01", "bfloat16"),  # P recomputed from an lse rounded to bfloat16
}
OPEN_REFUSALS = {
    "zoo-fa3-exp2-raw-max": ("MASK-EXACT-ZERO-10", "float16"),  # exp2(fma) overflows float16's P at |s| ~ 2e9
    "zoo-ring-sigmoid-merge": ("GOLDEN-01", "float32"),  # tiny weights lose relative accuracy in the merge
}


@pytest.mark.parametrize("kernel", sorted(NOT_ADMITTED2))
def test_not_admitted_formulations_are_refused(kernel):
    """The refusals docs/tolerance.md states are real: each kernel fails where its docstring says."""
    clause_id, dtype = REFUSED[kernel]
    verdict = run_clause(CLAUSES[clause_id], NOT_ADMITTED2[kernel](), dtype, shrink=False)
    assert verdict.startswith("failed"), f"{kernel} is no longer refused by {clause_id} [{dtype}]: {verdict}"


@pytest.mark.parametrize("kernel", sorted(OPEN))
def test_open_formulations(kernel):
    """Correct production formulations the suite refuses today (docs/tolerance.md, "Open"): an expected
    failure, strict, so that a change that admits one is noticed and the kernel moves into MORE2."""
    clause_id, dtype = OPEN_REFUSALS[kernel]
    verdict = run_clause(CLAUSES[clause_id], OPEN[kernel](), dtype, shrink=False)
    if verdict.startswith("failed"):
        pytest.xfail(f"open: {clause_id} [{dtype}] refuses {kernel}")
    pytest.fail(f"{kernel} now passes {clause_id} [{dtype}]: move it from OPEN into MORE2 ({verdict})")

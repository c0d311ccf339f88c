"""Every admitted pair of configuration values reaches the kernel: covering arrays over the case space.

Faults that need two ordinary features to meet (a GQA ratio and a [1,H,T,S] mask, a transposed view
and an additive M, Dv != Dk and causal) pass clauses that test each feature alone, and a drawn space
gives no guarantee about pairs. The value-class table (``harness.cases.pairs_space``, docs/case-space.md)
names the classes; ``harness.cases.covering`` builds, from the declaration alone, a covering array in which
every admitted pair of classes (ci profile; every triple in thorough) is one row; each row is one small
case (``harness.cases.pairs_cases``) compared with the float64 oracle under the error model, forward
(COVER-PAIRS-01) and, where the kernel declares a backward, dQ/dK/dV (COVER-PAIRS-GRAD-02). The
direction is itself a parameter, so the two clauses split the rows between them.

All rows run even after one fails (so coverage is counted for every row the kernel took); the first
failing row is then shrunk: each parameter in turn is reset to its default class, and the reset is kept
while the row still fails, so the report names the fewest non-default classes that still fail.
"""

from __future__ import annotations

from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases import covering
from conformance.harness.cases.pairs_cases import build, row_reasons
from conformance.harness.cases.pairs_space import PARAMETERS
from conformance.harness.judge import compare
from conformance.harness.run import pair_coverage
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation

FORMULA = Source(
    "000",
    "§3 矩阵形式",
    "\\operatorname{Attention}(Q,K,V) = \\operatorname{softmax}\\left(\\frac{QK^T}{\\sqrt{d_k}}+M\\right)V",
)
ENGINEERING = Source(
    "003", "工程实现", "验证时应固定 B、h、T_q、T_k、d、dtype、is_causal，分别检查输出容差、反向梯度、峰值显存和延迟。"
)
SEED = 7300
PAIR_MUTANTS = [
    "pairs_gqa_mask_by_kv_head",
    "pairs_batch_eq_heads_mask_axis",
    "pairs_transposed_bias_layout",
    "pairs_dv_causal_uses_dk",
    "pairs_decode_gqa8_packed",
    "pairs_bf16_long_split",
    "pairs_odd_t_padding_mask",
    "pairs_nonpositive_scale_causal",
    "pairs_zero_scale_mask",
    "pairs_large_negative_bias_fp32",
    "pairs_strided_many_heads",
    "pairs_expanded_bias_strides",
    "pairs_skipped_tile_dk_not8",
    "pairs_one_key_padded_head_dim",
    "pairs_empty_row_several_tiles",
    "pairs_many_batches_big_head_dim",
    "pairs_tall_padding_ignored",
]
GRAD_MUTANTS = [
    "pairs_grad_custom_scale",
    "pairs_grad_dv_gt_dk",
    "pairs_grad_bias_dropped",
]


def _t() -> int:
    return max(pair_coverage.strengths())


def _rows(impl: GuardedAdapter, direction: str) -> list[tuple[int, dict[str, str]]]:
    """The rows a clause runs: every row forward (a backward row's output is checked too: "分别检查输出容差、
    反向梯度"), the backward rows backward."""
    rows = covering.plan(impl.declaration, _t()).rows
    return [(i, r) for i, r in enumerate(rows) if direction == "forward" or r["direction"] == direction]


def _run(impl: GuardedAdapter, row: dict[str, str], seed: int, direction: str) -> None:
    """One row as one case through the error model; records the classes that reached the kernel."""
    case, grad_out = build(row, impl.declaration, seed)
    impl.require(case)  # never rejects: the plan holds only rows the declaration admits
    before = impl.cases_run
    try:
        if direction == "forward":
            compare.assert_output_matches(impl, case)
        else:
            compare.assert_vjp_matches(impl, case, grad_out)
    finally:
        if impl.cases_run > before:  # the guarded call returned: the case reached the kernel
            pair_coverage.record(impl, case, direction, {**row, "direction": direction})


def _fails(impl: GuardedAdapter, row: dict[str, str], seed: int, direction: str) -> ClauseViolation | None:
    try:
        _run(impl, row, seed, direction)
    except ClauseViolation as exc:
        return exc
    return None


def _shrink(impl: GuardedAdapter, row: dict[str, str], seed: int, exc: ClauseViolation, direction: str):
    """Reset one parameter at a time to its default class; keep each reset under which the row still fails."""
    plan = covering.plan(impl.declaration, _t())
    changed = True
    while changed:
        changed = False
        for p in PARAMETERS:
            default = plan.defaults[p.name]
            if row[p.name] == default or p.name == "direction":
                continue
            cand = {**row, p.name: default}
            if row_reasons(impl.declaration, cand, _t(), plan.defaults):
                continue
            again = _fails(impl, cand, seed, direction)
            if again is not None:
                row, exc, changed = cand, again, True
    return row, exc


def _check_rows(impl: GuardedAdapter, direction: str) -> None:
    rows = _rows(impl, direction)
    if not rows:
        impl.not_applicable(f"the covering array has no {direction} row for this declaration")
    failed = []
    for i, row in rows:
        exc = _fails(impl, row, SEED + i, direction)
        if exc is not None:
            failed.append((i, row, exc))
    if not failed:
        return
    i, row, exc = failed[0]
    shrunk, last = _shrink(impl, row, SEED + i, exc, direction)
    defaults = covering.plan(impl.declaration, _t()).defaults

    def show(r: dict[str, str]) -> str:
        return (
            "; ".join(f"{p.name}: {r[p.name]}" for p in PARAMETERS if r[p.name] != defaults[p.name]) or "all defaults"
        )

    detail = str(last)
    if last.case is not None:  # the case line is added back by the violation raised below
        detail = detail.removesuffix(f"\n  case: {last.case.describe()}")
    kind = type(last)  # a guard's finding (AdapterError, UndeclaredRefusal) stays one
    raise kind(
        f"{len(failed)} of {len(rows)} {direction} rows of the {_t()}-way covering array fail "
        f"(rows {', '.join(str(j) for j, _, _ in failed[:12])}{' ...' if len(failed) > 12 else ''}); row {i} "
        f"shrunk to the fewest non-default value classes that still fail:\n  {show(shrunk)}\n"
        f"  (the row as planned: {show(row)}; every other class at its default: "
        f"{'; '.join(f'{k}: {v}' for k, v in defaults.items())})\n"
        f"  {detail}",
        last.case,
    )


@clause(
    "COVER-PAIRS-01",
    "every admitted pair of value classes (B, heads and GQA ratio, T, S, Dk, Dv, mask form and content, additive M, "
    "causal, scale, memory layout, dtype) meets in some case whose output agrees with the float64 oracle "
    "(t = 2 in the ci profile, t = 3 in thorough)",
    FORMULA,
    kills=PAIR_MUTANTS,
)
def test_covering_forward(impl):
    _check_rows(impl, "forward")


@clause(
    "COVER-PAIRS-GRAD-02",
    "every admitted pair of value classes meets the backward in some case whose dQ, dK, dV agree with the oracle's VJP",
    ENGINEERING,
    requires=["grad"],
    kills=GRAD_MUTANTS,
)
def test_covering_backward(impl):
    _check_rows(impl, "backward")

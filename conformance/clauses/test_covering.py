"""Every admitted pair of configuration values reaches the kernel where it can show a bug: covering arrays.

Faults that need two ordinary features to meet (a GQA ratio and a [1,H,T,S] mask, a transposed view
and an additive M, Dv != Dk and causal) pass clauses that test each feature alone, and a drawn space
gives no guarantee about pairs. The value-class table (``harness.covering.table``, docs/case-space.md)
names the classes; ``harness.covering.array`` builds, from the declaration alone, a covering array in which
every admitted pair of classes (ci profile; every triple in thorough) is one row in which no third value
hides it (``harness.covering.hiding``: S = 1 makes dQ and dK zero whatever Dk is); each row is one
small case whose classes take values across their ranges (``harness.covering.ranges``), compared with
the float64 oracle under the error model, forward (COVER-PAIRS-01) and, where the kernel declares a
backward, dQ/dK/dV (COVER-PAIRS-GRAD-02). A row with dropout is judged through the mask its seed
replays (``harness.judge.dropout_replay``). A row "called again" runs right after its twin, a case of
the same Q, K, V shapes whose other values differ (``admission.twin``), so a kernel that caches
per shape answers one of the two with the other's; both are judged.

All rows run even after one fails (so coverage is counted for every row the kernel took). A row the
kernel raised on or refused never reached it, and neither did the other pairs it carried: each of
those that no case showed runs again in a row of its own; a pair whose value the kernel fails even
alone is *blocked* by it, named so in the coverage summary. The first failing row is then shrunk: each parameter in turn is reset to its default class, and the reset is kept
while the row still fails, so the report names the fewest non-default classes that still fail.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from conformance.contract import Case, ContextRefused
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.covering import array as covering
from conformance.harness.covering.admission import row_reasons
from conformance.harness.covering.admission import twin as twin_of
from conformance.harness.covering.build import build_planned, build_twin
from conformance.harness.covering.table import PARAMETERS, Call, memory_form
from conformance.harness.covering.tuples import name, observable_in, tuples_of
from conformance.harness.judge import compare, dropout_replay, rejection, switches, transformed
from conformance.harness.records.coverage_tables import hidden_of
from conformance.harness.run import pair_coverage
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import AdapterError, ClauseViolation

FORMULA = Source(
    "000",
    "§3 矩阵形式",
    "\\operatorname{Attention}(Q,K,V) = \\operatorname{softmax}\\left(\\frac{QK^T}{\\sqrt{d_k}}+M\\right)V",
)
ENGINEERING = Source(
    "003", "工程实现", "验证时应固定 B、h、T_q、T_k、d、dtype、is_causal，分别检查输出容差、反向梯度、峰值显存和延迟。"
)
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
    "escape_bias_threshold_1e6",  # a threshold inside the class "finite large negative"
    "escape_dropout_gqa_value_head",  # dropout x GQA, judged on its own values
    "escape_cache_causal_large_head_dim",  # a per-shape cache, forward (a row called again after its twin)
    "escape_mask_3d_as_batch",  # a [H,T,S] mask
    # a caller's switch, a scalar's Python type, one argument's own memory, each meeting a value class
    "meets_deterministic_large_head_dim",
    "meets_another_thread_causal",
    "meets_numpy_scale_grouped_heads",
    "meets_offset_value_causal",
    # a transform meeting a value class
    "meets_jvp_large_head_dim",
    "meets_vmap_grouped_heads",
]
GRAD_MUTANTS = [
    "pairs_grad_custom_scale",
    "pairs_grad_dv_gt_dk",
    "pairs_grad_bias_dropped",
    "escape_grad_dq_head_dim_over_192",  # Dk = 256 x backward where no S = 1 hides it
    "escape_cache_grad_scale_large_head_dim",  # a per-shape cache, backward
]


# True: stop at the first failing row, unshrunk. Only the suite's self-tests set it, for kernels written
# to be wrong, which only have to fail (tests/clause_runner.py); a certification runs every row.
FIRST_FAILING_ROW = False


def _t() -> int:
    return max(pair_coverage.strengths())


def _rows(impl: GuardedAdapter, direction: str) -> list[int]:
    """The rows a clause runs: every row forward (a backward row's output is checked too: "分别检查输出容差、
    反向梯度"), the backward rows backward."""
    rows = covering.plan(impl.declaration, _t()).rows
    return [i for i, r in enumerate(rows) if direction == "forward" or r["direction"] == direction]


def _judge(impl: GuardedAdapter, case: Case, grad_out: np.ndarray | None, direction: str, second: tuple | None) -> Case:
    """The row's case through the error model; under a caller's switch (the row names its kinds), with a member of
    each the adapter applies, at the precision the switch allows (harness.judge.switches). A call the framework
    refuses under every member tried is recorded as the clause's refusal (never a failure): the row's pairs are
    then not reached, and the coverage summary says so. A transform the kernel refuses (a measured capability, on
    the run's transforms line) is recorded so too, and the case runs without it, so that the row's other pairs
    still reach the kernel. Returns the case that ran."""
    pres = case.presentation
    if pres is not None and pres.transform is not None:
        try:
            return _judge_switched(impl, case, grad_out, direction, second)
        except pytest.skip.Exception as exc:  # the transform refused, or not asked by the adapter
            impl.rejected.append(f"{case.label}: run without {pres.describe()}: {exc.msg}")
            case = case.replace(presentation=dataclasses.replace(pres, transform=None))
    return _judge_switched(impl, case, grad_out, direction, second)


def _judge_switched(
    impl: GuardedAdapter, case: Case, grad_out: np.ndarray | None, direction: str, second: tuple | None
) -> Case:
    pres = case.presentation
    if pres is None or (pres.context is None and pres.scalars is None):
        _judge_one(impl, case, grad_out, direction, second)
        return case
    refused = []
    for applied in switches.members(impl, case, case.seed or 0):
        try:
            _judge_one(impl, applied, grad_out, direction, second)
            return case
        except ContextRefused as exc:
            refused.append(str(exc))
        except AdapterError as exc:
            if (
                pres.scalars is None
                or exc.__cause__ is None
                or not rejection.documented(exc.__cause__, impl.declaration)
            ):
                raise
            return _scalars_refused(impl, applied, exc, grad_out, direction, second)
    impl.rejected.append(
        f"{case.label}: not applicable under {pres.describe()}: {refused[0] if refused else 'no member offered'}"
    )
    return case


def _scalars_refused(
    impl: GuardedAdapter, case: Case, exc: AdapterError, grad_out: np.ndarray | None, direction: str, second
) -> Case:
    """A scalar's Python type refused in a declared error class is the row's refusal only where the kernel takes
    the same call with the plain float and bool: the same case with plain scalars runs next, and its failure is
    the row's (an error the kernel raises whatever the type is no refusal of the type); it passing, the refusal
    is recorded and the plain case is what reached the kernel. Returns the plain case."""
    plain = case.replace(presentation=dataclasses.replace(case.presentation, scalars=None))
    _judge_switched(impl, plain, grad_out, direction, second)
    impl.rejected.append(f"{case.label}: not applicable under {case.presentation.describe()}: {exc.__cause__}")
    return plain


def _judge_one(
    impl: GuardedAdapter, case: Case, grad_out: np.ndarray | None, direction: str, second: tuple | None
) -> None:
    dropout = case.dropout_p > 0
    switched = case.presentation is not None and case.presentation.context is not None
    transform = case.presentation.transform if case.presentation is not None else None
    if transform == "jvp":  # the table admits a transform only forward, without dropout or a switch
        transformed.assert_jvp_matches(impl, case, (case.seed or 0) + 4301)
    elif transform == "vmap":  # the second item: Q, K, V (and cotangent) of the row built again under another seed
        other, other_grad = second if second is not None else (case, grad_out)
        item = case.replace(query=other.query, key=other.key, value=other.value)
        if direction == "forward":
            transformed.assert_vmap_matches(impl, case, item)
        else:
            transformed.assert_vmap_vjp_matches(impl, case, item, grad_out, other_grad)
    elif dropout:  # through the replayed mask, at each precision the caller's switch allows
        readings = switches.readings(impl.declaration, case.presentation.context, case, grad_out) if switched else None
        if direction == "forward":
            dropout_replay.assert_output_matches(impl, case, readings)
        else:
            dropout_replay.assert_vjp_matches(impl, case, grad_out, readings)
    elif switched:
        switches.assert_matches(impl, case, None if direction == "forward" else grad_out)
    elif direction == "forward":
        compare.assert_output_matches(impl, case)
    else:
        compare.assert_vjp_matches(impl, case, grad_out)


def _run(impl: GuardedAdapter, i: int, row: dict[str, str], direction: str) -> None:
    """Row ``i`` (as planned, or a shrunk ``row``) as one case through the error model, after its twin
    when it is called again; records the classes that reached the kernel."""
    plan = covering.plan(impl.declaration, _t())
    _run_row(impl, row, plan.seeds[i], plan.picks[i], direction)


def _run_row(impl: GuardedAdapter, row: dict[str, str], seed: int, picks: dict | None, direction: str) -> None:
    """The row's case through the error model, after its twin when it is called again. A twin that
    fails is reported, but where the kernel returned its answer the row still runs after it: a row that
    passes then shows its pairs (a twin met by a known cause must not hide them); one that fails too
    credits nothing."""
    if row["call"] == "again" and twin_of(impl.declaration, row, _t()) is not None:
        twin, twin_grad = build_twin(row, impl.declaration, seed, picks, _t())
        impl.require(twin)
        before = impl.cases_run
        try:
            _judge(impl, twin, twin_grad, direction, None)
        except ClauseViolation as exc:
            text = str(exc).removesuffix(f"\n  case: {exc.case.describe()}") if exc.case is not None else str(exc)
            msg = f"the twin called right before this row (same Q, K, V shapes, other values) fails:\n  {text}"
            again = type(exc)(msg, exc.case)
            defaults = covering.plan(impl.declaration, _t()).defaults
            again.twin = {**twin_of(impl.declaration, row, _t(), defaults), "direction": direction}
            if impl.cases_run > before:  # the twin's call returned: the row is still called after it
                n = len(_records(impl))
                try:
                    _run_case(impl, row, seed, picks, direction)
                except ClauseViolation:  # the twin's failure is the one reported: credit nothing here
                    del _records(impl)[n:]
            raise again from None
    _run_case(impl, row, seed, picks, direction)


def _run_case(impl: GuardedAdapter, row: dict[str, str], seed: int, picks: dict | None, direction: str) -> None:
    case, grad_out = build_planned(row, impl.declaration, seed, picks, _t())
    impl.require(case)  # never rejects: the plan holds only rows the declaration admits
    second = None
    if case.presentation is not None and case.presentation.transform == "vmap":  # vmap's second item: same form
        second = build_planned(row, impl.declaration, seed + 1, picks, _t())
    before = impl.cases_run
    ran = case
    try:
        ran = _judge(impl, case, grad_out, direction, second)
    finally:
        if impl.cases_run > before:  # the guarded call returned: the case reached the kernel
            how = Call(direction, row["call"], "contiguous" if grad_out is None else memory_form(grad_out))
            pair_coverage.record(impl, ran, how, {**row, "direction": direction})


def _fails(impl: GuardedAdapter, i: int, row: dict[str, str], direction: str) -> ClauseViolation | None:
    try:
        _run(impl, i, row, direction)
    except ClauseViolation as exc:
        return exc
    return None


def _records(impl: GuardedAdapter) -> list[dict]:
    return getattr(impl, pair_coverage.ATTR, None) or []


def _recover(impl: GuardedAdapter, lost: list[dict[str, str]], direction: str) -> list:
    """A row the kernel raised on hides every other pair it carried: a 1-D mask torch cannot take also
    carried Dk = 128 x a zero scale, which no other row holds where it shows. Each pair of such a row
    that no case of this clause showed runs again in a row of its own, every other value at its default
    where the declaration admits that (``admission.complete`` otherwise). Where that row too never
    reaches the kernel, each of the pair's two values runs alone; a value the kernel fails alone
    *blocks* the pair, and where each value alone reaches it the pair blocks itself (recorded, and named
    by the coverage summary: nothing else can show there on this kernel). Returns the failures of the rows run here, numbered after the plan's."""
    plan = covering.plan(impl.declaration, _t())
    decl, defaults = impl.declaration, plan.defaults
    shown = {label for r in _records(impl) if "values" in r for label in observable_in(r["values"], hidden_of(r), 2)}
    failed: list = []
    numbers = itertools.count(len(plan.rows))
    took_alone: dict[tuple[str, str], bool | None] = {}

    def attempt(tup: tuple, avoid: frozenset) -> bool | None:
        """Whether a row showing ``tup`` reached the kernel (None: no admitted row shows it)."""
        i = next(numbers)
        found = covering.row_showing(decl, tup, _t(), defaults, i, avoid - set(tup))
        if found is None:
            return None
        row, picks, seed = found
        row = {**row, "direction": direction}
        if decl.not_supported_reasons(build_planned(row, decl, seed, picks, _t())[0]):
            return None  # admitted rows are supported; a repair row must never skip the clause
        before = len(_records(impl))
        try:
            _run_row(impl, row, seed, picks, direction)
        except ClauseViolation as exc:
            failed.append((i, row, exc))
        return len(_records(impl)) > before

    for row in lost:
        # the row's other values: one of them may be what the kernel raised on
        avoid = frozenset((p, v) for p, v in row.items() if v != defaults[p] and p != "direction")
        for tup in tuples_of(row, 2):
            label = name(tup)
            if label in shown:
                continue
            shown.add(label)  # tried once
            if attempt(tup, avoid) is not False:
                continue
            for p, v in tup:
                if (p, v) not in took_alone and v != defaults[p]:
                    took_alone[(p, v)] = attempt(((p, v),), avoid)
            by = [f"{p}: {v}" for p, v in tup if took_alone.get((p, v)) is False]
            # each value taken alone: the pair itself is what the kernel fails (float32 x a negative scale)
            pair_coverage.record_blocked(impl, label, by[0] if by else label)
    return failed


def _shrink(impl: GuardedAdapter, i: int, row: dict[str, str], exc: ClauseViolation, direction: str):
    """Reset one parameter at a time to its default class; keep each reset under which the row still fails."""
    plan = covering.plan(impl.declaration, _t())
    changed = True
    while changed:
        changed = False
        for p in PARAMETERS:
            default = plan.defaults[p.name]
            if row[p.name] == default or p.name in ("direction", "call"):
                continue  # "call" stays: a kernel's state makes a reset of it read as still failing
            cand = {**row, p.name: default}
            if row_reasons(impl.declaration, cand, _t(), plan.defaults):
                continue
            again = _fails(impl, i, cand, direction)
            if again is not None:
                row, exc, changed = cand, again, True
    return row, exc


def _check_rows(impl: GuardedAdapter, direction: str) -> None:
    rows = _rows(impl, direction)
    if not rows:
        impl.not_applicable(f"the covering array has no {direction} row for this declaration")
    plan = covering.plan(impl.declaration, _t())
    failed = []
    lost = []  # rows the kernel raised on or refused: their pairs never reached it
    for i in rows:
        before = len(_records(impl))
        exc = _fails(impl, i, plan.rows[i], direction)
        if exc is not None:
            failed.append((i, plan.rows[i], exc))
            if len(_records(impl)) == before:
                lost.append({**plan.rows[i], "direction": direction})
            if FIRST_FAILING_ROW:
                break
    if lost and not FIRST_FAILING_ROW:
        failed += _recover(impl, lost, direction)
    if not failed:
        return
    i, row, exc = failed[0]
    twin = getattr(exc, "twin", None)
    if twin is not None:  # the twin failed: shrink it as a row of its own, where it fails alone
        row = twin
        alone = _fails(impl, i, row, direction)
        exc = alone or exc
    shrinks = not FIRST_FAILING_ROW and (twin is None or alone is not None)
    shrunk, last = _shrink(impl, i, row, exc, direction) if shrinks else (row, exc)
    defaults = plan.defaults

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
    "causal, scale, dropout, memory layout, dtype, called again after a twin of the same shapes) meets in some case "
    "in which no third value hides it, with each class across its range, and the output agrees with the float64 "
    "oracle (through the replayed mask under dropout; t = 2 in the ci profile, t = 3 in thorough)",
    FORMULA,
    kills=PAIR_MUTANTS,
)
def test_covering_forward(impl):
    _check_rows(impl, "forward")


@clause(
    "COVER-PAIRS-GRAD-02",
    "every admitted pair of value classes meets the backward in some case in which no third value hides it (not S = 1, "
    "scale 0, or rows that see one key: dQ and dK are zero there), and its dQ, dK, dV agree with the oracle's VJP",
    ENGINEERING,
    requires=["grad"],
    kills=GRAD_MUTANTS,
)
def test_covering_backward(impl):
    _check_rows(impl, "backward")

"""Formulations as declarations (conformance/oracle_formulations.py, harness/judge/formulation_error.py).

(a) The vocabulary: each field parses from ``--declare``, refuses what it cannot mean, and is a listed
deviation with its spec sentence (CONFORMS AS DECLARED, never plain CONFORMS). (b) The oracle under a
formulation: the spec's answer where nothing is declared, the overflow, the fill's consequences.
(c) The self-test kernels of tests/formulation_kernels.py, one per formulation: each passes the
clauses its formulation reaches, fails them undeclared, and fails with one more bug or when it only
approximately follows its formulation; discovery finds each; ``--discover`` lists the discovered
formulation as a deviation. (d) Likely causes name one precision across dtypes.

The default (ci) run keeps to single clauses and discovery (a few seconds); the thorough profile
(``--conformance-profile=thorough``) runs every ci clause on every kernel, each bug and approximation
on every clause, and ``--discover`` certifications to CONFORMS AS DECLARED. Longer than 250 lines
because the four parts test one feature end to end and share the kernels' tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conformance import oracle
from conformance import oracle_formulations as of
from conformance.contract import Declaration
from conformance.harness.calls.declare import ImplSpecError, parse_declare
from conformance.harness.cases.build import random_case
from conformance.harness.causes import likely
from conformance.harness.discovery import discover as discovery
from conformance.harness.judge import expected as judged
from conformance.harness.records.deviations import deviations
from conformance.harness.records.verdict import ClauseResult
from conformance.harness.run import runstate
from tests import formulation_kernels as fk
from tests.clause_runner import NOT_IN_CI, dtypes_for, load_clauses, run_clause

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")

CLAUSES = load_clauses()
CLAUSE_DIR = Path(__file__).resolve().parents[1] / "conformance" / "clauses"


def _thorough(request: pytest.FixtureRequest) -> bool:
    return runstate.getoption(request.config, runstate.OPT_PROFILE) == "thorough"


# -- (a) the vocabulary ---------------------------------------------------------------------------------
def test_every_field_parses_from_declare_and_refuses_nonsense():
    got = parse_declare(
        [
            "float32_computed_as=tf32",
            "float16_computed_as=float16-products",
            "bfloat16_computed_as=bfloat16-scores",
            "scale_applied=query",
            "blocked_fill=add:-1e4",
            "normwise_merges=3",
        ]
    )
    assert got["blocked_fill"] == "add:-1e4" and got["normwise_merges"] == 3
    Declaration().replace(**got)  # and the declaration takes them together
    for bad in (
        "float16_computed_as=bfloat16-products",
        "blocked_fill=add:+5",
        "blocked_fill=zero",
        "scale_applied=key",
    ):
        with pytest.raises(ImplSpecError):
            parse_declare([bad])


def test_each_formulation_is_a_deviation_with_its_sentence():
    assert deviations(Declaration()) == []
    assert deviations(Declaration(scale_applied="product")) == []  # the GEMM's alpha: no rounding by itself
    filled = deviations(Declaration(all_blocked="mean-v", blocked_fill="set:min"))
    assert [d.field for d in filled] == ["blocked_fill"] and "mean of V" in filled[0].what  # listed once
    cases = {
        "float32_computed_as": ("bfloat16", "禁用外层 autocast 对这里矩阵乘法的降精度"),
        "float16_computed_as": ("float16-products", "转为 float32 后才计算点积和 softmax"),
        "bfloat16_computed_as": ("bfloat16-sums", "转为 float32 后才计算点积和 softmax"),
        "scale_applied": ("query", "先提高精度，再做点积"),
        "blocked_fill": ("set:-0.7max", "它并不严格等价于屏蔽"),
        "normwise_merges": (2, "p_ij = exp(s_ij - m_i)"),
    }
    for field, (value, sentence) in cases.items():
        (dev,) = deviations(Declaration(**{field: value}))
        assert dev.field == field and dev.value == value and sentence in dev.source.text, dev


# -- (b) the oracle under a formulation -------------------------------------------------------------------
def test_nothing_declared_is_the_spec_oracle():
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        case = random_case(1, dtype=dtype, mask=np.eye(5, dtype=bool)[:4])
        assert of.formulation(case, Declaration()) is None


def test_rounding_helpers():
    assert of.round_to(np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11]), "tf32").tolist() == [1.0, 1 + 2.0**-9]  # ties even
    assert np.isinf(of.round_to(np.array([65520.0]), "float16")[0])
    res = of.rounding_residual(np.array([1.0, 1 + 2.0**-11]), np.array([1e-6, 1e-6]), "float16")
    assert res[0] == 0.0 and res[1] > 2.0**-10  # far from a boundary: exact; at a tie: one spacing


def _large_logits(dtype: str):
    from conformance.harness.discovery.precision import large_logits

    return large_logits(dtype)


def test_float16_products_overflow_and_the_scale_inside_does_not():
    case = _large_logits("float16")  # raw q.k = 65536 + 8j, scale 1/8
    products = judged.expected(case, Declaration(float16_computed_as="float16-products")).out
    inside = judged.expected(case, Declaration(float16_computed_as="float16-products", scale_applied="product")).out
    spec = judged.expected(case, Declaration()).out
    assert np.isnan(products).all() and np.isfinite(inside).all()
    assert np.abs(inside - spec).max() > 0.1  # the scaled scores 8192 + j lose j at float16's spacing of 8


def test_fill_consequences():
    mask = np.zeros((1, 1, 3, 5), dtype=bool)
    mask[0, 0, 1] = True  # a row blocked entirely
    case = random_case(3, B=1, Hq=1, T=3, S=5, Dk=8, mask=mask)
    g = np.random.default_rng(4).standard_normal(case.out_shape)
    added = Declaration(all_blocked="mean-v", blocked_fill="add:-0.7max")
    fwd = judged.expected(case, added)
    np.testing.assert_allclose(fwd.weights[0, 0, 1], 0.2)  # the fill swamps the scores: uniform
    assert not fwd.all_blocked[0, 0, 1]  # computed from the scores, not fixed
    dq_add = judged.expected_vjp(case, g, added)[0][0, 0, 1]
    dq_set = judged.expected_vjp(case, g, added.replace(blocked_fill="set:-0.7max"))[0][0, 0, 1]
    assert np.abs(dq_add).max() > 1e-3 and np.all(dq_set == 0)  # an added fill passes the gradient on
    f64 = case.replace(query=case.query.astype(np.float64), key=case.key.astype(np.float64))
    hf = Declaration(all_blocked="mean-v", all_blocked_float_mask="nan", float64_computed_as="float32")
    assert np.isnan(judged.expected(f64, hf.replace(blocked_fill="add:min")).out[0, 0, 1]).all()  # -inf in float32
    assert np.isfinite(judged.expected(f64, hf.replace(blocked_fill="set:min")).out[0, 0, 1]).all()
    # a blocked key scoring 100 * 300 / sqrt(8) ~ 10600: a fill of -1e4 leaves it on top, -0.7 x max does not
    q, k = np.zeros((1, 1, 1, 8), np.float32), np.zeros((1, 1, 5, 8), np.float32)
    q[..., 0], k[0, 0, 2, 0] = 100.0, 300.0
    hot = case.replace(query=q, key=k, value=case.value, mask=(np.arange(5) == 2).reshape(1, 1, 1, 5))
    assert judged.expected(hot, added.replace(blocked_fill="add:-1e4")).weights[0, 0, 0, 2] > 0.99
    assert judged.expected(hot, added).weights[0, 0, 0, 2] == 0 == oracle.forward(hot).weights[0, 0, 0, 2]


def test_normwise_merges_change_the_allowance_not_the_answer():
    case = random_case(5, B=1, Hq=1, T=2, S=12, Dk=8)
    merged = Declaration(normwise_merges=3)
    np.testing.assert_array_equal(judged.expected(case, merged).out, judged.expected(case, Declaration()).out)
    assert (judged.weights_allowance(case, merged) >= 9 * 2.0**-24).all()


# -- (c) the self-test kernels ------------------------------------------------------------------------------
# (clause, dtype) each kernel's formulation reaches, run in the ci profile; where the same kernel
# undeclared is refused; where one more bug, or an approximation, fails it.
REACHES = {
    "form-f32-bf16": [("ALL-BLOCKED-02", "float32"), ("GRAD-VJP-01", "float32")],
    "form-f32-tf32": [("ALL-BLOCKED-02", "float32"), ("GRAD-VJP-01", "float32")],
    "form-f16-products": [("UPCAST-01", "float16"), ("SCALE-CUSTOM-03", "float16"), ("GRAD-VJP-01", "float16")],
    "form-q-prescaled": [("MASK-BEFORE-SOFTMAX-01", "float16"), ("GRAD-VJP-01", "bfloat16")],
    "form-fill-add": [("ALL-BLOCKED-GRAD-03", "float32"), ("ALL-BLOCKED-02", "float16"), ("GOLDEN-01", "float32")],
    "form-ring-merge": [("GOLDEN-01", "float32")],
}
UNDECLARED = {
    "form-f32-bf16": ("ALL-BLOCKED-02", "float32"),
    "form-f32-tf32": ("ALL-BLOCKED-02", "float32"),
    "form-f16-products": ("SCALE-CUSTOM-03", "float16"),
    "form-q-prescaled": ("MASK-BEFORE-SOFTMAX-01", "float16"),
    "form-fill-add": ("ALL-BLOCKED-GRAD-03", "float32"),
    "form-ring-merge": ("GOLDEN-01", "float32"),
}
BUGS = {"mask-off-by-one": ("ALL-BLOCKED-02", "float64"), "backward-scale": ("GRAD-VJP-01", "float16")}
APPROXIMATE = {"noise": ("ALL-BLOCKED-FLOAT-04", "float64"), "fill-1e4": ("ALL-BLOCKED-02", "float32")}


def _undeclared(name: str):
    kernel = fk.KERNELS[name]()
    kernel.declaration = kernel.declaration.replace(
        float32_computed_as="float32", float16_computed_as="float32", scale_applied="scores",
        blocked_fill="-inf", normwise_merges=0,
    )  # fmt: skip
    return kernel


@pytest.mark.parametrize("name", sorted(fk.KERNELS))
def test_a_kernel_that_does_what_it_declares_passes_and_undeclared_fails(request, name):
    pairs = REACHES[name]
    if _thorough(request):
        pairs = [(c, d) for c, info in sorted(CLAUSES.items()) if info.func.__module__ not in NOT_IN_CI
                 for d in dtypes_for(info)]  # fmt: skip
    for clause_id, dtype in pairs:
        verdict = run_clause(CLAUSES[clause_id], fk.KERNELS[name](), dtype)
        assert not verdict.startswith("failed"), f"{name} {clause_id}[{dtype}]: {verdict}"
    clause_id, dtype = UNDECLARED[name]
    verdict = run_clause(CLAUSES[clause_id], _undeclared(name), dtype, shrink=False)
    assert verdict.startswith("failed"), f"{name} undeclared passes {clause_id}[{dtype}]: {verdict}"


@pytest.mark.parametrize("bug", sorted(BUGS))
@pytest.mark.parametrize("name", sorted(fk.KERNELS))
def test_one_more_bug_fails(name, bug):
    clause_id, dtype = BUGS[bug]
    verdict = run_clause(CLAUSES[clause_id], fk.with_bug(fk.KERNELS[name], bug), dtype, shrink=False)
    assert verdict.startswith("failed"), f"{name} with {bug} passes {clause_id}[{dtype}]"


@pytest.mark.parametrize("how", sorted(APPROXIMATE))
@pytest.mark.parametrize("name", sorted(fk.KERNELS))
def test_only_approximately_following_fails(name, how):
    if how == "fill-1e4" and fk.KERNELS[name].fill is None:
        pytest.skip(f"{name} has no fill")
    clause_id, dtype = APPROXIMATE[how]
    verdict = run_clause(CLAUSES[clause_id], fk.approximate(fk.KERNELS[name], how), dtype, shrink=False)
    assert verdict.startswith("failed"), f"{name} ~{how} passes {clause_id}[{dtype}]"


# What discovery must propose for each bare kernel: its formulation (the fill kernel's rows blocked
# entirely are its fill's mean of V; the ring kernel gets the fewest merges whose allowance admits it).
FORMULATION = ("float32_computed_as", "float16_computed_as", "bfloat16_computed_as", "scale_applied",
               "blocked_fill", "normwise_merges", "all_blocked")  # fmt: skip
DISCOVERED = {
    "form-f32-bf16": {"float32_computed_as": "bfloat16"},
    "form-f32-tf32": {"float32_computed_as": "tf32"},
    "form-f16-products": {"float16_computed_as": "float16-products"},
    "form-q-prescaled": {"scale_applied": "query"},
    "form-fill-add": {"all_blocked": "mean-v", "blocked_fill": "add:-0.7max"},
    "form-ring-merge": {"normwise_merges": "1"},
}


@pytest.mark.parametrize("name", sorted(fk.KERNELS))
def test_discovery_finds_each_formulation(name):
    found = discovery.discover(fk._bare(fk.KERNELS[name]), spec=name)
    got = {k: discovery.declare_value(v) for k, v in found.changes().items() if k in FORMULATION}
    assert got == DISCOVERED[name], "\n".join(found.lines())
    assert found.findings == [], found.findings


BARE = {
    "form-f32-bf16": "bare_f32_bf16",
    "form-f32-tf32": "bare_f32_tf32",
    "form-f16-products": "bare_f16_products",
    "form-q-prescaled": "bare_q_prescaled",
    "form-fill-add": "bare_fill_add",
    "form-ring-merge": "bare_ring_merge",
}


def test_discover_certifies_under_the_discovered_formulation(pytester, tmp_path):
    """ci: one module, ``--allow-partial``; the discovered formulation is the certified declaration and
    a listed deviation."""
    spec = "tests.formulation_kernels:bare_f16_products"
    cert = tmp_path / "cert.json"
    result = pytester.runpytest_inprocess(
        str(CLAUSE_DIR / "test_precision.py"), f"--impl={spec}", "--discover", "--allow-partial",
        f"--certificate={cert}", "-p", "no:cacheprovider", "-q",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    assert "--declare float16_computed_as=float16-products" in out, out[-3000:]
    devs = json.loads(cert.read_text())["adapters"][spec]["deviations"]
    assert [d["field"] for d in devs] == ["float16_computed_as"], devs


@pytest.mark.parametrize("name", sorted(BARE))
def test_discover_certifies_each_conforms_as_declared(request, pytester, tmp_path, name):
    """thorough: every clause of the profile under ``--discover``: CONFORMS AS DECLARED."""
    if not _thorough(request):
        pytest.skip(
            "not in profile: a full --discover certification per kernel runs with --conformance-profile=thorough"
        )
    spec = f"tests.formulation_kernels:{BARE[name]}"
    result = pytester.runpytest_inprocess(str(CLAUSE_DIR), f"--impl={spec}", "--discover", "-p", "no:cacheprovider")
    line = next((ln for ln in result.outlines if ln.startswith(f"{spec}: ")), "no verdict line")
    assert line.startswith(f"{spec}: CONFORMS AS DECLARED"), result.stdout.str()[-4000:]


# -- (d) likely causes: one precision across dtypes ------------------------------------------------------------
def _failed(clause: str, dtype: str, rel: float, matches=()) -> dict:
    measure = {"err": rel, "allowed": rel / 100, "rel_err": rel, "nan": 0}
    failure = {"features": f"dtype={dtype}", "call": "forward", "dtype": dtype, "measure": measure,
               "matches": list(matches), "checked": True}  # fmt: skip
    return ClauseResult(clause, "k", dtype, "failed", failure=failure).as_dict()


def test_every_dtype_at_bfloat16_is_one_cause():
    u = 2.0**-8
    rows = [ClauseResult("P", "k", "bfloat16", "passed", case_features={"dtype=bfloat16": 40}).as_dict()]
    rows += [_failed(c, d, 0.6 * u, ["float32_computed_as=bfloat16"] if d == "float32" else [])
             for c in "ABCD" for d in ("float64", "float32", "float16")]  # fmt: skip
    found = likely.likely_causes(rows)
    first = found["causes"][0]
    assert first["features"] == ["computed at bfloat16 precision"] and first["clause_tests"] == 12, first
    assert first["declare"].startswith("float32_computed_as=bfloat16") and first["not_declarable"] == [
        "float16",
        "float64",
    ]
    assert "0.6 bfloat16 u" in first["errors"]["float16/float32/float64"]["in_units"]


def test_an_additive_mask_added_in_float16_is_discovered_and_judged_exactly():
    """``float16-masked`` (s + M rounded to float16, MLX's additive mask): discovery tells it from
    ``-products`` (a witness of scores of 256 plus an M of fractions), the kernel declaring it passes
    ORACLE-AGREE-01 in float16 and that witness, and the same kernel declaring ``-products`` fails the
    witness (the drawn space meets such a case only now and then: MLX's was a random seed's)."""
    found = discovery.discover(fk._bare(fk.F16Masked), spec="form-f16-masked")
    got = {k: discovery.declare_value(v) for k, v in found.changes().items() if k in FORMULATION}
    assert got == {"float16_computed_as": "float16-masked"}, "\n".join(found.lines())
    kernel = fk.F16Masked()
    assert run_clause(CLAUSES["ORACLE-AGREE-01"], kernel, "float16") == "passed"
    from conformance.harness.calls.guarded import GuardedAdapter
    from conformance.harness.discovery.formulations import _lowp_witnesses
    from conformance.harness.judge import compare
    from conformance.harness.spec.report import ClauseViolation

    witness = _lowp_witnesses("float16")[-1][0]  # scores of 256 plus an M of fractions
    compare.assert_output_matches(GuardedAdapter(kernel, spec="masked", timeout=0), witness)
    kernel.declaration = kernel.declaration.replace(float16_computed_as="float16-products")
    with pytest.raises(ClauseViolation):
        compare.assert_output_matches(GuardedAdapter(kernel, spec="as products", timeout=0), witness)

"""TRANSFORM-FAKE-05 on kernels that need their inputs' values: under fake tensors they refuse (a measured
capability on the run's transforms line, the exception named), they do not fail; and the mutant whose path
under fake tensors returns another dtype fails by the clause's own check."""

from __future__ import annotations

import pytest

from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.spec.clause import CLAUSES
from tests.clause_runner import load_clauses, run_clause
from tests.trust_kernels import reference

pytest.importorskip("torch")
load_clauses()
FAKE = CLAUSES["TRANSFORM-FAKE-05"]


def _reads_a_value(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if float(q.abs().max()) > 1e4:  # a Python branch on data: .item() under fake tensors
        q = q / 2
    return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _goes_through_numpy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch

    q = torch.from_numpy(q.detach().numpy().copy())
    return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _adapter(fn, name):
    from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

    return FunctionAdapter(fn, name=name, declaration=FUNCTION_DEFAULTS)


@pytest.mark.parametrize(
    ("fn", "exception"),
    [(_reads_a_value, "DataDependentOutputException"), (_goes_through_numpy, "RuntimeError")],
)
def test_a_kernel_that_needs_its_data_refuses_fake_tensors(fn, exception):
    impl = GuardedAdapter(_adapter(fn, fn.__name__), spec=fn.__name__, timeout=0)
    with pytest.raises(pytest.skip.Exception, match=f"the kernel refuses fake tensors .*{exception}"):
        FAKE.func(impl=impl, dtype="float32")
    assert [r["outcome"] for r in impl.transforms_seen] == ["refused"]
    assert exception in impl.transforms_seen[0]["detail"]


def test_the_plain_function_answers_and_the_upcast_mutant_fails_by_the_clause():
    from tests.mutants import MUTANTS

    assert run_clause(FAKE, _adapter(reference, "reference"), "float16") == "passed"
    verdict = run_clause(FAKE, MUTANTS["transform_fake_output_upcast"](), "float16")
    assert verdict.startswith("failed: under fake tensors the output is [2, 2, 4, 6] float32"), verdict

"""Two bitwise claims, apart: ``deterministic`` (same call, same memory, same bits) and ``layout_invariant``
(the same numbers in any memory give the same bits).

A correct kernel whose last bits follow its inputs' alignment (a SIMD path blocked by the address, as torch's
CPU flash kernel is on an AVX-512 host) conforms by default and fails only when it claims layout invariance;
a kernel whose *values* follow the alignment fails either way. The PRESENT-* clauses place the plain
presentation on a 64-byte boundary and the others off it, so both are seen on any host, whatever its allocator
or vector width.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conformance.contract import Declaration
from conformance.harness.covering.build import at_alignment
from tests.clause_runner import load_clauses, run_clause
from tests.trust_kernels import reference

CLAUSES = load_clauses()


def alignment_bits(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The spec's attention, its result one ulp higher in every other nonzero element when the query is not on a
    64-byte boundary: a correct kernel whose bits (not its values) depend on where its inputs lie. An exact zero
    (a sum of zero products, as a V = I probe's padded columns give) has no last bit to round otherwise."""
    out = reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if q.data_ptr() % 64 and out.dtype in (torch.float32, torch.float64):
        held = out.detach()
        bumped = torch.nextafter(held, torch.full_like(held, float("inf")))
        every_other = (torch.arange(held.numel()).reshape(held.shape) % 2).to(torch.bool) & (held != 0)
        out = out + torch.where(every_other, bumped - held, torch.zeros_like(held))
    return out


def _function(fn, **declared):
    from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

    decl: Declaration = FUNCTION_DEFAULTS.replace(**declared)
    return FunctionAdapter(fn, name=fn.__name__, declaration=decl)


def test_at_alignment_places_the_values_where_asked():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for elements in (0, 1, 3, 4):
        view = at_alignment(x, elements * x.itemsize)
        assert view.ctypes.data % 64 == elements * x.itemsize
        assert view.flags.c_contiguous and np.array_equal(view, x)
    with pytest.raises(ValueError, match="not a multiple of the itemsize"):
        at_alignment(x, 2)


def test_the_torch_arguments_keep_the_address():
    from implementations._torch import Arguments, mask_tensor

    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    view = at_alignment(x, 4)
    t = Arguments()(view)
    assert t.data_ptr() == view.ctypes.data and torch.equal(t, torch.from_numpy(x))
    m = np.random.default_rng(1).random((2, 1, 4, 5)) < 0.4
    wide = np.zeros((2, 1, 7, 10), dtype=bool)
    wide[..., 2:6, 3:8] = m
    pitched = wide[..., 2:6, 3:8]
    inverted = mask_tensor(pitched, invert=True)
    assert inverted.stride()[-2] == 10, "the inverted mask keeps the row pitch of the mask it was given"
    assert torch.equal(inverted, torch.from_numpy(~m))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_alignment_bits_conform_unless_layout_invariance_is_declared(dtype):
    info = CLAUSES["PRESENT-MEMORY-01"]
    assert run_clause(info, _function(alignment_bits), dtype) == "passed"
    claimed = run_clause(info, _function(alignment_bits, layout_invariant=True), dtype)
    assert claimed.startswith("failed: ") and "layout_invariant" in claimed, claimed
    assert "a bitwise rule, not the error model" in claimed


def test_alignment_dependent_values_fail_either_way():
    from tests.mutants_calls import CallAlignmentDependentValues

    info = CLAUSES["PRESENT-MEMORY-01"]
    for declared in ({}, {"layout_invariant": True}):
        kernel = CallAlignmentDependentValues("call_alignment_dependent_values")
        kernel.declaration = kernel.declaration.replace(**declared)
        verdict = run_clause(info, kernel, "float32", shrink=False)
        assert verdict.startswith("failed: "), verdict


def test_a_second_backward_is_held_to_determinism_alone():
    """PRESENT-BACKWARD-05 runs both backward passes on the same memory: bitwise for a deterministic kernel
    whatever it claims of layouts, so the alignment kernel passes it."""
    assert run_clause(CLAUSES["PRESENT-BACKWARD-05"], _function(alignment_bits), "float32") == "passed"

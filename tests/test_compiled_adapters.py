"""Self-tests of the compiled built-ins, torch-compile and torch-flex, sized for the default run.

A compiled kernel costs a compilation per input structure (torch.compile of SDPA on this 2-core CPU:
about 0.5 s without a mask, 3 s with one, cold; FlexAttention's C++ template about 20 s), so the
default run checks what it can on few structures, and the rest runs where a certification of them
runs (``tox -e torch-compile``, ``tox -e torch-flex``, with ``SDPA_CONFORMANCE_COMPILED=1``):

* by default (eleven programs compiled, none with a mask): both are certified by name only (a bare
  ``pytest`` leaves them out); torch-compile compiles every structure it meets, the ninth and later
  too (dynamo's default limit of 8 would run them eagerly), in the declared causal alignment;
  torch-flex's translation (mask_mod, score_mod, block-mask broadcasting, document masks for
  varlen, both causal alignments) gives the oracle's answer through FlexAttention's own reference
  path (``flex_attention`` uncompiled, no compiling);
* with ``SDPA_CONFORMANCE_COMPILED=1``: torch-compile's other dtypes, backward and masks, and
  torch-flex compiled: its declared dtypes, what the CPU refuses (float64, backward), the fill of
  rows blocked entirely (and tests/test_adapter_declarations.py measures both in full).

The reference here is the float64 oracle (``conformance.oracle_variants``), as in the clauses.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from conformance import oracle_variants
from conformance.harness.calls import registry
from conformance.harness.cases.build import random_case, random_mask

torch = pytest.importorskip("torch")

HEAVY = os.environ.get("SDPA_CONFORMANCE_COMPILED") == "1"
heavy = pytest.mark.skipif(not HEAVY, reason="compiles many structures: SDPA_CONFORMANCE_COMPILED=1 (tox -e torch-*)")
TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def _usable(spec: str):
    res = registry.resolve(spec)
    if not res.usable:
        pytest.skip(f"{spec}: {res.reason}")
    return res.adapter


def _close(got: np.ndarray, case, align: str = "top-left", what: str = "output") -> None:
    want = oracle_variants.forward(case, all_blocked="zeros", causal_alignment=align).out
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want) / (1 + np.abs(want)))) if want.size else 0.0
    assert err <= TOL[case.dtype], f"{what}: err {err:.3g} > {TOL[case.dtype]} for {case.describe()}"


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def test_compiled_builtins_are_certified_by_name_only():
    from implementations import BUILTINS, BY_NAME_ONLY

    assert {"torch-compile", "torch-flex"} <= BY_NAME_ONLY <= set(BUILTINS)
    default = registry.default_names()
    assert not set(default) & BY_NAME_ONLY and "numpy" in default and "torch-sdpa" in default


def test_compiled_throughout_raises_dynamos_limits_for_compiled_functions_only():
    import torch._dynamo

    from implementations._torch import RECOMPILE_LIMIT, compiled_throughout

    before = torch._dynamo.config.recompile_limit
    with compiled_throughout(torch.nn.functional.scaled_dot_product_attention):  # not compiled: nothing
        assert torch._dynamo.config.recompile_limit == before
    compiled = torch.compile(torch.nn.functional.scaled_dot_product_attention, dynamic=False)
    with compiled_throughout(compiled):
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
        assert torch._dynamo.config.accumulated_recompile_limit == RECOMPILE_LIMIT
    assert torch._dynamo.config.recompile_limit == before


def test_torch_compile_compiles_every_structure_past_dynamos_limit():
    """Ten shapes, ten programs (under dynamo's default limit of 8 the ninth and tenth ran eagerly),
    each the oracle's answer; a repeated shape compiles nothing."""
    adapter = _usable("torch-compile")
    start = _graphs()
    for T in range(1, 11):
        case = random_case(T, B=1, Hq=2, T=T, S=5, Dk=8, dtype="float32")
        _close(adapter.forward(case), case)
    assert _graphs() - start == 10, "a structure was not compiled (eager fallback?)"
    adapter.forward(random_case(99, B=1, Hq=2, T=3, S=5, Dk=8, dtype="float32"))
    assert _graphs() - start == 10, "a repeated structure was compiled again"


@heavy
@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_torch_compile_declared_dtypes_run_and_return_their_dtype(dtype):
    adapter = _usable("torch-compile")
    assert dtype in adapter.declaration.dtypes
    case = random_case(5, B=1, Hq=2, T=3, S=5, Dk=8, dtype=dtype)
    out = adapter.forward(case)
    assert out.dtype == case.query.dtype
    _close(out, case)


@pytest.mark.parametrize("T,S", [(3, 5), pytest.param(5, 3, marks=heavy)], ids=["T<S", "T>S"])
def test_torch_compile_causal_alignment_is_the_declared_one(T, S):
    adapter = _usable("torch-compile")
    case = random_case(7, B=1, Hq=2, T=T, S=S, Dk=8, dtype="float32", is_causal=True)
    _close(adapter.forward(case), case, adapter.declaration.causal_alignment, "causal")


@heavy
def test_torch_compile_backward_matches_the_oracle():
    adapter = _usable("torch-compile")
    assert adapter.declaration.grad
    case = random_case(8, B=1, Hq=2, T=3, S=5, Dk=8, dtype="float32")
    g = np.random.default_rng(8).standard_normal(case.out_shape).astype(np.float32)
    got = adapter.vjp(case, g)
    want = oracle_variants.vjp(case, g)
    for name, a, b in zip("qkv", got, want):
        assert np.max(np.abs(a - b)) <= 1e-4, f"d{name}"


@heavy
def test_torch_compile_masks_and_rows_blocked_entirely():
    adapter = _usable("torch-compile")
    mask = random_mask(9, (2, 1, 1, 6), p_blocked=0.3)
    mask[1, ..., :] = True  # sequence 1 sees no key: the declared fill
    case = random_case(9, B=2, Hq=2, T=4, S=6, Dk=8, dtype="float32", mask=mask, is_causal=True)
    _close(adapter.forward(case), case, adapter.declaration.causal_alignment, "mask + causal")


# -- torch-flex ---------------------------------------------------------------------------------------
def _flex_cases(seed: int):
    """Six cases that between them use everything torch-flex declares: each mask form (no mask,
    [T,S], [B,1,1,S], [B,H,T,S]), M, causal with T < S and T > S, a window, the softcap, ALiBi,
    variable lengths with each, GQA, Dk != Dv and a custom scale."""
    rng = np.random.default_rng(seed)

    def case(i, T, S, **kw):
        return random_case(seed + i, B=2, Hq=4, Hkv=2, T=T, S=S, Dk=8, Dv=16, dtype="float32", **kw)

    lengths = dict(seqlens_q=np.array([3, 5]), seqlens_k=np.array([7, 4]))
    return [
        case(0, 5, 7, mask=random_mask(seed, (5, 7), 0.3), bias=rng.standard_normal((1, 4, 5, 7)), is_causal=True),
        case(1, 7, 4, mask=random_mask(seed + 1, (2, 1, 1, 4), 0.3), is_causal=True, scale=0.3).replace(softcap=1.5),
        case(2, 5, 7, mask=random_mask(seed + 2, (2, 4, 5, 7), 0.3)).replace(window=(2, 1), alibi_slopes=rng.random(4)),
        case(3, 5, 7, is_causal=True, bias=rng.standard_normal((2, 1, 5, 7))).replace(
            alibi_slopes=rng.random((2, 4)), **lengths
        ),
        case(4, 5, 7, mask=random_mask(seed + 4, (2, 1, 1, 7), 0.3)).replace(window=(1, -1), softcap=2.0, **lengths),
        case(5, 5, 7),
    ]


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_torch_flex_translation_is_the_oracles_through_flex_reference_path(alignment, monkeypatch):
    """The mask_mod, score_mod, block-mask broadcasting and document masks the adapter writes, run by
    FlexAttention's uncompiled reference path (no compiling), give the oracle's answer in the
    declared causal alignment, either one (FlexAttention has none of its own: the mask_mod is the user's)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    from implementations import torch_flex

    adapter = torch_flex.TorchFlex("torch-flex (reference path)", torch_flex.cpu.declaration)
    adapter.declaration = adapter.declaration.replace(causal_alignment=alignment)
    monkeypatch.setattr(adapter, "_compiled", flex_attention)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()": on purpose here
        for case in _flex_cases(seed=1 if alignment == "top-left" else 2):
            assert not adapter.declaration.not_supported_reasons(case), case.describe()
            _close(adapter.forward(case), case, alignment)


@heavy
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_flex_compiled_declared_dtypes(dtype):
    adapter = _usable("torch-flex")
    mask = random_mask(11, (2, 1, 4, 6), p_blocked=0.3)
    mask[0, 0, 1] = True  # a row blocked entirely: zeros, as declared
    case = random_case(11, B=2, Hq=2, T=4, S=6, Dk=8, dtype=dtype, mask=mask, is_causal=True)
    case = case.replace(bias=np.where(np.arange(6) == 5, -np.inf, 0.25), softcap=2.0)
    out = adapter.forward(case)
    assert out.dtype == case.query.dtype
    _close(out, case, adapter.declaration.causal_alignment)


@heavy
def test_torch_flex_cpu_refusals_are_declared():
    """float64 and the backward: what FlexAttention refuses on the CPU is what torch-flex declares it lacks."""
    adapter = _usable("torch-flex")
    if adapter.device != "cpu":
        pytest.skip("CPU refusals")
    assert "float64" not in adapter.declaration.dtypes and not adapter.declaration.grad
    case = random_case(12, B=1, Hq=2, T=3, S=5, Dk=8, dtype="float64")
    with pytest.raises(Exception, match="float64|supported"):
        adapter.forward(case)
    case = random_case(12, B=1, Hq=2, T=3, S=5, Dk=8, dtype="float32")
    with pytest.raises(Exception, match="backward"):
        adapter.vjp(case, np.ones(case.out_shape, np.float32))

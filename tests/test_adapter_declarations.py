"""Self-tests: each real adapter's declaration is TRUE on the machine running the tests.

The clauses test kernels against the suite's oracle *as declared*; a declaration that is wrong
about the kernel (says zeros where the kernel gives the mean of V, says top-left where it is
bottom-right) would turn every such clause into a test of the wrong thing. So every claim is
measured here against a small float64 NumPy reference written in this file, deliberately not
``conformance.oracle``: the two must not share a mistake.

Adapters whose framework is missing are skipped (importorskip); CUDA/GPU adapters are skipped with
their own ``unavailable_reason()`` where no device exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import numpy as np
import pytest

from conformance.contract import Case, NotApplicable, np_dtype

# (module, attribute, adapter name, framework) for every adapter this file vouches for.
ADAPTERS = [
    ("torch_sdpa", "cpu_default", "torch-sdpa", "torch"),
    ("torch_sdpa", "cpu_math", "torch-sdpa-math", "torch"),
    ("torch_sdpa", "cpu_flash", "torch-sdpa-flash", "torch"),
    ("torch_sdpa", "cuda_default", "torch-sdpa-cuda", "torch"),
    ("torch_sdpa", "cuda_flash", "torch-sdpa-cuda-flash", "torch"),
    ("torch_sdpa", "cuda_efficient", "torch-sdpa-cuda-efficient", "torch"),
    ("torch_sdpa", "cuda_cudnn", "torch-sdpa-cuda-cudnn", "torch"),
    ("torch_sdpa", "cuda_math", "torch-sdpa-cuda-math", "torch"),
    ("jax_attention", "xla", "jax", "jax"),
    ("jax_attention", "cudnn", "jax-cudnn", "jax"),
    ("onnxruntime_attention", "onnxruntime_cpu", "onnxruntime", "onnxruntime"),
    ("keras_numpy", "keras_numpy", "keras-numpy", "keras"),
    ("keras_jax", "keras_jax", "keras-jax", "keras"),
    ("keras_torch", "keras_torch", "keras-torch", "keras"),
    ("hf_eager", "hf_eager", "hf-eager", "transformers"),
    ("hf_sdpa", "hf_sdpa", "hf-sdpa", "transformers"),
    ("mlx_attention", "mlx_cpu", "mlx", "mlx"),
]
# The compiled built-ins compile a program per structure (seconds each, cold): measured here only with
# SDPA_CONFORMANCE_COMPILED=1, as tox -e torch-compile / torch-flex run it (tests/test_compiled_adapters.py
# checks them on a few structures in every run).
if os.environ.get("SDPA_CONFORMANCE_COMPILED") == "1":
    ADAPTERS += [
        ("torch_compile", "cpu", "torch-compile", "torch"),
        ("torch_compile", "cuda", "torch-compile-cuda", "torch"),
        ("torch_flex", "cpu", "torch-flex", "torch"),
        ("torch_flex", "cuda", "torch-flex-cuda", "torch"),
    ]

# Allowed |measured - reference| <= ATOL + RTOL * |reference|, per working dtype. Generous enough
# for every backend's accumulation order; the conventions tested here differ by O(1).
FWD_TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
GRAD_TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 2e-2, "bfloat16": 1.5e-1}


def _load(module: str, attr: str, framework: str):
    # The adapter's module imports its framework itself (keras must not be imported before its
    # adapter chose a backend), so the framework is only looked up here, not imported.
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed; its adapters cannot run")
    try:
        adapter = getattr(importlib.import_module(f"implementations.{module}"), attr)
    except ImportError as exc:
        pytest.skip(f"{framework} cannot be imported ({exc}); its adapters cannot run")
    reason = adapter.unavailable_reason() if hasattr(adapter, "unavailable_reason") else None
    if reason:
        pytest.skip(reason)
    return adapter


@pytest.fixture(params=ADAPTERS, ids=[a[2] for a in ADAPTERS])
def adapter(request):
    module, attr, name, framework = request.param
    a = _load(module, attr, framework)
    assert a.name == name
    return a


# ---------------------------------------------------------------------------------------------
# The float64 reference, in the suite's conventions (mask True = blocked, layout [B, H, T, D]).


def _expand_kv(x: np.ndarray, hq: int) -> np.ndarray:
    """GQA as the adapters declare it: query head h reads kv head h // (Hq / Hkv)."""
    return np.repeat(x, hq // x.shape[1], axis=1)


def _blocked(case: Case, alignment: str = "top-left") -> np.ndarray:
    blocked = np.zeros((case.B, case.Hq, case.T, case.S), dtype=bool)
    if case.mask is not None:
        blocked |= np.asarray(case.mask, dtype=bool)
    if case.is_causal:
        shift = 0 if alignment == "top-left" else case.S - case.T
        blocked |= np.triu(np.ones((case.T, case.S), dtype=bool), k=1 + shift)
    return blocked


def _weights(case: Case, alignment: str, all_blocked: str) -> tuple[np.ndarray, np.ndarray]:
    q = case.query.astype(np.float64)
    k = _expand_kv(case.key.astype(np.float64), case.Hq)
    s = q @ np.swapaxes(k, -1, -2) * case.effective_scale
    if case.bias is not None:
        s = s + np.asarray(case.bias, dtype=np.float64)
    blocked = _blocked(case, alignment) | np.isneginf(s)
    s = np.where(blocked, -np.inf, s)
    dead = blocked.all(axis=-1, keepdims=True)
    m = np.where(dead, 0.0, s.max(axis=-1, keepdims=True))
    e = np.exp(s - m)
    p = e / np.where(dead, 1.0, e.sum(axis=-1, keepdims=True))
    fill = {"zeros": 0.0, "mean-v": 1.0 / case.S, "nan": np.nan}[all_blocked]
    return np.where(dead, fill, p), dead


def reference(case: Case, alignment: str = "top-left", all_blocked: str = "zeros") -> np.ndarray:
    p, _ = _weights(case, alignment, all_blocked)
    return p @ _expand_kv(case.value.astype(np.float64), case.Hq)


def reference_vjp(
    case: Case, g: np.ndarray, alignment: str = "top-left", all_blocked: str = "zeros", added_fill: bool = False
):
    """dq, dk, dv of the reference; fully blocked rows pass no gradient to the logits (their
    output is a constant fill), except under a finite fill ADDED to the scores (``added_fill``: the
    row is the softmax of its filled scores, uniform, and its dS = P (dP - rowsum(P dP)) reaches dq, dk)."""
    p, dead = _weights(case, alignment, all_blocked)
    q = case.query.astype(np.float64)
    k = _expand_kv(case.key.astype(np.float64), case.Hq)
    v = _expand_kv(case.value.astype(np.float64), case.Hq)
    g = g.astype(np.float64)
    dv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    ds = np.where(dead & (not added_fill or all_blocked != "mean-v"), 0.0, ds)
    dq = ds @ k * case.effective_scale
    dk = np.swapaxes(ds, -1, -2) @ q * case.effective_scale

    def fold(x):  # sum the query heads that share one kv head
        return x.reshape(case.B, case.Hkv, case.Hq // case.Hkv, *x.shape[2:]).sum(axis=2)

    return dq, fold(dk), fold(dv)


# ---------------------------------------------------------------------------------------------
# Helpers


def make_case(
    dtype: str = "float32",
    B: int = 2,
    Hq: int = 2,
    Hkv: int | None = None,
    T: int = 5,
    S: int = 7,
    Dk: int = 16,
    Dv: int | None = None,
    seed: int = 0,
    **fields,
) -> Case:
    rng = np.random.default_rng(seed)
    Hkv = Hq if Hkv is None else Hkv
    Dv = Dk if Dv is None else Dv
    dt = np_dtype(dtype)
    return Case(
        query=rng.standard_normal((B, Hq, T, Dk)).astype(dt),
        key=rng.standard_normal((B, Hkv, S, Dk)).astype(dt),
        value=rng.standard_normal((B, Hkv, S, Dv)).astype(dt),
        **fields,
    )


def working_dtype(adapter) -> str:
    """The most precise dtype the adapter declares, so conventions are seen without rounding noise."""
    for dt in ("float64", "float32", "float16", "bfloat16"):
        if dt in adapter.declaration.dtypes:
            return dt
    raise AssertionError(f"{adapter.name} declares no dtype")


def _float64_as_float32(adapter) -> bool:
    return adapter.declaration.float64_computed_as == "float32"


def fwd_tol(adapter, dtype: str) -> float:
    if _float64_as_float32(adapter) and dtype == "float64":
        return FWD_TOL["float32"]  # e.g. jax's softmax runs in float32 (see test_float64_accuracy)
    return FWD_TOL[dtype]


def grad_tol(adapter, dtype: str) -> float:
    if _float64_as_float32(adapter) and dtype == "float64":
        return GRAD_TOL["float32"]
    return GRAD_TOL[dtype]


def max_err(measured: np.ndarray, expected: np.ndarray) -> float:
    measured = np.asarray(measured, dtype=np.float64)
    scale = 1.0 + np.abs(expected)
    return float(np.max(np.abs(measured - expected) / scale)) if expected.size else 0.0


def assert_close(measured, expected, tol: float, what: str) -> None:
    assert np.shape(measured) == expected.shape, f"{what}: shape {np.shape(measured)}, should be {expected.shape}"
    err = max_err(measured, expected)
    assert err <= tol, f"{what}: max error {err:.3g} > allowed {tol:.3g}"


def requires(adapter, *fields: str) -> None:
    off = [f for f in fields if not getattr(adapter.declaration, f)]
    if off:
        pytest.skip(f"{adapter.name} declares no {', '.join(off)}")


# ---------------------------------------------------------------------------------------------
# Capabilities


def test_declared_dtypes_run_and_return_their_dtype(adapter):
    for dtype in sorted(adapter.declaration.dtypes):
        case = make_case(dtype, T=16, S=16, Dk=64)
        out = adapter.forward(case)
        assert out.dtype == np_dtype(dtype), f"{dtype} case returned {out.dtype}"
        assert_close(out, reference(case), fwd_tol(adapter, dtype), f"{dtype} forward")


def test_undeclared_dtypes_are_refused(adapter):
    undeclared = sorted({"float64", "float32", "float16", "bfloat16"} - adapter.declaration.dtypes)
    if not undeclared:
        pytest.skip(f"{adapter.name} declares every dtype")
    for dtype in undeclared:
        with pytest.raises((NotApplicable, RuntimeError, TypeError, ValueError)):
            adapter.forward(make_case(dtype, T=16, S=16, Dk=64))


def test_float64_accuracy(adapter):
    """float64 in, float64 out; torch computes in float64, kernels declaring float64_computed_as=float32
    (jax's softmax runs in float32) carry float32-level error, and must: the declaration is pinned both ways."""
    requires_dtype = "float64" in adapter.declaration.dtypes
    if not requires_dtype:
        pytest.skip(f"{adapter.name} declares no float64")
    case = make_case("float64", T=16, S=32, Dk=32, seed=3)
    out = adapter.forward(case)
    assert out.dtype == np.float64
    err = max_err(out, reference(case))
    if _float64_as_float32(adapter):
        # Pinned on purpose: if this drops below 1e-12, the kernel computes float64 in float64 now and
        # its declaration (float64_computed_as) and module docstring must change.
        assert 1e-12 < err < 1e-5, f"{adapter.name} float64 error {err:.3g}; declared float32-level (~1e-7)"
    else:
        assert err < 1e-12, f"float64 error {err:.3g}: not computed in float64"


def test_gqa_head_mapping(adapter):
    """Query head h reads kv head h // (Hq/Hkv) (not h % Hkv)."""
    requires(adapter, "gqa")
    dtype = working_dtype(adapter)
    case = make_case(dtype, Hq=6, Hkv=2, T=16, S=16, Dk=64, seed=1)
    out = adapter.forward(case)
    assert_close(out, reference(case), fwd_tol(adapter, dtype), "GQA h // (Hq/Hkv)")
    interleaved = case.replace(key=case.key[:, [0, 1] * 3], value=case.value[:, [0, 1] * 3])
    assert max_err(out, reference(interleaved)) > 0.1, "the h % Hkv mapping should not match"


def test_head_dim_limit(adapter):
    dtype = working_dtype(adapter)
    d = adapter.declaration.max_head_dim or 512
    case = make_case(dtype, B=1, Hq=1, T=16, S=16, Dk=d)
    assert_close(adapter.forward(case), reference(case), fwd_tol(adapter, dtype), f"head dim {d}")


def test_dk_ne_dv(adapter):
    dtype = working_dtype(adapter)
    case = make_case(dtype, T=16, S=16, Dk=32, Dv=64)
    if adapter.declaration.requires_dk_eq_dv:
        # TypeError: keras's jax backend falls back from jax's ValueError to its own copy, whose final
        # reshape to the query's shape fails ("cannot reshape array of shape (2, 16, 2, 1, 64)").
        with pytest.raises((NotApplicable, ValueError, RuntimeError, TypeError)):
            adapter.forward(case)
    else:
        assert_close(adapter.forward(case), reference(case), fwd_tol(adapter, dtype), "Dk != Dv")


def test_custom_scale(adapter):
    requires(adapter, "custom_scale")
    dtype = working_dtype(adapter)
    case = make_case(dtype, T=16, S=16, Dk=64, scale=0.37)
    assert_close(adapter.forward(case), reference(case), fwd_tol(adapter, dtype), "scale=0.37")


@pytest.mark.parametrize("shape", ["T,S", "B,1,1,S", "B,H,T,S"])
def test_bool_mask_broadcast_shapes(adapter, shape):
    requires(adapter, "bool_mask")
    dtype = working_dtype(adapter)
    case = make_case(dtype, T=16, S=16, Dk=64, seed=2)
    rng = np.random.default_rng(5)
    dims = {"T,S": (16, 16), "B,1,1,S": (2, 1, 1, 16), "B,H,T,S": (2, 2, 16, 16)}[shape]
    mask = rng.random(dims) < 0.3
    mask[..., 0] = False  # keep every row alive: this test is about broadcasting, not dead rows
    case = case.replace(mask=mask)
    assert_close(adapter.forward(case), reference(case), fwd_tol(adapter, dtype), f"mask {shape}")


def test_float_mask(adapter):
    requires(adapter, "float_mask")
    dtype = working_dtype(adapter)
    rng = np.random.default_rng(6)
    bias = rng.standard_normal((16, 16))
    bias[rng.random((16, 16)) < 0.3] = -np.inf
    bias[:, 0] = 0.0
    case = make_case(dtype, T=16, S=16, Dk=64, bias=bias)
    assert_close(adapter.forward(case), reference(case), fwd_tol(adapter, dtype), "float mask")


def test_bool_mask_with_float_mask(adapter):
    requires(adapter, "bool_mask", "float_mask")
    dtype = working_dtype(adapter)
    rng = np.random.default_rng(7)
    mask = rng.random((16, 16)) < 0.3
    mask[:, 0] = False
    case = make_case(dtype, T=16, S=16, Dk=64, mask=mask, bias=rng.standard_normal((1, 16)))
    assert_close(adapter.forward(case), reference(case), fwd_tol(adapter, dtype), "bool + float mask")


# ---------------------------------------------------------------------------------------------
# Conventions


def _all_blocked_case(adapter, dtype: str, how: str) -> Case:
    mask = np.zeros((16, 16), dtype=bool)
    mask[3] = True  # query 3 may see no key at all
    case = make_case(dtype, T=16, S=16, Dk=64, seed=4)
    if how == "bool":
        return case.replace(mask=mask)
    return case.replace(bias=np.where(mask, -np.inf, 0.0))


def _check_policy(out: np.ndarray, case: Case, policy: str, tol: float, what: str) -> None:
    row = np.asarray(out[:, :, 3], dtype=np.float64)
    if policy == "zeros":
        assert np.all(row == 0), f"{what}: fully blocked row is not exactly zero: {row.ravel()[:4]}"
    elif policy == "nan":
        assert np.all(np.isnan(row)), f"{what}: fully blocked row is not NaN: {row.ravel()[:4]}"
    else:
        assert_close(row, reference(case, all_blocked="mean-v")[:, :, 3], tol, f"{what}: row vs mean of V")
    others = np.delete(np.asarray(out, dtype=np.float64), 3, axis=2)
    assert_close(others, np.delete(reference(case), 3, axis=2), tol, f"{what}: the other rows")


# Libraries that block with a finite fill ADDED to the scores declare it (blocked_fill=add:...): a row
# blocked entirely is then uniform (the mean of V) and autograd passes its dS to dq and dk, which the
# reference follows (reference_vjp's added_fill). Where the gradient is still not that, it is a real
# deviation (an expectations file lists it), pinned both ways here, so a release that fixes it fails:
# torch's CPU flash backward, under keras-torch, recomputes such a row's weights from its lse in
# float32, where log(S) is lost against the fill: each weight 1 instead of 1/S (dq, dk and dv S times).
BLOCKED_ROW_GRAD_DEVIATES = {"keras-torch": "dq dk dv"}


# Where the boolean-mask fill of a row blocked entirely depends on the dtype: hf-eager's declared fill,
# finfo(dtype).min added (blocked_fill=add:min), is -inf in float64 once its float32 softmax meets it
# (float64_computed_as=float32), so float64 rows are NaN while the other dtypes give the mean of V.
BOOL_ROW_POLICY_IN = {"hf-eager": {"float64": "nan"}}


def test_all_blocked_rows_bool_mask(adapter):
    requires(adapter, "bool_mask")
    dtype = working_dtype(adapter)
    policy = adapter.declaration.all_blocked
    for other, fill in BOOL_ROW_POLICY_IN.get(adapter.name, {}).items():  # pinned: a fix fails here
        odd = _all_blocked_case(adapter, other, "bool")
        _check_policy(adapter.forward(odd), odd, fill, fwd_tol(adapter, other), f"bool mask in {other}")
        dtype = "float32" if dtype == other else dtype
    case = _all_blocked_case(adapter, dtype, "bool")
    _check_policy(adapter.forward(case), case, policy, fwd_tol(adapter, dtype), "bool mask")
    if adapter.declaration.grad and policy != "nan":
        g = np.random.default_rng(8).standard_normal(case.out_shape).astype(np_dtype(dtype))
        grads = adapter.vjp(case, g)
        deviates = BLOCKED_ROW_GRAD_DEVIATES.get(adapter.name, "")
        added = adapter.declaration.blocked_fill.startswith("add:")
        for name, got, want in zip("qkv", grads, reference_vjp(case, g, all_blocked=policy, added_fill=added)):
            assert np.all(np.isfinite(np.asarray(got, dtype=np.float64))), f"d{name} not finite"
            if f"d{name}" in deviates:
                assert max_err(got, want) > grad_tol(adapter, dtype), (
                    f"d{name} through a fully blocked row now matches the reference: the library fixed it; "
                    f"remove {adapter.name} from BLOCKED_ROW_GRAD_DEVIATES and its expectation"
                )
            else:
                assert_close(got, want, grad_tol(adapter, dtype), f"d{name} with a fully blocked row")


# How a row made dead by an all -inf FLOAT mask comes out, where it differs from the declared
# (boolean-mask) policy. The contract has one all_blocked field; jax has two behaviours.
NEG_INF_BIAS_POLICY = {"jax": "nan", "jax-cudnn": None}


def test_all_blocked_rows_neg_inf_float_mask(adapter):
    requires(adapter, "float_mask")
    decl = adapter.declaration
    policy = NEG_INF_BIAS_POLICY.get(adapter.name, decl.all_blocked_float_mask or decl.all_blocked)
    if policy is None:
        pytest.skip(f"{adapter.name}: behaviour not measured")
    dtype = working_dtype(adapter)
    case = _all_blocked_case(adapter, dtype, "bias")
    _check_policy(adapter.forward(case), case, policy, fwd_tol(adapter, dtype), "all -inf float mask")


@pytest.mark.parametrize("T,S", [(4, 9), (9, 4)], ids=["T<S", "T>S"])
def test_causal_alignment(adapter, T, S):
    requires(adapter, "causal")
    dtype = working_dtype(adapter)
    declared = adapter.declaration.causal_alignment
    other = "bottom-right" if declared == "top-left" else "top-left"
    case = make_case(dtype, T=T, S=S, Dk=64, is_causal=True, seed=9)
    try:
        out = adapter.forward(case)
    except NotApplicable as e:
        pytest.skip(f"{adapter.name} refuses is_causal with T != S: {e}")
    policy = adapter.declaration.all_blocked
    assert_close(out, reference(case, declared, policy), fwd_tol(adapter, dtype), f"causal {declared}")
    assert max_err(out, reference(case, other, "zeros")) > 0.1, f"{other} should not match"


# Libraries that drop is_causal when a mask comes with it (a real deviation, in their expectations
# files): transformers' sdpa_attention_forward passes is_causal to torch only without attention_mask.
CAUSAL_DROPPED_WITH_MASK = {"hf-sdpa"}


def test_causal_with_bool_mask_combined(adapter):
    """torch refuses is_causal with attn_mask; its adapter builds one mask in the declared alignment."""
    requires(adapter, "causal", "bool_mask")
    dtype = working_dtype(adapter)
    mask = np.zeros((4, 9), dtype=bool)
    mask[:, 1] = True
    case = make_case(dtype, T=4, S=9, Dk=64, is_causal=True, mask=mask, seed=10)
    declared = adapter.declaration.causal_alignment
    if adapter.name in CAUSAL_DROPPED_WITH_MASK:  # pinned both ways: the mask alone, not the union
        out = adapter.forward(case)
        assert_close(out, reference(case.replace(is_causal=False)), fwd_tol(adapter, dtype), "mask alone")
        assert max_err(out, reference(case, declared)) > 0.1, "is_causal is applied with a mask now"
        return
    assert_close(adapter.forward(case), reference(case, declared), fwd_tol(adapter, dtype), "causal + mask")


# ---------------------------------------------------------------------------------------------
# Formulations (Declaration.float16_computed_as ... blocked_fill), each re-measured against an emulation
# written here from the formulation's description (not conformance/oracle_formulations.py)


def _rnd(x, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np_dtype(dtype)).astype(np.float64)


def _declared_scores(adapter, case: Case) -> np.ndarray:
    """The scores the declared low-precision formulation forms: the product rounded to the input dtype
    (``-products``, ``-sums``), the scale inside it (``scale_applied=product``: one rounding), after it
    in float32, or after it in the input dtype too (``-scores``); Q times the scale as a number of the
    input dtype first (``scale_applied=query``)."""
    decl, dt = adapter.declaration, case.dtype
    how = decl.computed_as(dt)
    q = case.query.astype(np.float64)
    k = _expand_kv(case.key.astype(np.float64), case.Hq)
    sc = case.effective_scale
    if decl.scale_applied == "query":
        q, sc = _rnd(q * _rnd(sc, dt), dt), 1.0
    raw = q @ np.swapaxes(k, -1, -2)
    if how == "float32":
        return raw * sc
    if decl.scale_applied == "product":
        return _rnd(np.float32(sc) * raw, dt)
    s = _rnd(raw, dt) * sc
    return _rnd(s, dt) if how.endswith("-scores") else s


def _softmax(s: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def test_declared_low_precision_formulation(adapter):
    """float16 / bfloat16: the weights (V = I) are the declared formulation's rounded softmax, bitwise on
    nearly every element; the spec's upcast where none is declared (and no NaN where the product of a
    large-logits case passes 65504). Pinned both ways: a library that changes either fails here."""
    low = [d for d in ("float16", "bfloat16") if d in adapter.declaration.dtypes]
    if not low:
        pytest.skip(f"{adapter.name} declares no float16 or bfloat16")
    for dt in low:
        S = 24
        case = make_case(dt, B=1, Hq=2, T=8, S=S, Dk=S, seed=20)
        case = case.replace(
            value=np.ascontiguousarray(np.broadcast_to(np.eye(S), case.value.shape).astype(np_dtype(dt)))
        )
        w = np.asarray(adapter.forward(case), dtype=np.float64)
        how = adapter.declaration.computed_as(dt)
        big = make_case(dt, B=1, Hq=1, T=1, S=8, Dk=64, seed=21)
        big = big.replace(query=np.full_like(big.query, 32), key=np.full_like(big.key, 32))  # q.k = 65536
        out_big = np.asarray(adapter.forward(big), dtype=np.float64)
        if how == "float32":
            assert_close(w, reference(case), FWD_TOL[dt], f"{dt} weights (the spec's upcast)")
            assert np.all(np.isfinite(out_big)), f"{dt}: q.k = 65536 gives NaN: the product is not upcast"
            continue
        want = _rnd(_softmax(_declared_scores(adapter, case)), dt)
        same = float(np.mean(w == want))
        assert same >= 0.99, f"{dt}: weights equal the declared {how} formulation's on {same:.1%} only"
        overflow = ~np.isfinite(_declared_scores(adapter, big)).all(axis=-1)
        assert np.array_equal(np.isnan(out_big).any(axis=-1), overflow), f"{dt}: NaN rows not the formulation's"


def _fill_value(adapter, dtype: str) -> float:
    _, _, name = adapter.declaration.blocked_fill.partition(":")
    top = float(np.finfo(np_dtype(dtype)).max)
    if name == "min":
        return -top
    if name == "-0.7max":
        return float(_rnd(-0.7 * min(top, float(np.finfo(np.float32).max)), dtype))
    if name == "-0.7max-float32":
        return float(_rnd(-0.7 * float(np.finfo(np.float32).max), "float32"))
    return float(name)


def test_declared_fill(adapter):
    """A declared finite fill: a row blocked entirely is the softmax of its filled scores (in float16,
    where -0.7 x 65504 added in float32 keeps the scores' structure, not the mean of V); under a set
    fill, a row blocked by the mask and by -inf together is uniform over the masked keys alone."""
    decl = adapter.declaration
    requires(adapter, "bool_mask")
    if decl.blocked_fill == "-inf":
        pytest.skip(f"{adapter.name} declares -inf (test_all_blocked_rows_bool_mask measures it)")
    mode = decl.blocked_fill.split(":")[0]
    for dt in [d for d in ("float16", "float32") if d in decl.dtypes]:
        case = _all_blocked_case(adapter, dt, "bool")
        out = np.asarray(adapter.forward(case), dtype=np.float64)[:, :, 3]
        s = _declared_scores(adapter, case)[:, :, 3]
        fill = _fill_value(adapter, dt)
        scores_in = dt if decl.computed_as(dt).endswith("-scores") else "float32"
        filled = np.full_like(s, fill) if mode == "set" else _rnd(s + fill, scores_in)
        want = np.einsum("bhs,bhsd->bhd", _softmax(filled), _expand_kv(case.value.astype(np.float64), case.Hq))
        assert_close(out, want, FWD_TOL[dt], f"{dt} row blocked entirely under blocked_fill={decl.blocked_fill}")
    if mode == "set" and decl.float_mask and not decl.masks_combined:
        dt = "float32"
        mask = np.zeros((16, 16), dtype=bool)
        mask[3, 8:] = True
        bias = np.zeros((16, 16))
        bias[3, :8] = -np.inf
        case = make_case(dt, T=16, S=16, Dk=64, seed=22, mask=mask, bias=bias)
        row = np.asarray(adapter.forward(case), dtype=np.float64)[:, :, 3]
        v = _expand_kv(case.value.astype(np.float64), case.Hq)
        assert_close(row, v[:, :, 8:].mean(axis=2), FWD_TOL[dt], "mask + -inf row: the mean of the masked keys' V")


# ---------------------------------------------------------------------------------------------
# Gradients, dropout, determinism


def test_grads_match_reference(adapter):
    requires(adapter, "grad")
    for dtype in sorted(adapter.declaration.dtypes):
        case = make_case(dtype, Hq=4, Hkv=2 if adapter.declaration.gqa else 4, T=16, S=16, Dk=64, seed=11)
        g = np.random.default_rng(12).standard_normal(case.out_shape).astype(np_dtype(dtype))
        grads = adapter.vjp(case, g)
        for name, got, want in zip("qkv", grads, reference_vjp(case, g)):
            assert np.asarray(got).dtype == np_dtype(dtype), f"d{name} dtype {np.asarray(got).dtype}"
            assert_close(got, want, grad_tol(adapter, dtype), f"{dtype} d{name}")


def test_dropout_declaration(adapter):
    dtype = working_dtype(adapter)
    S = 8
    # value = identity makes the output the dropped, rescaled weight matrix itself.
    case = make_case(dtype, Hq=4, T=8, S=S, Dk=S, dropout_p=0.5, seed=13)
    eye = np.broadcast_to(np.eye(S), case.value.shape).astype(case.value.dtype)
    case = case.replace(value=np.ascontiguousarray(eye))
    if not adapter.declaration.dropout:
        with pytest.raises(NotApplicable):
            adapter.forward(case)
        return
    a = np.asarray(adapter.forward(case), dtype=np.float64)
    assert np.array_equal(a, adapter.forward(case)), "same seed, different dropout"
    assert not np.array_equal(a, adapter.forward(case.replace(seed=14))), "seed has no effect"
    p, _ = _weights(case.replace(dropout_p=0.0), "top-left", "zeros")
    kept = a != 0
    assert 0.3 < kept.mean() < 0.7, f"kept fraction {kept.mean():.2f} for dropout_p=0.5"
    tol = fwd_tol(adapter, dtype)
    assert_close(np.where(kept, a, 0), np.where(kept, p / 0.5, 0), tol, "kept weights scaled by 1/(1-p)")
    if adapter.declaration.grad:
        g = np.random.default_rng(15).standard_normal(case.out_shape).astype(np_dtype(dtype))
        _, _, dv = adapter.vjp(case, g)
        # dv = A^T g only if the backward drops exactly what the forward dropped.
        assert_close(dv, np.swapaxes(a, -1, -2) @ g.astype(np.float64), grad_tol(adapter, dtype), "dv mask")


def test_deterministic(adapter):
    if not adapter.declaration.deterministic:
        pytest.skip(f"{adapter.name} declares no determinism")
    for dtype in sorted(adapter.declaration.dtypes):
        case = make_case(dtype, B=2, Hq=2, T=64, S=96, Dk=64, seed=16)
        assert np.array_equal(adapter.forward(case), adapter.forward(case)), f"{dtype} forward differs"
        if adapter.declaration.grad:
            g = np.random.default_rng(17).standard_normal(case.out_shape).astype(np_dtype(dtype))
            for x, y in zip(adapter.vjp(case, g), adapter.vjp(case, g)):
                assert np.array_equal(x, y), f"{dtype} vjp differs"


@pytest.mark.parametrize("T,S,D", [(5, 7, 16), (128, 300, 64)])
def test_batch_invariant(adapter, T, S, D):
    if not adapter.declaration.batch_invariant:
        pytest.skip(f"{adapter.name} declares no batch invariance")
    for dtype in sorted(adapter.declaration.dtypes):
        case = make_case(dtype, B=4, T=T, S=S, Dk=D, seed=18)
        whole = adapter.forward(case)
        for i in range(case.B):
            alone = adapter.forward(
                case.replace(query=case.query[i : i + 1], key=case.key[i : i + 1], value=case.value[i : i + 1])
            )
            assert np.array_equal(alone[0], whole[i]), f"{dtype} batch item {i} differs alone"


# ---------------------------------------------------------------------------------------------
# Input validation


def _invalid_cases(adapter) -> dict[str, Case]:
    dtype = working_dtype(adapter)
    base = make_case(dtype, Hq=2, T=16, S=16, Dk=64)
    rng = np.random.default_rng(19)
    dt = np_dtype(dtype)
    return {
        "query batch != key batch": base.replace(query=base.query[:1]),
        "key S != value S": base.replace(value=rng.standard_normal((2, 2, 12, 64)).astype(dt)),
        "Hq not a multiple of Hkv": base.replace(query=rng.standard_normal((2, 3, 16, 64)).astype(dt)),
        "query Dk != key Dk": base.replace(query=rng.standard_normal((2, 2, 16, 32)).astype(dt)),
        "integer q, k, v": base.replace(
            query=base.query.astype(np.int32), key=base.key.astype(np.int32), value=base.value.astype(np.int32)
        ),
        "empty query length T = 0": base.replace(query=base.query[:, :, :0]),
    }


def _precondition_inputs(adapter) -> dict[str, list[tuple[str, Case]]]:
    """Inputs that each break one precondition of 000 §8 (``contract.PRECONDITIONS``), by name, in the
    adapter's working dtype; a precondition about a capability the adapter does not declare (the GQA flag,
    a boolean mask, dropout) is left out, as its clause is."""
    decl = adapter.declaration
    dtype = working_dtype(adapter)
    dt = np_dtype(dtype)
    base = make_case(dtype, Hq=2, T=16, S=16, Dk=64)
    rng = np.random.default_rng(19)
    cut = np.ascontiguousarray

    def noise(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dt)

    ints = {n: getattr(base, n).astype(np.int32) for n in ("query", "key", "value")}
    other = np.float32 if dtype == "float64" else np.float64
    one_kv = {"key": cut(base.key[:1]), "value": cut(base.value[:1])}
    inputs = {
        "rank": [
            ("query is 3-D", base.replace(query=cut(base.query[0]))),
            ("key is 5-D", base.replace(key=cut(base.key[None]))),
        ],
        "integer": [("integer q, k, v", base.replace(**ints))],
        "mixed-dtype": [("key in another float dtype", base.replace(key=base.key.astype(other)))],
        "batch": [
            ("query batch 1 against key batch 2", base.replace(query=cut(base.query[:1]))),
            ("key and value batch 1 against query batch 2", base.replace(**one_kv)),
        ],
        "heads": [("Hq 3 against Hkv 2", base.replace(query=noise(2, 3, 16, 64)))],
        "feature": [("query Dk 32 against key Dk 64", base.replace(query=noise(2, 2, 16, 32)))],
        "kv-length": [("value S 12 against key S 16", base.replace(value=noise(2, 2, 12, 64)))],
    }
    if decl.gqa and decl.gqa_flag:
        inputs["gqa-flag"] = [("Hq 4 against Hkv 2, enable_gqa=False", make_case(dtype, Hq=4, Hkv=2, enable_gqa=False))]
    if decl.bool_mask:
        rows = rng.random((16, 16)) < 0.3
        rows[:, 0] = False
        padding = rng.random((2, 16)) < 0.3
        padding[:, 0] = False
        larger = cut(np.broadcast_to(rows, (2, 2, 2, 16, 16)))
        inputs["mask-shape"] = [("[B, S] padding mask as is", base.replace(mask=padding))]
        inputs["mask-larger"] = [("[2, B, H, T, S] mask", base.replace(mask=larger))]
    if decl.dropout:
        inputs["dropout-range"] = [
            ("dropout_p -0.1", base.replace(dropout_p=-0.1)),
            ("dropout_p 1.5", base.replace(dropout_p=1.5)),
        ]
    return inputs


def _known_causes(adapter) -> list:
    """The causes of the adapter's own expectations file that hold for the installed release."""
    from conformance.harness.records import expectations

    path = expectations.default_file(adapter.name)
    return [] if path is None else expectations.in_release(expectations.load(path), adapter)[0]


def test_validates_inputs(adapter):
    """What each built-in does with each input 000 §8 rules out, measured: an input it answers (or
    declines with NotApplicable, which no precondition clause counts as a refusal) is either declared,
    its precondition named in ``accepts_invalid`` (the library's documented, deliberate behaviour), or a
    known bug, a cause of its expectations file whose features the input has; and a precondition it
    declares accepting is not refused with an error on every input tried (the declaration would be stale).
    ``validates_inputs=False`` declares that nothing is checked: then some input must be answered."""
    from conformance.harness.cases import features

    decl = adapter.declaration
    causes = _known_causes(adapter)
    outcomes: dict[str, dict[str, str]] = {}
    unexplained = []
    for name, inputs in _precondition_inputs(adapter).items():
        for what, case in inputs:
            try:
                adapter.forward(case)
                outcome = "accepted"
            except NotApplicable:
                outcome = "declined"
            except Exception:  # noqa: BLE001 - any error is a refusal here; its class: test_rejection_classes_...
                outcome = "raised"
            outcomes.setdefault(name, {})[what] = outcome
            if outcome == "raised" or not decl.validates_inputs or name in decl.accepts_invalid:
                continue
            feats = features.split(features.key(case) or "")
            if not any(c.shows_on(feats) for c in causes):
                unexplained.append(f"{name} ({what}: {outcome})")
    if not decl.validates_inputs:
        assert any(o != "raised" for o in (o for per in outcomes.values() for o in per.values())), (
            f"declares validates_inputs=False, yet refused every invalid input: {outcomes}"
        )
        return
    assert not unexplained, (
        f"answered or declined invalid inputs neither declared (accepts_invalid={sorted(decl.accepts_invalid)}) "
        f"nor a known cause of its expectations file: {unexplained}"
    )
    stale = [n for n in decl.accepts_invalid if n in outcomes and set(outcomes[n].values()) == {"raised"}]
    assert not stale, f"declares accepts_invalid={stale}, but refused every such input: {outcomes}"


def test_rejection_classes_are_declared(adapter):
    """Every error an adapter raises for an invalid input is of a class its ``rejects_with``
    declares (the rejection clauses count no other), and a head ratio that is not an integer is
    rejected, not refused with NotApplicable, by every adapter that declares GQA (GQA-RATIO-04)."""
    declared = set(adapter.declaration.rejects_with)
    undeclared = {}
    for what, case in _invalid_cases(adapter).items():
        try:
            adapter.forward(case)
        except NotApplicable as exc:
            if what == "Hq not a multiple of Hkv" and adapter.declaration.gqa:
                undeclared[what] = f"NotApplicable({exc})"
        except Exception as exc:  # noqa: BLE001 - the class is what is measured
            mro = type(exc).__mro__
            names = {c.__name__ for c in mro} | {f"{c.__module__}.{c.__qualname__}" for c in mro}
            if not names & declared:
                undeclared[what] = f"{type(exc).__module__}.{type(exc).__name__}({str(exc)[:80]})"
    assert not undeclared, f"rejects_with={sorted(declared)}, but raised: {undeclared}"


# ---------------------------------------------------------------------------------------------
# Import safety and refusal reasons (CPU-only facts)


def test_cuda_adapters_say_why_they_cannot_run():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    mod = importlib.import_module("implementations.torch_sdpa")
    for attr in ("cuda_default", "cuda_flash", "cuda_efficient", "cuda_cudnn", "cuda_math"):
        reason = getattr(mod, attr).unavailable_reason()
        assert reason and "CUDA" in reason, f"{attr}: {reason!r}"


def test_cpu_flash_refusal_carries_torchs_reason():
    flash = _load("torch_sdpa", "cpu_flash", "torch")
    with pytest.raises(NotApplicable, match="dropout"):
        flash.forward(make_case("float32", dropout_p=0.25))
    with pytest.raises(NotApplicable, match="same last dimension"):
        flash.forward(make_case("float32", Dk=16, Dv=32))


def test_jax_float16_runs_on_cpu_unjitted():
    """jit + float16 does not compile on CPU; the adapter runs it op by op and stays correct."""
    xla = _load("jax_attention", "xla", "jax")
    case = make_case("float16", T=16, S=16, Dk=64)
    out = xla.forward(case)
    assert out.dtype == np.float16
    assert_close(out, reference(case), FWD_TOL["float16"], "jax float16")


def test_jax_float64_is_not_silently_float32():
    """Without jax_enable_x64, jax would turn float64 inputs into float32 and return float32."""
    xla = _load("jax_attention", "xla", "jax")
    import jax

    case = make_case("float64")
    assert xla.forward(case).dtype == np.float64
    assert not jax.config.jax_enable_x64, "the adapter must scope x64, not switch it on globally"


def test_jax_bfloat16_t_and_s_of_1_runs_eagerly_and_correctly_on_cpu():
    """XLA CPU cannot compile the jitted bfloat16 call with T == S == 1 (ALG_DOT_BF16_BF16_F32); the
    adapter runs that case op by op, as a user would, instead of refusing it. If the jitted call starts
    to compile, the bug is fixed and the module docstring should say so."""
    xla = _load("jax_attention", "xla", "jax")
    import jax

    from implementations.jax_attention import _attention_jit

    if jax.default_backend() != "cpu":
        pytest.skip("a CPU-only XLA bug")
    case = make_case("bfloat16", B=1, Hq=1, T=1, S=1, Dk=8)
    with jax.enable_x64(True), pytest.raises(Exception, match="BF16_BF16_F32"):
        args, static = xla._args(case)
        _attention_jit(*args, **static)
    out = xla.forward(case)  # one key: the output is that key's value, exactly
    np.testing.assert_array_equal(out.astype(np.float64), np.asarray(case.value, dtype=np.float64))


def test_keras_backends_return_float32_for_float64_side_by_side():
    """The three keras backends run side by side in one process, and none has float64 attention: keras
    casts 64-bit floats to float32 (keras.src.backend.common.dtypes.BIT64_TO_BIT32_DTYPE), which is why
    the keras adapters declare no float64. If a release keeps float64, this fails: declare it then."""
    x = np.random.default_rng(20).standard_normal((1, 4, 2, 8))  # keras's [B, T, N, H], float64
    outs = {}
    for module, attr in (("keras_numpy", "keras_numpy"), ("keras_jax", "keras_jax"), ("keras_torch", "keras_torch")):
        _load(module, attr, "keras")
        nn = importlib.import_module(f"implementations.{module}")._nn
        if module == "keras_jax":
            import jax

            with jax.enable_x64(True):
                a = jax.numpy.asarray(x)
                outs[module] = np.asarray(nn.dot_product_attention(a, a, a))
        elif module == "keras_torch":
            import torch

            t = torch.from_numpy(x)
            outs[module] = nn.dot_product_attention(t, t, t).numpy()
        else:
            outs[module] = np.asarray(nn.dot_product_attention(x, x, x))
    for module, out in outs.items():
        assert out.dtype == np.float32, f"{module}: float64 in gave {out.dtype}: keras computes float64 now"
    ref = outs["keras_numpy"]
    for module, out in outs.items():
        assert max_err(out, ref.astype(np.float64)) < 2e-5, f"{module} disagrees with keras-numpy side by side"

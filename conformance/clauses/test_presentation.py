"""The same numbers, handed over another way, give the same answer: memory, identity, gradients asked, context.

003 §工程实现 names the input layout among the first things to check when a result is off ("先核对实际
backend 和输入布局"), and 000 §8 asks of the kernel only that Q, K, V be tensors of the right shapes,
dtype and values: how they reach it (a view into a larger buffer, one object given for the query and the
key, which of them ask for a gradient, the autograd context of the call, a second backward over one
graph, the layout of the incoming gradient) is not part of the question, so it may not change the
answer. Each clause takes one small case, hands it over in every way the adapter presents
(``Declaration.presents``) and holds every answer to the oracle and to the plain presentation's answer:
bitwise where the kernel declares ``layout_invariant`` (the same numbers in any memory give the same bits), within
twice the error model otherwise (a second backward over one graph, on the same memory: bitwise where it declares
``deterministic``). The
covering array meets each of these ways in pairs with the value classes (COVER-PAIRS-*); these clauses
walk them all on one case, so a kernel keyed on one of them fails here by name.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.test_gradients import cotangent
from conformance.clauses.test_inputs import LAYOUT, projection_view
from conformance.contract import Case, Presentation
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.covering.build import at_alignment, offset_view
from conformance.harness.covering.build import cotangent as cotangent_in
from conformance.harness.judge import compare, dropout_replay
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation, mismatch_report

QKV = Source("000", "§8 最小 PyTorch 实现", "要求 Q、K、V 是同设备、同 dtype 的有限浮点张量，batch 和 head 数一致")
BACKWARD = Source("003", "逐步推导", "反向传播需要用到 Softmax 输出或等价统计量。")


def _presented(impl: GuardedAdapter, attribute: str) -> None:
    if attribute not in impl.declaration.presents:
        impl.not_applicable(f"the adapter does not present {attribute} to its kernel (Declaration.presents)")


def _bases(impl: GuardedAdapter, dtype: str, *, self_attention: bool = False, seed: int = 4100) -> list[Case]:
    """Small cases the presentation must not change: one with a key padding mask, one causal (apart, so that a
    library that drops one of the two when both are given shows its own known cause elsewhere, not here)."""
    decl = impl.declaration
    T, S = (5, 5) if self_attention else (4, 7)
    plain = random_case(seed, B=2, Hq=2, T=T, S=S, Dk=8, dtype=dtype, label="plain")
    cases = []
    if decl.bool_mask:
        mask = random_mask(seed, (2, 1, 1, S), p_blocked=0.3)
        mask[..., 0] = False  # every row sees a key: no fill policy in question
        cases.append(plain.replace(mask=mask, label="plain, padding mask"))
    if decl.causal:
        cases.append(plain.replace(is_causal=True, label="plain, causal"))
    cases = [c for c in cases if impl.supports(c)] or [plain]
    impl.require(cases[0])
    return cases


def _same(
    impl: GuardedAdapter,
    what: str,
    got: np.ndarray,
    want: np.ndarray,
    case: Case,
    plain: Case,
    *,
    same_memory: bool = False,
    gradient: bool = False,
) -> None:
    """``got`` (the case as presented) against ``want`` (the plain presentation's answer): bitwise where the kernel
    claims it (``layout_invariant``: the same numbers in any memory give the same bits; ``deterministic`` where the
    two calls ran on the same memory, ``same_memory``), within the sum of the two cases' allowances otherwise.

    Bits are not asked for by default: 003 says exact attention is not bitwise ("“精确注意力”不表示逐 bit 相同"),
    and a correct SIMD or GEMM path picks its blocking by alignment and layout, so the same numbers at another
    address may round otherwise in the last place. The error model still catches every presentation that changes
    the answer."""
    decl = impl.declaration
    bitwise = decl.deterministic and (same_memory or decl.layout_invariant)
    if bitwise:
        a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if not np.array_equal(a, b, equal_nan=True):
            n = int(np.count_nonzero(~((a == b) | (np.isnan(a) & np.isnan(b)))))
            err = float(np.nanmax(np.abs(a - b))) if n else 0.0
            claim = (
                "declares itself deterministic, so a second backward over the same memory must give the same bits"
                if same_memory
                else "declares layout_invariant=true, so the same numbers must give the same bits however they are "
                "handed over (drop the claim if only same-memory repeats are bitwise: --declare layout_invariant=false)"
            )
            raise ClauseViolation(
                f"{what} differs from the plain presentation's in {n} of {a.size} elements (max |diff| {err:.3g}); "
                f"a bitwise rule, not the error model: the kernel {claim}",
                case,
            )
        return
    if gradient:
        return  # a gradient: each was held to the oracle's VJP within its allowance, which bounds their distance
    allowed = compare.pair_allowance(case, plain, decl)
    msg = mismatch_report(f"{what} vs the plain presentation", got, want, allowed, "sum of the two allowances")
    if msg:
        raise ClauseViolation(msg, case)


def _forward_all(impl: GuardedAdapter, plain: Case, variants: list[Case]) -> None:
    want = compare.assert_output_matches(impl, plain)
    for case in variants:
        got = compare.assert_output_matches(impl, case)
        _same(impl, f"the output ({case.label})", got, want, case, plain)


def _backward_all(
    impl: GuardedAdapter,
    plain: Case,
    variants: list[tuple[Case, np.ndarray]],
    g: np.ndarray,
    *,
    same_memory: bool = False,
) -> None:
    want = compare.assert_vjp_matches(impl, plain, g)
    for case, grad_out in variants:
        got = compare.assert_vjp_matches(impl, case, grad_out)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            if a is not None:
                _same(impl, f"{name} ({case.label})", a, b, case, plain, same_memory=same_memory, gradient=True)


@clause(
    "PRESENT-MEMORY-01",
    "Q, K, V (each alone and all three) as transposed views, as views into a larger buffer at an offset, starting "
    "1 to 12 elements past a 64-byte boundary, as views into one packed QKV buffer, and the mask as a view (at an "
    "offset, off a 64-byte boundary, a mask with a row per query sliced from a wider one, alone and beside "
    "dropout, float64 as the default dtype or inference mode); and the backward's "
    "incoming gradient as a transposed, expanded or offset view: every answer the plain one's",
    LAYOUT,
    kills=[
        "call_alignment_dependent_values",
        "call_mask_rows_assumed_dense",
        "call_offset_misread",
        "call_strides_assumed_contiguous",
        "call_packed_qkv_assumed",
        "call_cotangent_strides",
    ],
)
def test_memory(impl, dtype):
    _presented(impl, "memory")
    for plain in _bases(impl, dtype):
        _memory(impl, plain)


def _pitched_companions(impl: GuardedAdapter, plain: Case) -> list[Case]:
    """A per-query mask (rows S + 5 apart once sliced) beside each other thing a caller's call may hold, where a
    covering row holding the pair may hide what a kernel does with the pitch: dropout (the replayed mask, same
    seed), the caller's default dtype float64, inference mode. Each as the kernel's declaration and presentation
    take it. Not causal: a library that drops one of a mask and causal given together shows that known cause
    in the clauses about it, not here (as ``_bases`` keeps them apart)."""
    decl = impl.declaration
    square = random_case(4104, B=2, Hq=2, T=5, S=5, Dk=8, dtype=plain.dtype, label="plain 5 x 5")
    rows = random_mask(4104, (square.B, 1, square.T, square.S), p_blocked=0.3)
    rows[..., 0] = False  # every row sees its first key: no fill policy in question
    base = square.replace(mask=rows, label="a mask with a row per query [B, 1, T, S]")
    base = base.replace(**_aligned(base))  # on a 64-byte boundary, as the plain presentation: the same on any host
    out = []
    if decl.dropout:
        out.append(base.replace(dropout_p=0.5, seed=4105, label=f"{base.label}, dropout 0.5"))
    if "default_dtype" in decl.presents:
        pres = Presentation(default_dtype="float64")
        out.append(base.replace(presentation=pres, label=f"{base.label}, float64 the default dtype"))
    if "grad_mode" in decl.presents:
        pres = Presentation(grad_mode="inference")
        out.append(base.replace(presentation=pres, label=f"{base.label}, inference mode"))
    return [c for c in out if impl.supports(c)]


# Element offsets past a 64-byte boundary for Q, K and V: the first triple is aligned to no vector width, the
# second to 16 bytes in float32 but not to 32 or 64 (the widths AVX2 and AVX-512 paths block by).
_MISALIGNED = ((1, 2, 3), (4, 8, 12))


def _aligned(plain: Case, offsets: tuple[int, int, int] = (0, 0, 0), mask_offset: int = 0) -> dict:
    """Q, K, V (and the mask) as copies whose data start the given number of elements past a 64-byte boundary."""
    arrays = {n: at_alignment(getattr(plain, n), k * getattr(plain, n).itemsize) for n, k in zip(_QKV, offsets)}
    if plain.mask is not None:
        arrays["mask"] = at_alignment(plain.mask, mask_offset)
    return arrays


_QKV = ("query", "key", "value")


def _memory(impl: GuardedAdapter, plain: Case) -> None:
    # The plain presentation at a 64-byte boundary, so that the misaligned ones below differ from it by the address
    # alone on any host, whatever alignment the allocator happened to give.
    plain = plain.replace(**_aligned(plain))
    variants = [
        plain.replace(
            **_aligned(plain, offsets, mask_offset=1),
            label=f"Q, K, V starting {', '.join(map(str, offsets))} elements past a 64-byte boundary",
        )
        for offsets in _MISALIGNED
    ]
    for how, view in (("transposed view", projection_view), ("offset into a larger buffer", offset_view)):
        for name in ("query", "key", "value"):
            variants.append(plain.replace(**{name: view(getattr(plain, name))}, label=f"{name} as a {how}"))
        variants.append(
            plain.replace(**{n: view(getattr(plain, n)) for n in ("query", "key", "value")}, label=f"Q, K, V as {how}s")
        )
    buf = np.concatenate([plain.query, plain.key, plain.value], axis=2)  # one buffer, as a fused projection writes
    T, S = plain.T, plain.S
    variants.append(
        plain.replace(
            query=buf[:, :, :T],
            key=buf[:, :, T : T + S],
            value=buf[:, :, T + S :],
            label="Q, K, V views into one buffer",
        )
    )
    if plain.mask is not None:
        variants.append(
            plain.replace(mask=offset_view(np.ascontiguousarray(plain.mask)), label="the mask as a view at an offset")
        )
    _forward_all(impl, plain, variants)
    if plain.mask is not None and plain.T > 1:
        # A mask with a row per query, sliced from a wider one: its rows are S + 5 elements apart, not S. Two such
        # masks one after the other (a decoder's steps), so that an answer the second call overwrites is seen.
        for seed in (4102, 4103):
            rows = random_mask(seed, (plain.B, 1, plain.T, plain.S), p_blocked=0.3)
            rows[..., 0] = False
            per_row = plain.replace(mask=rows, label="a mask with a row per query [B, 1, T, S]")
            label = "that mask sliced from a wider one (row pitch S + 5)"
            _forward_all(impl, per_row, [per_row.replace(mask=offset_view(rows), label=label)])
        for per_row in _pitched_companions(impl, plain):
            pitched = per_row.replace(mask=offset_view(per_row.mask), label=f"{per_row.label}, row pitch S + 5")
            judge = dropout_replay.assert_output_matches if per_row.dropout_p else compare.assert_output_matches
            want = judge(impl, per_row)
            _same(impl, f"the output ({pitched.label})", judge(impl, pitched), want, pitched, per_row)
    if impl.declaration.grad:
        g = cotangent(plain, 4101)
        forms = ("transposed view", "offset into a larger buffer")
        back = [(plain.replace(label=f"the incoming gradient as a {f}"), cotangent_in(f, g)) for f in forms]
        _backward_all(impl, plain, back + [(c, g) for c in variants], g)
        # an expanded cotangent (its first query row for every row, as out.sum() gives) has other values
        expanded = plain.replace(label="the incoming gradient expanded along the queries")
        compare.assert_vjp_matches(impl, expanded, cotangent_in("expanded", g))


@clause(
    "PRESENT-IDENTITY-02",
    "one object given for the query and the key (self-attention), for the key and the value, or for all three gives "
    "the answer of distinct objects with the same values; its gradient is the sum of its arguments' parts",
    QKV,
    kills=["call_self_attention_fast_path", "call_key_is_value_path"],
)
def test_identity(impl, dtype):
    _presented(impl, "identity")
    for plain in _bases(impl, dtype, self_attention=True, seed=4110):
        _identity(impl, plain)


def _identity(impl: GuardedAdapter, plain: Case) -> None:
    q = plain.query
    twins = {  # distinct objects with the values of the one object, and the one object itself
        "query is key": (plain.replace(key=q.copy()), plain.replace(key=q)),
        "key is value": (plain.replace(value=plain.key.copy()), plain.replace(value=plain.key)),
        "query, key and value one object": (plain.replace(key=q.copy(), value=q.copy()), plain.replace(key=q, value=q)),
    }
    for how, (distinct, one) in twins.items():
        distinct, one = distinct.replace(label=f"{how}: distinct copies"), one.replace(label=how)
        want = compare.assert_output_matches(impl, distinct)
        _same(impl, f"the output ({how})", compare.assert_output_matches(impl, one), want, one, distinct)
        if impl.declaration.grad and "requires_grad" in impl.declaration.presents:
            compare.assert_vjp_matches(impl, one, cotangent(one, 4111))  # the oracle's parts, summed per object


_SUBSETS = (
    ("query",),
    ("key",),
    ("value",),
    ("query", "key"),
    ("query", "value"),
    ("key", "value"),
    ("query", "key", "value"),
)


@clause(
    "PRESENT-GRAD-03",
    "whichever inputs ask for a gradient (each subset of Q, K, V, and the additive M), the forward under autograd is "
    "the plain forward's, on the graph, and every input that asked gets its gradient, the full backward's",
    BACKWARD,
    kills=[
        "call_grad_subset_query",
        "call_grad_subset_key",
        "call_grad_subset_value",
        "call_grad_subset_query_key",
        "call_grad_subset_query_value",
        "call_grad_subset_key_value",
        "call_grad_only_if_all_ask",
        "call_mask_gradient_dropped",
    ],
)
def test_requires_grad(impl, dtype):
    _presented(impl, "requires_grad")
    for plain in _bases(impl, dtype, seed=4120):
        _requires_grad(impl, plain)


def _requires_grad(impl: GuardedAdapter, plain: Case) -> None:
    forward = [
        plain.replace(
            presentation=Presentation(frozenset(s), grad_mode="grad"), label=f"forward, {', '.join(s)} asking"
        )
        for s in _SUBSETS
    ]
    _forward_all(impl, plain, forward)
    if not impl.declaration.grad:
        return
    g = cotangent(plain, 4121)
    _backward_all(
        impl,
        plain,
        [
            (
                c.replace(
                    presentation=Presentation(c.presentation.requires_grad),
                    label=c.label.replace("forward", "backward"),
                ),
                g,
            )
            for c in forward[:-1]
        ],
        g,
    )
    decl = impl.declaration
    if decl.bias_grad and decl.float_mask:
        bias = np.random.default_rng(4122).standard_normal((plain.B, 1, plain.T, plain.S))
        with_m = plain.replace(
            bias=bias, presentation=Presentation(frozenset({"query", "key", "value", "bias"})), label="M asking too"
        )
        compare.assert_vjp_matches(impl, with_m, g)


@clause(
    "PRESENT-CONTEXT-04",
    "the forward under torch.no_grad, under autograd with nothing asking, under inference mode and with float64 made "
    "the process's default dtype gives the plain answer, in the input dtype; with one thread or three, and with a "
    "half-precision case's M in the input dtype or in float32, the oracle's",
    QKV,
    kills=[
        "call_training_path",
        "call_inference_path",
        "call_default_dtype_output",
        "call_threads_split_heads",
        "call_mask_dtype_promotes",
        # process state left changed: the guarded call of every clause catches these; this clause's forward
        # under autograd without a context manager of the suite's own is where grad mode left off shows
        "call_leaves_grad_mode_off",
        "call_leaves_default_dtype",
        "call_leaves_global_rng_drawn",
        "call_leaves_thread_count",
        "call_leaves_matmul_precision",
        "call_leaves_numpy_error_state",
    ],
)
def test_context(impl, dtype):
    decl = impl.declaration
    modes = (
        [("grad", "autograd on, nothing asking"), ("inference", "inference mode")]
        if "grad_mode" in decl.presents
        else []
    )
    if not modes and "default_dtype" not in decl.presents:
        impl.not_applicable(
            "the adapter presents neither grad_mode nor default_dtype to its kernel (Declaration.presents)"
        )
    for plain in _bases(impl, dtype, seed=4130):
        variants = [plain.replace(presentation=Presentation(grad_mode=m), label=f"forward under {w}") for m, w in modes]
        if "default_dtype" in decl.presents:
            variants.append(
                plain.replace(presentation=Presentation(default_dtype="float64"), label="float64 the default dtype")
            )
        _forward_all(impl, plain, variants)
        if "threads" in decl.presents:  # another split of the work: judged against the oracle, not bitwise
            for n in (1, 3):
                compare.assert_output_matches(
                    impl, plain.replace(presentation=Presentation(threads=n), label=f"{n} thread(s)")
                )
    if "bias_dtype" in decl.presents and decl.float_mask and dtype in ("float16", "bfloat16"):
        with_m = _bases(impl, dtype, seed=4131)[0]
        bias = np.random.default_rng(4131).standard_normal((with_m.B, 1, with_m.T, with_m.S))
        for held_in in ("query", "float32"):  # M rounded to the input dtype, or exact: each judged by the oracle
            compare.assert_output_matches(
                impl, with_m.replace(bias=bias, presentation=Presentation(bias_dtype=held_in), label=f"M in {held_in}")
            )


@clause(
    "PRESENT-BACKWARD-05",
    "a second backward over the same graph gives the first one's gradients (nothing the backward saved is written)",
    BACKWARD,
    requires=["grad"],
    kills=["call_second_backward"],
)
def test_second_backward(impl, dtype):
    _presented(impl, "backward")
    plain = random_case(4140, B=2, Hq=2, T=4, S=6, Dk=8, dtype=dtype, label="plain")  # no mask: a fused path's own
    impl.require(plain)
    g = cotangent(plain, 4141)
    _backward_all(
        impl,
        plain,
        [(plain.replace(presentation=Presentation(backward="twice"), label="the second backward over one graph"), g)],
        g,
        same_memory=True,
    )

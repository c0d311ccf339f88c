"""The caller's switches and threads, and the Python types of scalar arguments, do not change the answer.

A kernel runs inside its caller's program, under whatever the caller switched on: a backend flag, a forced SDP
backend (003 §工程实现: "PyTorch 的 scaled_dot_product_attention 会根据输入和平台选择可用后端"), deterministic
algorithms, a lower float32 matmul precision, autocast (000 §8 guards its own products against it: "禁用外层
autocast 对这里矩阵乘法的降精度"), anomaly detection, flushed subnormals, saved-tensor hooks, activation
checkpointing, another thread or several at once; jax's default matmul precision, its 64-bit mode, jax.jit
disabled. A kernel keyed on one of them (a fallback that takes another path) must still answer the question the
values ask. The adapter names the contexts it applies (``contexts()``: for torch, generated from torch's API,
implementations/_torch_contexts.py; for jax, implementations/jax_attention.py), and the clause walks every one.

Where a switch changes the precision the caller asked for, the answer is judged at that precision, as the
switch's documentation states it: autocast to bfloat16 (float16) and a float32 matmul precision of "medium" judge
a float32 case as computed in bfloat16 (``float32_computed_as``), "high" as computed in TF32; everything else at
the case's own. A call the framework itself refuses under a context in its own words (a forced backend that
cannot take the inputs: "No available kernel") is not applicable for that context: recorded with torch's
reason, never a failure of the kernel.

ARGS-SCALAR-TYPES-01 hands each scalar argument over in the Python types callers use (``scale=2`` an int, a
numpy.float64 or numpy.float32 from a config, a 0-d tensor; ``is_causal`` a numpy.bool_ or 1; ``dropout_p=0``;
``enable_gqa`` a numpy.bool_ or 1): each gives the plain form's answer (bitwise for a deterministic kernel, on
the same memory), or is refused with an error of a declared class (``rejects_with``: torch's SDPA takes only a
bool for ``is_causal``), which is recorded, not failed.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from conformance.clauses.test_gradients import cotangent
from conformance.contract import SCALAR_FORMS, Case, ContextRefused, Presentation
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare, rejection, switches
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import AdapterError, ClauseViolation

BACKENDS = Source(
    "003",
    "工程实现",
    (
        "PyTorch 的 scaled_dot_product_attention 会根据输入和平台选择可用后端，包括数学实现、memory-efficient 实现和 "
        "FlashAttention 类后端。",
        "若结果异常，先核对实际 backend 和输入布局，再看 kernel 本身。",
    ),
)
QKV = Source("000", "§8 最小 PyTorch 实现", "要求 Q、K、V 是同设备、同 dtype 的有限浮点张量，batch 和 head 数一致")
SCALE = Source("000", "§2 从单个 Query 到公式", "第二步，除以 $\\sqrt{d_k}$ 并做 softmax")


def _judge(impl: GuardedAdapter, context: str, case: Case, g: np.ndarray | None = None) -> None:
    """The kernel's answer to ``case`` under ``context`` (called once), right under one of the readings the switch
    allows (harness.judge.switches)."""
    switches.assert_matches(impl, case, g)


def _contexts(impl: GuardedAdapter) -> tuple[str, ...]:
    if "context" not in impl.declaration.presents:
        impl.not_applicable("the adapter does not present a caller's context to its kernel (Declaration.presents)")
    names = switches.offered_by(impl)
    if not names:
        impl.not_applicable("the adapter names no caller's context it can apply (contexts())")
    return names


def _bases(impl: GuardedAdapter, dtype: str, seed: int) -> tuple[list[Case], Case]:
    """(forward bases, backward base): a key padding mask and an additive M (or causal, without float masks) for
    the forward, causal for the backward; small, every row sees a key; each feature apart, so that a library that
    drops one of two when both are given shows its own known cause elsewhere, not here."""
    plain = random_case(seed, B=2, Hq=2, T=4, S=7, Dk=8, dtype=dtype, label="plain")
    mask = random_mask(seed, (2, 1, 1, 7), p_blocked=0.3)
    mask[..., 0] = False
    bias = np.random.default_rng(seed + 1).standard_normal((2, 1, 4, 7))
    padded = plain.replace(mask=mask, label="padding mask")
    added = plain.replace(bias=bias, label="additive M")
    causal = plain.replace(is_causal=True, label="causal")
    forward = [c for c in (padded, added if impl.supports(added) else causal) if impl.supports(c)] or [plain]
    impl.require(forward[0])
    backward = next((c for c in (causal, added, padded) if impl.supports(c)), forward[0])
    return forward, backward


def _refused(impl: GuardedAdapter, context: str, exc: ContextRefused) -> None:
    impl.rejected.append(f"not applicable under {context}: {exc}")


@clause(
    "CONTEXT-SWITCHES-01",
    "under every caller's context the adapter applies (torch: each backend flag flipped, each SDP backend forced, "
    "deterministic algorithms, float32 matmul precision high and medium, autocast, anomaly mode, flushed "
    "subnormals, saved-tensor hooks that copy, activation checkpointing; jax: the default matmul precision at "
    "tensorfloat32 and bfloat16, the 64-bit mode off, jit disabled), the forward and the backward are the "
    "oracle's within the error model at the precision the switch asks for; a call the framework refuses under a "
    "context in its own words is not applicable there",
    BACKENDS,
    kills=[
        "context_deterministic_backward",
        "context_matmul_precision_scale",
        "context_math_fallback",
        "context_autocast_drops_mask",
        "context_anomaly_path",
        "context_flush_denormal_path",
        "context_saved_hooks_backward",
        "context_checkpoint_recompute",
        "jax_x64_off_drops_mask@float32",
        "jax_jit_off_forgets_scale@float32",
        "jax_matmul_precision_drops_bias@float32",
    ],
)
def test_switches(impl, dtype):
    names = [n for n in _contexts(impl) if n != "thread"]
    bases, back = _bases(impl, dtype, 4300)
    grad = impl.declaration.grad
    g = cotangent(back, 4301) if grad else None
    ran = 0
    for context in names:
        if not switches.applies(context, dtype):
            continue
        try:
            for plain in bases:
                case = plain.replace(
                    presentation=Presentation(context=context), label=f"{plain.label}, under {context}"
                )
                _judge(impl, context, case)
            if grad:
                case = back.replace(
                    presentation=Presentation(context=context), label=f"{back.label}, backward under {context}"
                )
                _judge(impl, context, case, g)
        except ContextRefused as exc:
            _refused(impl, context, exc)
            continue
        ran += 1
    if not ran:
        impl.not_applicable(f"the framework refused every context for these cases ({len(names)} tried)")


def _concurrently(impl: GuardedAdapter, cases: list[Case]) -> list[tuple[Any, BaseException | None]]:
    """Each case's forward on its own thread, all started together (a barrier), each joined: (output, error)."""
    results: list[tuple[Any, BaseException | None]] = [(None, None)] * len(cases)
    start = threading.Barrier(len(cases))

    def one(i: int) -> None:
        try:
            start.wait()
            results[i] = (impl.forward(cases[i]), None)
        except BaseException as exc:  # noqa: BLE001 - judged on the caller's thread
            results[i] = (None, exc)

    threads = [threading.Thread(target=one, args=(i,), name=f"sdpa-conformance-{i}") for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@clause(
    "CONTEXT-THREADS-02",
    "a call made from a thread other than the one that imported the kernel, and three calls with different cases "
    "made from three threads at once, each give the oracle's answer to their own case (forward; the backward too "
    "from another thread)",
    QKV,
    kills=["context_thread_fill", "context_shared_scratch"],
)
def test_threads(impl, dtype):
    if "thread" not in _contexts(impl):
        impl.not_applicable("the adapter does not apply a call from another thread (contexts())")
    bases, back = _bases(impl, dtype, 4310)
    for plain in bases:
        compare.assert_output_matches(
            impl, plain.replace(presentation=Presentation(context="thread"), label=f"{plain.label}, another thread")
        )
    if impl.declaration.grad:
        case = back.replace(presentation=Presentation(context="thread"), label="backward from another thread")
        compare.assert_vjp_matches(impl, case, cotangent(case, 4311))
    # three different cases of one shape at once: a kernel whose scratch is shared between calls mixes them up
    many = [
        bases[0].replace(**_values(bases[0], 4312 + i), label=f"{bases[0].label}, thread {i} of 3") for i in range(3)
    ]
    for case, (out, exc) in zip(many, _concurrently(impl, many)):
        if exc is not None:
            raise exc
        compare.assert_close(out, compare.expected(case, impl.declaration).out, case=case, decl=impl.declaration)


def _values(case: Case, seed: int) -> dict[str, Any]:
    """Other Q, K, V (and mask) of ``case``'s shapes and dtype."""
    other = random_case(seed, B=case.B, Hq=case.Hq, Hkv=case.Hkv, T=case.T, S=case.S, Dk=case.Dk, dtype=case.dtype)
    out: dict[str, Any] = {"query": other.query, "key": other.key, "value": other.value}
    if case.mask is not None:
        mask = random_mask(seed, np.shape(case.mask), p_blocked=0.3)
        mask[..., 0] = False
        out["mask"] = mask
    return out


# -- scalar arguments in the Python types callers use ---------------------------------------------------
def _scalar_bases(impl: GuardedAdapter, dtype: str) -> dict[str, list[Case]]:
    """argument -> cases in which the call passes it with a value its forms hold (scale 2 and 1; causal without a
    mask, so that is_causal reaches the kernel as given; grouped heads for enable_gqa)."""
    decl = impl.declaration
    plain = random_case(4320, B=2, Hq=2, T=4, S=6, Dk=8, dtype=dtype, label="plain")
    out: dict[str, list[Case]] = {"scale": [], "is_causal": [], "dropout_p": [], "enable_gqa": []}
    if decl.custom_scale:
        out["scale"] = [plain.replace(scale=2.0, label="scale=2.0"), plain.replace(scale=1.0, label="scale=1.0")]
    if decl.causal:
        out["is_causal"] = [plain.replace(is_causal=True, label="is_causal=True")]
    out["dropout_p"] = [plain.replace(label="dropout_p=0.0")]
    if decl.gqa:
        grouped = random_case(4321, B=2, Hq=4, Hkv=2, T=4, S=6, Dk=8, dtype=dtype, label="enable_gqa=True")
        out["enable_gqa"] = [grouped.replace(enable_gqa=True)]
    return {k: [c for c in v if impl.supports(c)] for k, v in out.items()}


def _bitwise(what: str, got: np.ndarray, want: np.ndarray, case: Case) -> None:
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if not np.array_equal(a, b, equal_nan=True):
        n = int(np.count_nonzero(~((a == b) | (np.isnan(a) & np.isnan(b)))))
        raise ClauseViolation(
            f"{what} differs from the plain float / bool form's in {n} of {a.size} elements (max |diff| "
            f"{float(np.nanmax(np.abs(a - b))):.3g}); the same value in another Python type is the same argument, and "
            "the kernel declares itself deterministic",
            case,
        )


@clause(
    "ARGS-SCALAR-TYPES-01",
    "each scalar argument in each Python type a caller passes it in (scale as an int, numpy.float64, numpy.float32 "
    "or 0-d tensor; is_causal and enable_gqa as numpy.bool_ or 1; dropout_p as an int or numpy.float64) gives the "
    "plain float / bool form's answer (bitwise for a deterministic kernel), or is refused with an error of a "
    "declared class, recorded",
    SCALE,
    kills=["args_int_scale_ignored", "args_numpy_bool_causal_ignored"],
)
def test_scalar_types(impl, dtype):
    if "scalars" not in impl.declaration.presents:
        impl.not_applicable("the adapter does not hand its kernel the caller's scalar types (Declaration.presents)")
    bases = _scalar_bases(impl, dtype)
    if not any(bases.values()):
        impl.not_applicable("the declaration admits no case that passes a scalar argument")
    decl = impl.declaration
    ran = 0
    for form in SCALAR_FORMS:
        arg = form.partition(":")[0]
        for plain in bases[arg]:
            want = compare.assert_output_matches(impl, plain)
            case = plain.replace(presentation=Presentation(scalars=form), label=f"{plain.label}, {arg} as {form}")
            try:
                got = compare.assert_output_matches(impl, case)
            except AdapterError as exc:  # the kernel raised: a rejection of a declared class is its right
                cause = exc.__cause__
                if cause is None or not rejection.documented(cause, decl):
                    raise
                impl.rejected.append(f"{arg} as {form.partition(':')[2]}: {type(cause).__name__}: {cause}"[:300])
                continue
            ran += 1
            if decl.deterministic:
                _bitwise(f"the output ({case.label})", got, want, case)
            else:
                compare.assert_outputs_agree(
                    f"{arg} as {form}", got, want, compare.pair_allowance(case, plain, decl), case=case, decl=decl
                )
    if not ran:
        impl.not_applicable("the kernel refused every other Python type of its scalar arguments (recorded)")

"""The transforms a framework applies to its own ops: forward-mode AD, a double backward, forward-mode AD of the
backward, vmap, vmap of the backward (per-example gradients), fake tensors.

PyTorch checks every op it ships for them (OpInfo's test_ops_gradients: gradcheck and gradgradcheck, the latter
with check_fwd_over_rev in test_fn_fwgrad_bwgrad;
test_ops_fwd_gradients: forward-mode AD; functorch's test_vmap; test_ops.py's fake tensor tests and
``torch.library.opcheck``'s test_faketensor), and jax's ``check_grads`` checks fwd and rev to order 2; a kernel
a user trains goes through the same transforms (a gradient penalty is a double backward, a JVP drives
forward-mode Hessian-vector products, vmap batches per-example work, torch.compile and torch.export trace the
call on fake tensors that carry shape, dtype and device but no data; forward over reverse is how
``torch.func.hessian`` and ``jax.hessian`` compute second derivatives). Each clause asks the kernel through its
adapter (``transforms``, ``jvp``, ``vjp_vjp``, ``jvp_vjp``, ``vmap_forward``, ``vmap_vjp``, ``fake_forward``:
conformance/contract.py) and
judges the answer against the float64 oracle's analytic transform (``oracle.jvp``, ``oracle.vjp_jvp``) under
the running error model of ``harness.judge.transforms``, or (fake tensors) against the case's output shape and
dtype and the real call's.

A kernel that refuses a transform (torch 2.13's CPU ``scaled_dot_product_attention`` raises
NotImplementedError under forward AD: its flash kernel has no forward derivative) is not failed: the
refusal is a measured capability, recorded on the run's transforms line (``harness.run.transforms``) and
the clause is not applicable with the kernel's words. A wrong answer under a transform fails the clause.
The cases are small (B=2, H=2, T=4 or 7, S=7, D=8, a padding mask or causal; no row blocked entirely), in
float64 and float32, where the error model's unit roundoffs are those of the declared computation; under fake
tensors, where no number is computed, in every declared dtype, with grouped heads and Dv != Dk where declared.
"""

from __future__ import annotations

import numpy as np

from conformance.clauses.common import supported
from conformance.clauses.test_gradients import cotangent
from conformance.contract import Case, dtype_name
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import cast, random_case, random_mask, rng_for
from conformance.harness.judge import compare
from conformance.harness.judge import transforms as judge
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation, mismatch_report

CHECK_GRADS = Source(
    "003",
    "工程实现",
    "验证时应固定 B、h、T_q、T_k、d、dtype、is_causal，分别检查输出容差、反向梯度、峰值显存和延迟。",
)
BACKWARD = Source("003", "逐步推导", "反向传播需要用到 Softmax 输出或等价统计量。")
PARALLEL = Source("003", "逐步推导", "矩阵形式只是把所有 i,j 并行计算：")
OUTPUT_SHAPE = Source("003", "输入与输出", "权重与 V 相乘，输出 [B,h,T_q,d]。")
DTYPES = ("float64", "float32")
QKV = ("query", "key", "value")


def transform_cases(impl: GuardedAdapter, dtype: str, *, bias: bool = False, seed: int = 4300) -> list[Case]:
    """A key padding mask (every row sees a key), then causal (T < S, the declared alignment; and T = S, where the
    last query sees every key), and with ``bias``
    an additive M with a -inf where the kernel takes M's gradient: each within what the kernel declares."""
    B, H, T, S = 2, 2, 4, 7
    plain = random_case(seed, B=B, Hq=H, T=T, S=S, Dk=8, dtype=dtype, label="plain")
    mask = random_mask(seed, (B, 1, 1, S), p_blocked=0.3)
    mask[..., 0] = False
    square = random_case(seed + 2, B=B, Hq=H, T=S, S=S, Dk=8, dtype=dtype)
    cases = [
        plain.replace(mask=mask, label="padding mask"),
        plain.replace(is_causal=True, label="causal"),
        square.replace(is_causal=True, label="causal, T = S"),  # the last key seen by the last query
    ]
    decl = impl.declaration
    if bias and decl.float_mask and decl.bias_grad:
        m = rng_for(seed + 1).standard_normal((1, H, T, S))
        m[0, 1, 2, 3] = -np.inf
        cases.append(plain.replace(bias=m, label="additive M"))
    return supported(impl, cases)


def _tangents(case: Case, seed: int, names=QKV) -> dict[str, np.ndarray]:
    rng = rng_for(seed)
    out = {}
    for n in names:
        shape = np.shape(case.bias) if n == "bias" else getattr(case, n).shape
        t = rng.standard_normal(shape)
        out[n] = t if n == "bias" else cast(t, case.dtype)  # Q's, K's, V's tangents in their dtype (M is float64)
    return out


def _judge(case: Case, what: str, got, want, allowed, rule: str) -> None:
    msg = mismatch_report(what, got, want, allowed, rule)
    if msg:
        raise ClauseViolation(msg, case)


@clause(
    "TRANSFORM-JVP-01",
    "forward-mode AD: the JVP of the output along Q, K, V each alone and together (and the additive M where the "
    "kernel takes M's gradient) matches the oracle's analytic JVP; a kernel that refuses forward AD is listed",
    CHECK_GRADS,
    requires=["grad"],
    dtypes=DTYPES,
    kills=["transform_jvp_key_tangent_dropped"],
    tolerance=judge.RULE,
)
def test_jvp_matches_oracle(impl, dtype):
    decl = impl.declaration
    for i, case in enumerate(transform_cases(impl, dtype, bias=True)):
        every = _tangents(case, 4310 + i, QKV + (("bias",) if case.bias is not None else ()))
        if i == 0:  # each input alone, then together, on the first case; together on the others
            asked = [("query",), ("key",), ("value",), QKV]
        else:
            asked = [tuple(every)] + ([("bias",)] if case.bias is not None else [])
        for names in asked:
            tangents = {n: every[n] for n in names}
            out, tangent = impl.jvp(case, tangents)
            want_out, want, allowed = judge.expected_jvp(case, tangents, decl)
            compare.assert_close(out, want_out, case=case, decl=decl, what="output under forward AD")
            _judge(case, f"tangent of the output along {'+'.join(names)}", tangent, want, allowed, judge.RULE)


@clause(
    "TRANSFORM-GRADGRAD-03",
    "double backward: the gradient with respect to Q, K, V of <(dQ, dK, dV), w> through a backward with "
    "create_graph=True (a gradient penalty) matches the oracle's analytic second order; a refusal is listed",
    BACKWARD,
    requires=["grad"],
    dtypes=DTYPES,
    kills=["transform_gradgrad_detached_weights"],
    tolerance=judge.RULE,
)
def test_double_backward_matches_oracle(impl, dtype):
    _second_order(impl, dtype, lambda c, g, w: impl.vjp_vjp(c, g, tuple(w[n] for n in QKV)), "d/d{} <(dQ, dK, dV), w>")


def _second_order(impl: GuardedAdapter, dtype: str, ask, what: str) -> None:
    """A second-order answer (``ask(case, cotangent, {input: direction})``) on each transform case, against the
    oracle's analytic second order in the same directions: the double backward and forward over reverse compute
    the same numbers (the Hessian of <O, dO> is symmetric), each by its own rules."""
    decl = impl.declaration
    for i, case in enumerate(transform_cases(impl, dtype)):
        g = cotangent(case, 4320 + i)
        w = _tangents(case, 4330 + i)
        got = ask(case, g, w)
        want, allowed = judge.expected_vjp_vjp(case, g, tuple(w[n] for n in QKV), decl)
        for n, a, b, tol in zip(QKV, got, want, allowed):
            _judge(case, what.format(n), a, b, tol, judge.RULE)


@clause(
    "TRANSFORM-FWD-OVER-REV-02",
    "forward over reverse: the tangent of the backward's (dQ, dK, dV) along tangents of Q, K, V, by forward-mode "
    "AD through a backward with create_graph=True, matches the oracle's analytic second order (the Hessian of "
    "<O, dO> is symmetric: the double backward's numbers, from the kernel's forward-mode rules); a refusal is listed",
    BACKWARD,
    requires=["grad"],
    dtypes=DTYPES,
    kills=["transform_fwd_over_rev_weights_tangent_dropped"],
    tolerance=judge.RULE,
)
def test_forward_over_reverse_matches_oracle(impl, dtype):
    _second_order(impl, dtype, impl.jvp_vjp, "tangent of d{} along (tQ, tK, tV)")


@clause(
    "TRANSFORM-VMAP-04",
    "vmap: the kernel under its framework's vmap over a leading axis of two stacked cases gives each case's "
    "answer, within the error model of the oracle and of its own unbatched call; a refusal is listed",
    PARALLEL,
    dtypes=DTYPES,
    kills=[
        "transform_vmap_rule_interleaved",
        "transform_vmap_breaks_with_index_error",
        "transform_vmap_scales_query_in_place",
    ],
)
def test_vmap_matches_each_call(impl, dtype):
    decl = impl.declaration
    for i, case in enumerate(transform_cases(impl, dtype)):
        other = random_case(4340 + i, B=case.B, Hq=case.Hq, T=case.T, S=case.S, Dk=case.Dk, dtype=dtype)
        pair = [case, case.replace(query=other.query, key=other.key, value=other.value, label=case.label + ", 2nd")]
        stacked = impl.vmap_forward(pair)
        for j, c in enumerate(pair):
            compare.assert_close(stacked[j], compare.expected(c, decl).out, case=c, decl=decl, what=f"vmapped item {j}")
            alone = impl.forward(c)
            allowed = compare.pair_allowance(c, c, decl)
            _judge(c, f"vmapped item {j} vs its own call", stacked[j], alone, allowed, "sum of the two allowances")


@clause(
    "TRANSFORM-BATCHED-GRAD-06",
    "vmap of the backward (per-example gradients): the kernel's VJP under its framework's vmap over a leading axis "
    "of two stacked cases and their cotangents gives each item's dQ, dK, dV, within the error model of the oracle's "
    "VJP; a refusal is listed",
    BACKWARD,
    requires=["grad"],
    dtypes=DTYPES,
    kills=["transform_batched_grad_dv_keys_reversed"],
)
def test_vmap_of_backward_matches_oracle(impl, dtype):
    decl = impl.declaration
    for i, case in enumerate(transform_cases(impl, dtype)):
        other = random_case(4360 + i, B=case.B, Hq=case.Hq, T=case.T, S=case.S, Dk=case.Dk, dtype=dtype)
        item = case.replace(query=other.query, key=other.key, value=other.value, label=case.label + ", 2nd")
        grads = [cotangent(c, 4370 + 2 * i + j) for j, c in enumerate((case, item))]
        stacked = impl.vmap_vjp([case, item], grads)
        for j, (c, g) in enumerate(zip((case, item), grads)):
            compare.assert_grads_match(tuple(x[j] for x in stacked), c, g, decl, where=f"item {j} under vmap")


def fake_cases(impl: GuardedAdapter, dtype: str, seed: int = 4350) -> list[Case]:
    """T=4 queries against S=7 keys, each within what the kernel declares: a key padding mask with Dv=6 != Dk=8,
    causal, an additive M (Dv != Dk), and grouped heads (Hq=4 over Hkv=2) with a padding mask."""
    B, T, S, Dk, Dv = 2, 4, 7, 8, 6
    mask = random_mask(seed, (B, 1, 1, S), p_blocked=0.3)
    mask[..., 0] = False
    wide = random_case(seed, B=B, Hq=2, T=T, S=S, Dk=Dk, Dv=Dv, dtype=dtype)
    square = random_case(seed + 1, B=B, Hq=2, T=T, S=S, Dk=Dk, dtype=dtype)
    grouped = random_case(seed + 2, B=B, Hq=4, Hkv=2, T=T, S=S, Dk=Dk, dtype=dtype)
    cases = [
        wide.replace(mask=mask, label="padding mask, Dv != Dk"),
        square.replace(is_causal=True, label="causal"),
        wide.replace(bias=rng_for(seed + 3).standard_normal((1, 2, T, S)), label="additive M, Dv != Dk"),
        grouped.replace(mask=mask, label="grouped heads, padding mask"),
    ]
    return supported(impl, cases)


@clause(
    "TRANSFORM-FAKE-05",
    "fake tensors: the forward on tensors that carry only shape, dtype and device (torch's FakeTensorMode, as "
    "torch.compile and torch.export trace a call) gives an output of shape [B, Hq, T, Dv] in the case's dtype, "
    "the real call's; a kernel that needs its inputs' values there refuses, and the refusal is listed",
    OUTPUT_SHAPE,
    kills=["transform_fake_output_upcast"],
)
def test_fake_tensor_output_matches_real(impl, dtype):
    for case in fake_cases(impl, dtype):
        fake = impl.fake_forward(case)
        real = impl.forward(case)
        wants = {
            "the case's output": (tuple(case.out_shape), case.dtype),
            "the real call's output": (tuple(real.shape), dtype_name(real.dtype)),
        }
        for whose, want in wants.items():
            if fake != want:
                raise ClauseViolation(
                    f"under fake tensors the output is {list(fake[0])} {fake[1]}; {whose} is {list(want[0])} {want[1]}",
                    case,
                )

"""Kernels right in every plain call and wrong only under a transform: forward-mode AD, a double backward,
forward-mode AD of the backward, vmap, fake tensors.

Plain functions with torch's SDPA signature behind the real FunctionAdapter (tests/mutants_calls.py's ``_Call``),
each a torch.autograd.Function whose forward is the spec's attention and whose bug lies in one transform rule,
as hand-written kernels ship them: a forward-mode rule that forgets a tangent, a backward built from weights
saved off the graph, a backward whose own forward-mode rule holds the weights constant, a batching rule that
merges the vmap axis into the batch axis in another order for the keys than for the queries; and a plain
function whose path under fake tensors returns another dtype. Each is claimed by its TRANSFORM-* clause
(conformance/clauses/test_transforms.py).
"""

from __future__ import annotations

import math

from tests.mutants import mutant
from tests.mutants_calls import _Call
from tests.trust_kernels import reference


def _operands(q, k, v, attn_mask, is_causal, scale):
    """Q, K, V in the working dtype, the additive mask (0 / -inf, plus a float attn_mask) and the scale."""
    import torch

    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    T, S = q.shape[-2], k.shape[-2]
    add = torch.zeros(T, S, dtype=work)
    if is_causal:
        add = add.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(), -math.inf)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        add = torch.where(attn_mask, add, torch.tensor(-math.inf, dtype=work))
    elif attn_mask is not None:
        add = add + attn_mask.to(work)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return q.to(work), k.to(work), v.to(work), add, scale


def _softmax(s):
    import torch

    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    d = e.sum(dim=-1, keepdim=True)
    return e / torch.where(d == 0, torch.ones_like(d), d)


def _weights(q, k, add, scale):
    return _softmax(q @ k.transpose(-2, -1) * scale + add)


def _backward(q, k, v, p, g, scale):
    """dQ, dK, dV from the weights P: dV = P^T g, dS = P (g V^T - rowsum(P g V^T)), dQ = s dS K, dK = s dS^T Q."""
    dv = p.transpose(-2, -1) @ g
    dp = g @ v.transpose(-2, -1)
    ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def _saved_weights_function(s: float, add, jvp=None):
    """A custom Function whose forward saves the weights P it computed (off the graph, as a fused kernel saves
    them) and whose backward forms dQ, dK, dV from them; ``jvp(q, k, v, p, tq, tk, tv, tadd)``, when given, is
    its forward-mode rule."""
    import torch

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, add):
            p = _weights(q, k, add, s)
            ctx.save_for_backward(q, k, v, p)
            if jvp is not None:
                ctx.save_for_forward(q, k, v, p)
            return p @ v

        @staticmethod
        def backward(ctx, g):
            q, k, v, p = ctx.saved_tensors
            return (*_backward(q, k, v, p, g, s), None)

    if jvp is not None:
        Attention.jvp = staticmethod(lambda ctx, tq, tk, tv, tadd: jvp(*ctx.saved_tensors, tq, tk, tv, tadd))
    return Attention


@mutant("transform_jvp_key_tangent_dropped")
class TransformJvpKeyTangentDropped(_Call):
    """A custom Function whose forward and backward are right and whose forward-mode rule (``jvp``) forms the
    scores' tangent as scale dQ K^T + dM, without scale Q dK^T: forward AD along the keys is lost."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):

        def jvp(q, k, v, p, tq, tk, tv, tadd):
            return _output_jvp(q, k, v, p, tq, None, tv, tadd, add, s)  # the key's tangent never enters

        q2, k2, v2, add, s = _operands(q, k, v, attn_mask, is_causal, scale)
        return _saved_weights_function(s, add, jvp).apply(q2, k2, v2, add).to(q.dtype)


@mutant("transform_gradgrad_detached_weights")
class TransformGradgradDetachedWeights(_Call):
    """A custom Function that saves the weights P its forward computed (off the graph, as a fused kernel saves
    them) and forms dQ, dK, dV from them: the first derivatives are right, but a double backward differentiates
    only through Q, K, V's explicit uses, never through P."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q2, k2, v2, add, s = _operands(q, k, v, attn_mask, is_causal, scale)
        return _saved_weights_function(s, add).apply(q2, k2, v2, add).to(q.dtype)


def _output_jvp(q, k, v, p, tq, tk, tv, tadd, add, s):
    """The tangent of O = P V: Sd = s (tQ K^T + Q tK^T) + tM (0 where M blocks), Pd = P (Sd - rowsum(P Sd)),
    Od = Pd V + P tV."""
    import torch

    sd = torch.zeros_like(p)
    if tq is not None:
        sd = sd + tq @ k.transpose(-2, -1) * s
    if tk is not None:
        sd = sd + q @ tk.transpose(-2, -1) * s
    if tadd is not None:
        sd = sd + torch.where(torch.isneginf(add), 0.0, tadd)
    pd = p * (sd - (p * sd).sum(dim=-1, keepdim=True))
    return pd @ v + (p @ tv if tv is not None else 0.0)


@mutant("transform_fwd_over_rev_weights_tangent_dropped")
class TransformFwdOverRevWeightsTangentDropped(_Call):
    """A custom Function whose forward, forward-mode rule and backward are right, and whose backward is itself a
    custom Function (as a fused kernel's backward is an op of its own) with a right backward (a double backward
    is right) and a forward-mode rule that holds the weights P constant, differentiating only dQ, dK, dV's
    explicit uses of Q, K, V: forward-mode AD of the backward (forward over reverse) loses P's tangent."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        def grads(q, k, v, g):
            return _backward(q, k, v, _weights(q, k, add, s), g, s)

        class Backward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, g):
                ctx.save_for_backward(q, k, v, g)
                ctx.save_for_forward(q, k, v, g)
                return grads(q, k, v, g)

            @staticmethod
            def backward(ctx, gq, gk, gv):
                with torch.enable_grad():
                    xs = [x.detach().requires_grad_(True) for x in ctx.saved_tensors]
                    outs = grads(*xs)
                    return torch.autograd.grad(outs, xs, (gq, gk, gv), allow_unused=True)

            @staticmethod
            def jvp(ctx, tq, tk, tv, tg):
                q, k, v, g = ctx.saved_tensors
                tq, tk, tv, tg = (
                    torch.zeros_like(x) if t is None else t for x, t in zip((q, k, v, g), (tq, tk, tv, tg))
                )
                p = _weights(q, k, add, s)  # the bug: P enters the rule as a constant (no Pd term)
                dp = g @ v.transpose(-2, -1)
                ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
                dpd = tg @ v.transpose(-2, -1) + g @ tv.transpose(-2, -1)
                dsd = p * (dpd - (p * dpd).sum(dim=-1, keepdim=True))
                dqd = (dsd @ k + ds @ tk) * s
                dkd = (dsd.transpose(-2, -1) @ q + ds.transpose(-2, -1) @ tq) * s
                return dqd, dkd, p.transpose(-2, -1) @ tg

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, add):
                p = _weights(q, k, add, s)
                ctx.save_for_backward(q, k, v)
                ctx.save_for_forward(q, k, v, p)
                return p @ v

            @staticmethod
            def backward(ctx, g):
                q, k, v = ctx.saved_tensors
                return (*Backward.apply(q, k, v, g), None)

            @staticmethod
            def jvp(ctx, tq, tk, tv, tadd):
                return _output_jvp(*ctx.saved_tensors, tq, tk, tv, tadd, add, s)

        q2, k2, v2, add, s = _operands(q, k, v, attn_mask, is_causal, scale)
        return Attention.apply(q2, k2, v2, add).to(q.dtype)


@mutant("transform_vmap_rule_interleaved")
class TransformVmapRuleInterleaved(_Call):
    """A custom Function with its own batching rule (``vmap``), which merges vmap's axis N into the batch axis B
    for one call: item-major (n, b) for the queries and the mask, batch-major (b, n) for the keys and values,
    so query (n, b) attends over the keys of another item whenever n != b."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        def attend(q, k, v, add):
            return _weights(q, k, add, s) @ v

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(q, k, v, add):
                return attend(q, k, v, add)

            @staticmethod
            def setup_context(ctx, inputs, output):
                pass

            @staticmethod
            def vmap(info, in_dims, q, k, v, add):
                n = info.batch_size

                def item_major(x, d):
                    x = x.movedim(d, 0) if d is not None else x.expand(n, *x.shape)
                    return x.reshape(n * x.shape[1], *x.shape[2:])

                def batch_major(x, d):
                    x = x.movedim(d, 1) if d is not None else x.unsqueeze(1).expand(x.shape[0], n, *x.shape[1:])
                    return x.reshape(x.shape[0] * n, *x.shape[2:])

                b = q.shape[1] if in_dims[0] == 0 else q.shape[0]
                a = add.movedim(in_dims[3], 0) if in_dims[3] is not None else add.expand(n, *add.shape)
                a = a.reshape(n, *a.shape[1:]) if a.dim() == 5 else a
                a = a if a.dim() == 5 else a.reshape(n, 1, *a.shape[1:])  # [n, 1 or B, H, T, S]
                a = a.expand(n, b, *a.shape[2:]) if a.shape[1] == 1 else a
                merged = attend(item_major(q, in_dims[0]), batch_major(k, in_dims[1]), batch_major(v, in_dims[2]),
                                a.reshape(n * b, *a.shape[2:]))  # fmt: skip
                return merged.reshape(n, b, *merged.shape[1:]), 0

        q2, k2, v2, add, s = _operands(q, k, v, attn_mask, is_causal, scale)
        if add.dim() < 4:
            add = add.reshape(*(1,) * (4 - add.dim()), *add.shape)
        return Attention.apply(q2, k2, v2, add).to(q.dtype)


@mutant("transform_fake_output_upcast")
class TransformFakeOutputUpcast(_Call):
    """Right on real tensors; on fake tensors (a trace by torch.compile or torch.export: shape, dtype and device,
    no data) it takes a path of its own, as code that special-cases tracing does, which returns the float32
    accumulator without the cast back to the input dtype: the traced graph's output dtype is not the call's."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch
        from torch._subclasses.fake_tensor import FakeTensor

        out = reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        return out.to(torch.float32) if isinstance(q, FakeTensor) else out


# -- a transform meeting a value class (COVER-PAIRS-01) ---------------------------------------------------------
@mutant("meets_jvp_large_head_dim")
class MeetsJvpLargeHeadDim(_Call):
    """A custom Function whose forward-mode rule for a head dim above 64 (a split-D path of its own) forgets the
    scale on the query's tangent: right under forward AD at Dk = 8 (TRANSFORM-JVP-01's bases) and right at any
    Dk without a tangent."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        def jvp(q, k, v, p, tq, tk, tv, tadd):
            wide = q.shape[-1] > 64 and tq is not None
            return _output_jvp(q, k, v, p, tq / s if wide else tq, tk, tv, tadd, add, s)

        q2, k2, v2, add, s = _operands(q, k, v, attn_mask, is_causal, scale)
        return _saved_weights_function(s, add, jvp).apply(q2, k2, v2, add).to(q.dtype)


@mutant("meets_vmap_grouped_heads")
class MeetsVmapGroupedHeads(_Call):
    """Under vmap, grouped heads (fewer key heads than query heads) are expanded with the vmap axis taken for the
    head axis: each query head group reads the key and value heads in another order (rolled by one). Right
    under vmap with one key head per query head (TRANSFORM-VMAP-04's bases) and right with grouped heads
    outside vmap."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        if torch._C._functorch.is_batchedtensor(q) and k.shape[-3] != q.shape[-3]:
            k, v = k.roll(1, dims=-3), v.roll(1, dims=-3)
        return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("transform_batched_grad_dv_keys_reversed")
class TransformBatchedGradDvKeysReversed(_Call):
    """A custom Function with a generated vmap rule whose backward, when it runs batched (per-example gradients:
    vmap of the VJP), takes a path of its own that writes dV in reverse key order: every plain backward, and the
    forward under vmap, are right."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        class Attention(torch.autograd.Function):
            generate_vmap_rule = True

            @staticmethod
            def forward(q, k, v, add):
                return _weights(q, k, add, s) @ v

            @staticmethod
            def setup_context(ctx, inputs, output):
                ctx.save_for_backward(*inputs)

            @staticmethod
            def backward(ctx, g):
                q, k, v, add = ctx.saved_tensors
                dq, dk, dv = _backward(q, k, v, _weights(q, k, add, s), g, s)
                if torch._C._functorch.is_batchedtensor(g):
                    dv = dv.flip(-2)
                return dq, dk, dv, None

        q2, k2, v2, add, s = _operands(q, k, v, attn_mask, is_causal, scale)
        return Attention.apply(q2, k2, v2, add).to(q.dtype)


@mutant("transform_vmap_scales_query_in_place")
class TransformVmapScalesQueryInPlace(_Call):
    """Under vmap its batched path scales the query in place (``q.mul_(scale)``, then scores at scale 1), as a
    kernel that saves a copy does: the answer is right, but the caller's stacked query is changed. Outside vmap
    it never writes."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        if torch._C._functorch.is_batchedtensor(q):
            s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
            with torch.no_grad():
                q.mul_(s)
            return reference(q, k, v, attn_mask, dropout_p, is_causal, 1.0, enable_gqa)
        return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

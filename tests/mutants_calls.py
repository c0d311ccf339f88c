"""Kernels wrong only in how the same numbers reach them, or in what they do around the call.

Plain functions with torch's SDPA signature behind the real FunctionAdapter, as a user certifies one:
the validating torch reference of tests/trust_kernels.py, right on every value of every argument, and
wrong only where one attribute of the call is not the usual one: a storage offset or strides that are
not the shape's, one object given for two arguments, which inputs ask for a gradient, the autograd
context, the process's default dtype, a second backward over one graph, the cotangent's layout, M's
gradient; or leaving behind what a caller relies on (a result it handed out, the process state). Each
is claimed by the clause that catches it: the PRESENT-* clauses (conformance/clauses/test_presentation.py)
for the presentation, the guarded call (every clause) for what happens around the call.
"""

from __future__ import annotations

import math

from tests.mutants import mutant
from tests.trust_kernels import reference


def _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class _Call:
    """A torch-signature function behind the FunctionAdapter a user's function gets."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # pragma: no cover
        raise NotImplementedError

    def __new__(cls, name: str = "call-mutant"):
        from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

        return FunctionAdapter(cls.fn, name=name, declaration=FUNCTION_DEFAULTS)


def _contiguous_strides(shape) -> list[int]:
    out, n = [], 1
    for size in reversed(shape):
        out.append(n)
        n *= size
    return out[::-1]


# -- memory ------------------------------------------------------------------------------------------
@mutant("call_offset_misread")
class CallOffsetMisread(_Call):
    """Reads the query from its storage's first element (a raw pointer without the tensor's offset): a query
    taken out of a longer buffer reads the buffer's head instead."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q.storage_offset() != 0:
            q = q.as_strided(q.shape, q.stride(), 0)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_alignment_dependent_values")
class CallAlignmentDependentValues(_Call):
    """Takes a vector path whose tail handling drops the last key when the query's data does not start on a
    64-byte boundary (a loop peeled for alignment that forgets the remainder): right wherever the allocator
    happened to align the query, wrong at any other address, on every host."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q.data_ptr() % 64 and k.shape[-2] > 1:
            k, v = k[..., :-1, :], v[..., :-1, :]
            if attn_mask is not None and attn_mask.shape[-1] > 1:
                attn_mask = attn_mask[..., :-1]
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_mask_rows_assumed_dense")
class CallMaskRowsAssumedDense(_Call):
    """Reads a boolean mask's rows as if they were S elements apart (a raw pointer walked row by row): a mask
    sliced from a wider one (a longer padded buffer) reads the wrong keys on every row after the first."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None and attn_mask.dtype == torch_bool() and attn_mask.dim() >= 2:
            strides = list(attn_mask.stride())
            if strides[-1] == 1 and strides[-2] not in (0, attn_mask.shape[-1]):
                strides[-2] = attn_mask.shape[-1]
                attn_mask = attn_mask.as_strided(attn_mask.shape, strides, attn_mask.storage_offset())
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def torch_bool():
    import torch

    return torch.bool


@mutant("call_strides_assumed_contiguous")
class CallStridesAssumedContiguous(_Call):
    """Takes the key's strides to be its shape's (a pointer walked as if contiguous): a transposed or padded key
    is read in the wrong order."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not k.is_contiguous():
            k = k.as_strided(k.shape, _contiguous_strides(k.shape), k.storage_offset())
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_packed_qkv_assumed")
class CallPackedQkvAssumed(_Call):
    """Q, K and V in one storage are taken for a fused QKV projection and the mask for part of it: the mask is
    dropped whenever the three share a buffer."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        ptr = q.untyped_storage().data_ptr()
        if k.untyped_storage().data_ptr() == ptr == v.untyped_storage().data_ptr():
            attn_mask = None
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_cotangent_strides")
class CallCotangentStrides(_Call):
    """A custom backward that reads the incoming gradient as if it were contiguous."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        class Raw(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, g):
                if not g.is_contiguous():
                    g = g.as_strided(g.shape, _contiguous_strides(g.shape), g.storage_offset())
                return g

        return Raw.apply(_ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))


# -- identity ----------------------------------------------------------------------------------------
@mutant("call_self_attention_fast_path")
class CallSelfAttentionFastPath(_Call):
    """query is key: a self-attention path that forgets the scale."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q is k:
            scale = 1.0
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_key_is_value_path")
class CallKeyIsValuePath(_Call):
    """key is value: a path for tied K = V that reads the values in reverse key order."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if k is v:
            v = v.flip(-2)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


# -- which inputs ask for a gradient, and the autograd context -----------------------------------------
def _asking(name: str, test):
    @mutant(f"call_grad_subset_{name}")
    class Subset(_Call):
        @staticmethod
        def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            if test(q.requires_grad, k.requires_grad, v.requires_grad):
                is_causal, attn_mask = False, None  # a "training" path that forgets the masks
            return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    Subset.__name__ = Subset.__qualname__ = f"CallGradSubset_{name}"
    Subset.__doc__ = f"Forgets the mask and causal exactly when the inputs asking for a gradient are: {name}."


for _name, _test in (
    ("query", lambda a, b, c: a and not b and not c),
    ("key", lambda a, b, c: b and not a and not c),
    ("value", lambda a, b, c: c and not a and not b),
    ("query_key", lambda a, b, c: a and b and not c),
    ("query_value", lambda a, b, c: a and c and not b),
    ("key_value", lambda a, b, c: b and c and not a),
):
    _asking(_name, _test)


@mutant("call_grad_only_if_all_ask")
class CallGradOnlyIfAllAsk(_Call):
    """Gives Q and K no gradient unless all three inputs ask (a fused backward built for training only)."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not (q.requires_grad and k.requires_grad and v.requires_grad):
            q, k = q.detach(), k.detach()
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_mask_gradient_dropped")
class CallMaskGradientDropped(_Call):
    """Detaches a float attn_mask (a bias folded in as a constant): a learned bias gets no gradient."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.detach()
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_training_path")
class CallTrainingPath(_Call):
    """Under autograd with nothing asking for a gradient (an evaluation loop that forgot no_grad), a path that
    drops is_causal."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        if torch.is_grad_enabled() and not any(t.requires_grad for t in (q, k, v)):
            is_causal = False
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_inference_path")
class CallInferencePath(_Call):
    """Under torch.inference_mode, a serving path that drops the attention mask."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        if torch.is_inference_mode_enabled():
            attn_mask = None
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("call_default_dtype_output")
class CallDefaultDtypeOutput(_Call):
    """Allocates its output with the default dtype (torch.empty without dtype=): a float32 output for float16
    inputs, float64 for float32 ones when the caller made float64 the default."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if torch.get_default_dtype() != torch.float32:
            buf = torch.empty(out.shape)
            buf.copy_(out)
            return buf
        return out


@mutant("call_second_backward")
class CallSecondBackward(_Call):
    """A custom autograd function whose backward scales a saved tensor in place behind autograd's back (scratch
    reuse, as a compiled kernel does): the first backward is right, a second one over the same graph is not."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        plain = attn_mask is None and not is_causal and dropout_p == 0 and q.shape[1] == k.shape[1]
        if not plain or q.dim() != 4 or not q.is_floating_point() or q.dtype in (torch.float16, torch.bfloat16):
            return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                p = torch.softmax((q @ k.transpose(-2, -1)) * sc, -1)
                ctx.save_for_backward(q, k, v, p)
                return p @ v

            @staticmethod
            def backward(ctx, g):
                q, k, v, p = ctx.saved_tensors
                dv = p.transpose(-2, -1) @ g
                dp = g @ v.transpose(-2, -1)
                ds = p * (dp - (dp * p).sum(-1, keepdim=True))
                p.data.mul_(0.5)  # the saved weights reused as scratch (as a C++ kernel would, unseen by autograd)
                return ds @ k * sc, ds.transpose(-2, -1) @ q * sc, dv

        return Attention.apply(q, k, v)


# -- around the call: what a caller holds and relies on --------------------------------------------------
_BUFFERS: dict = {}


@mutant("call_returns_its_buffer")
class CallReturnsItsBuffer(_Call):
    """Returns one output buffer per shape and dtype (a workspace handed out): the caller's earlier result
    changes under it at the next call of that shape."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if out.requires_grad or torch.is_inference_mode_enabled():
            return out
        buf = _BUFFERS.setdefault((tuple(out.shape), out.dtype), torch.empty_like(out))
        buf.copy_(out)
        return buf


def _leaving(name: str, doc: str, act):
    @mutant(f"call_leaves_{name}")
    class Leaves(_Call):
        @staticmethod
        def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            act(out)
            return out

    Leaves.__name__ = Leaves.__qualname__ = f"CallLeaves_{name}"
    Leaves.__doc__ = doc


def _torch():
    import torch

    return torch


_leaving(
    "grad_mode_off",
    "Switches autograd off and leaves it so when it ran under autograd (a no_grad region entered by hand, never left).",
    lambda out: _torch().set_grad_enabled(False) if _torch().is_grad_enabled() and not out.requires_grad else None,
)
_leaving(
    "default_dtype",
    "Sets float64 as the default dtype for its own buffers and leaves it so.",
    lambda out: _torch().set_default_dtype(_torch().float64),
)
_leaving(
    "global_rng_drawn",
    "Draws from torch's global generator on every call, dropout or not.",
    lambda out: _torch().rand(1),
)
_leaving(
    "thread_count",
    "Pins torch to one thread for its own loop and leaves it so.",
    lambda out: _torch().set_num_threads(1),
)
_leaving(
    "matmul_precision",
    "Lowers torch's float32 matmul precision for its own GEMMs and leaves it so.",
    lambda out: _torch().set_float32_matmul_precision("medium"),
)
_leaving(
    "numpy_error_state",
    "Silences NumPy's floating-point errors for its own arithmetic and leaves them silenced.",
    lambda out: __import__("numpy").seterr(all="ignore"),
)


@mutant("call_threads_split_heads")
class CallThreadsSplitHeads(_Call):
    """Splits the heads over torch's threads and drops the remainder: with heads not a multiple of the thread
    count (2 heads over 3 threads) the last head's output is never written."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if q.dim() == 4 and q.shape[1] % torch.get_num_threads():
            out = out.clone()
            out[:, -1] = 0
        return out


@mutant("call_mask_dtype_promotes")
class CallMaskDtypePromotes(_Call):
    """Adds a float32 attn_mask to float16 scores without casting back: the output comes out float32."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != q.dtype:
            return out.to(attn_mask.dtype)
        return out

"""Kernels keyed on a switch of their caller's, on the thread they run on, or on a scalar argument's Python type.

Plain functions with torch's SDPA signature behind the real FunctionAdapter, as a user certifies one: the
validating torch reference of tests/trust_kernels.py, right everywhere except under one caller's context
(conformance/clauses/test_contexts.py: CONTEXT-SWITCHES-01, CONTEXT-THREADS-02), for one Python type of a scalar
argument (ARGS-SCALAR-TYPES-01), or after a refused call (the precondition clauses, through the guarded call's
process-state check).
"""

from __future__ import annotations

import math
import threading
import time

from tests.mutants import mutant
from tests.mutants_calls import _Call
from tests.trust_kernels import reference


def _torch():
    import torch

    return torch


def _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _gradient_of(right, wrong):
    """``right``'s value with ``wrong``'s gradient (a backward that takes another path than the forward)."""
    return wrong + (right - wrong).detach()


def _without_mask(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return _ref(q, k, v, None, dropout_p, False, scale, enable_gqa)


# -- the caller's switches -------------------------------------------------------------------------------
@mutant("context_deterministic_backward")
class ContextDeterministicBackward(_Call):
    """Under torch.use_deterministic_algorithms(True), a "deterministic" backward path that recomputes the weights
    without the mask: the forward is right, the gradients are those of unmasked attention."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if _torch().are_deterministic_algorithms_enabled() and out.requires_grad:
            return _gradient_of(out, _without_mask(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))
        return out


@mutant("context_matmul_precision_scale")
class ContextMatmulPrecisionScale(_Call):
    """With torch's float32 matmul precision lowered ("high" or "medium"), a fast path that forgets the scale:
    wrong beyond anything TF32 or bfloat16 products allow."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _torch().get_float32_matmul_precision() != "highest":
            scale = 1.0
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("context_math_fallback")
class ContextMathFallback(_Call):
    """When the caller forces SDPBackend.MATH (sdpa_kernel) or switches the flash backend off, a fallback that
    drops the mask and causal."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not _torch().backends.cuda.flash_sdp_enabled():
            attn_mask, is_causal = None, False
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("context_autocast_drops_mask")
class ContextAutocastDropsMask(_Call):
    """Under torch.autocast on the CPU, a mixed-precision path that drops a float (additive) attn_mask."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _torch().is_autocast_enabled("cpu") and attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = None
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("context_anomaly_path")
class ContextAnomalyPath(_Call):
    """Under autograd's anomaly detection, a checked debug path that forgets is_causal and the mask."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _torch().is_anomaly_enabled():
            attn_mask, is_causal = None, False
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("context_flush_denormal_path")
class ContextFlushDenormalPath(_Call):
    """Reads flushed subnormals (torch.set_flush_denormal(True)) as a "fast math" process and takes a path that
    scales by 1/Dk instead of 1/sqrt(Dk)."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        torch = _torch()
        if (torch.tensor([1e-40], dtype=torch.float32) * torch.tensor([1.0])).item() == 0.0:
            scale = (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])) / math.sqrt(q.shape[-1])
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("context_saved_hooks_backward")
class ContextSavedHooksBackward(_Call):
    """When saved-tensor hooks are installed (an offload is active), saves less for the backward and recomputes
    the weights there without the mask."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        torch = _torch()
        out = _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None and out.requires_grad:
            return _gradient_of(out, _without_mask(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))
        return out


@mutant("context_checkpoint_recompute")
class ContextCheckpointRecompute(_Call):
    """A forward run again inside a backward (activation checkpointing's recomputation) takes a path without the
    mask: the first forward is right, the gradients come from the unmasked recomputation."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _torch()._C._current_graph_task_id() != -1:
            attn_mask, is_causal = None, False
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


# -- threads ---------------------------------------------------------------------------------------------
_FILL = threading.local()
_FILL.value = -math.inf  # set on the importing thread only: other threads see the default below


@mutant("context_thread_fill")
class ContextThreadFill(_Call):
    """Keeps the fill of blocked keys in a thread-local set when the module was imported: on any other thread
    the fill is -1, so blocked keys keep a weight."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        torch = _torch()
        fill = getattr(_FILL, "value", -1.0)
        if attn_mask is not None and attn_mask.dtype == torch.bool and fill != -math.inf:
            attn_mask = torch.where(attn_mask, 0.0, fill).to(torch.float32)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


_SCRATCH: dict = {}


@mutant("context_shared_scratch")
class ContextSharedScratch(_Call):
    """Keeps the mask in one module-level scratch slot between its setup and its use: calls made at once from
    several threads read each other's mask (the wait stands for the setup work that releases the GIL)."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        _SCRATCH["mask"] = attn_mask
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.05)
        return _ref(q, k, v, _SCRATCH["mask"], dropout_p, is_causal, scale, enable_gqa)


# -- scalar arguments in a caller's Python types ---------------------------------------------------------
@mutant("args_int_scale_ignored")
class ArgsIntScaleIgnored(_Call):
    """Takes the scale only when it is a Python float (``isinstance(scale, float)``): ``scale=1`` or ``scale=2``
    as an int, or a 0-d tensor, falls back to 1/sqrt(Dk)."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale if isinstance(scale, float) else None, enable_gqa)


@mutant("args_numpy_bool_causal_ignored")
class ArgsNumpyBoolCausalIgnored(_Call):
    """Tests ``is_causal is True``: a numpy.bool_ (or 1) read from a config is taken for False."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return _ref(q, k, v, attn_mask, dropout_p, is_causal is True, scale, enable_gqa)


# -- around a refused call -------------------------------------------------------------------------------
@mutant("refused_call_leaves_grad_mode_off")
class RefusedCallLeavesGradModeOff(_Call):
    """Switches autograd off for its own checks and switches it back after a call that returns, not after one
    that raises: an invalid input refused with ValueError leaves the caller's grad mode off."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        torch = _torch()
        before = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        out = _ref(q.detach(), k.detach(), v.detach(), attn_mask, dropout_p, is_causal, scale, enable_gqa)
        torch.set_grad_enabled(before)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) if before else out


# -- a switch, a scalar type or an argument's memory meeting a value class (COVER-PAIRS-01) ----------------------
@mutant("meets_deterministic_large_head_dim")
class MeetsDeterministicLargeHeadDim(_Call):
    """Under deterministic algorithms, a head dim above 64 takes a split-D path that drops the scale on its second
    half of the features: right under every switch at Dk <= 64 (CONTEXT-SWITCHES-01's bases) and at any Dk
    without the switch."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if _torch().are_deterministic_algorithms_enabled() and q.shape[-1] > 64:
            s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
            return _ref(q, k, v, attn_mask, dropout_p, is_causal, s * 1.25, enable_gqa)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("meets_another_thread_causal")
class MeetsAnotherThreadCausal(_Call):
    """Called from a thread other than the main one, causal masking reads a per-thread flag that only the main
    thread set: is_causal is dropped there (CONTEXT-THREADS-02's bases pass no is_causal off the main thread)."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if threading.current_thread() is not threading.main_thread() and is_causal:
            return _ref(q, k, v, attn_mask, dropout_p, False, scale, enable_gqa)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("meets_numpy_scale_grouped_heads")
class MeetsNumpyScaleGroupedHeads(_Call):
    """A scale that is not a Python float (numpy.float64 from a config, a 0-d tensor) with grouped heads goes
    through a path that takes the default scale: right for every scalar type without GQA (ARGS-SCALAR-TYPES-01's
    scale bases have as many key heads as query heads) and for a float scale with GQA."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if scale is not None and type(scale) is not float and q.shape[-3] != k.shape[-3]:
            scale = None
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@mutant("meets_offset_value_causal")
class MeetsOffsetValueCausal(_Call):
    """A value that is a view into a larger buffer (a KV-cache slice, its own storage offset) with causal: the
    kernel reads the value rows from the buffer's start (one row early) where causal takes its tiled path."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if v.storage_offset() != 0 and q.storage_offset() == 0 and is_causal and v.shape[-2] > 1:
            v = _torch().cat([v[..., :1, :], v[..., :-1, :]], dim=-2)
        return _ref(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

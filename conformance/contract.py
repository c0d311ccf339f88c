"""The adapter contract: the only thing a kernel author has to implement against.

It is deliberately framework-neutral (NumPy arrays in, NumPy arrays out) and imports nothing else
of this project, so that adapters depend on this module alone. The suite speaks ONE mask
convention, the spec's (000_f3dcd408372d9e02.txt §8: "布尔 Mask 中 True 表示禁止注意"): in a
``Case``, ``mask[...] == True`` means *blocked*. Translating that into a kernel's own sense
(``F.scaled_dot_product_attention`` and ``jax.nn.dot_product_attention`` use True = may attend) is
the adapter's job, and a wrong translation is exactly what the mask clauses catch.

An adapter is any object with:

    name: str
    declaration: Declaration
    def forward(self, case: Case) -> np.ndarray                      # [B, Hq, T, Dv], case dtype
    def forward_with_weights(self, case) -> (out, weights)           # only if returns_weights
    def vjp(self, case, grad_out) -> (dq, dk, dv)                    # only if grad
    def forward_with_lse(self, case) -> (out, lse)                   # only if returns_lse; lse [B, Hq, T]
    def contexts(self) -> tuple[str, ...]                            # only if presents "context" (CONTEXT_KINDS)

A case may carry a ``Presentation`` (how its numbers reach the kernel besides their values: which
inputs ask for a gradient, the forward's autograd context, a second backward, the default dtype); its
arrays carry their own memory (strides, offsets, one buffer or one object shared by two arguments).
An adapter declares which of these its kernel really receives (``Declaration.presents``), and the
suite varies only those. Under a presentation ``vjp`` returns None for an input that did not ask for
its gradient, and (dq, dk, dv, dbias) when the additive M asked.

The declaration says what the kernel supports and which conventions it follows; the suite selects
clauses from it and tests every declared convention *as declared*. Optionally, an adapter of a
library names the releases its declaration and expectations were measured with; when the installed
release differs, the verdict line says so:

    measured_with: dict[str, str]                                    # e.g. {"keras": "3.15.1"}

Optional, the transforms a framework applies to its own ops (PyTorch's OpInfo gradient tests, jax's
check_grads, vmap, fake tensors; conformance/clauses/test_transforms.py). An adapter names in ``transforms`` the ones
it can ask of its kernel (a subset of :data:`TRANSFORMS`) and has the method of each; an adapter without
them leaves those clauses not applicable. The kernel may refuse a transform (NotImplementedError,
RuntimeError, TypeError: "not implemented for forward AD"): a measured capability, listed on the run's
transforms line, never a failure; a wrong answer under a transform fails its clause:

    transforms: frozenset[str]                                       # e.g. {"jvp", "vjp_vjp", "jvp_vjp", "vmap"}
    def jvp(self, case, tangents) -> (out, tangent_out)              # forward-mode AD; tangents: {input: array}
    def vjp_vjp(self, case, grad_out, w) -> (d2q, d2k, d2v)          # double backward: grad of <vjp(grad_out), w>
    def jvp_vjp(self, case, grad_out, tangents) -> (dq', dk', dv')   # forward over reverse: tangent of vjp(grad_out)
    def vmap_forward(self, cases) -> np.ndarray                      # the kernel under vmap, [N, B, Hq, T, Dv]
    def vmap_vjp(self, cases, grad_outs) -> (dq, dk, dv)             # vmap of the VJP: per-item gradients, [N, ...]
    def fake_forward(self, case) -> (shape, dtype_name)              # the forward on fake tensors (no data)

``tangents`` maps "query", "key", "value" and "bias" (the additive M) to arrays of those inputs' shapes
(a missing one: no tangent); ``w`` is (wq, wk, wv) in Q's, K's and V's shapes. ``jvp_vjp`` differentiates the
backward forward-mode: the tangent of (dQ, dK, dV) along ``tangents`` of Q, K, V (the same numbers as
``vjp_vjp`` with ``w`` those tangents: the Hessian of <O, grad_out> is symmetric, but other rules of the kernel
compute them). ``vmap_forward`` gets N cases that differ only in Q, K and V, stacked along a new leading axis
the framework's vmap maps over, so that the kernel itself sees the cases' 4-D shapes; ``vmap_vjp`` maps the
VJP the same way (each item's cotangent ``grad_outs[i]``), as per-example gradients are taken (torch:
``vmap`` of ``torch.func.vjp``, where the kernel's inputs track gradients inside the map; jax: ``jax.vmap`` of
``jax.vjp``), and returns each input's gradients stacked (one object given for two arguments: its whole
gradient under both names, as ``vjp`` does). ``fake_forward`` runs the
forward on tensors that carry only shape, dtype and device (torch: ``FakeTensorMode``, inputs
``mode.from_tensor`` of the real call's, as torch.compile and torch.export trace a call) and returns the
output's shape (a tuple of ints) and dtype name.

The module is longer than the protocol above because ``Case`` and ``Declaration`` are the whole
vocabulary shared by adapters and the suite (every field documented where it is defined, with its
default chosen so that an adapter declaring nothing about a variant is unaffected by it); split, an
adapter would import several modules for one contract.

Optional, for the performance profile (``pytest --conformance-perf``; conformance/harness/perf*.py).
An adapter without them is still profiled, through ``forward``/``vjp``, and the report says so:

    def prepare(self, case) -> handle                # inputs converted and placed on the device, once
    def run(self, handle) -> result                  # the kernel alone; returns when the result is complete
    def fetch(self, result) -> np.ndarray            # the result back to NumPy (not timed)
    def prepare_backward(self, case, grad_out) -> handle
    def run_backward(self, handle) -> grads          # forward + backward on prepared inputs
    def device_times(self, handle, n, backward=False) -> list[float]   # device timestamps (CUDA events)
    def kernel_ran(self, case) -> (backend, evidence)  # which kernel actually ran, and how that is known
    framework: str                                   # "numpy", "torch" or "jax": whose GEMMs are its floor
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

try:  # bfloat16 has no NumPy dtype of its own; ml_dtypes provides the one JAX uses too.
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a hard dependency, kept soft for adapters
    BFLOAT16 = None

DTypeName = Literal["float64", "float32", "float16", "bfloat16"]
DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
LOW_PRECISION: frozenset[str] = frozenset({"float16", "bfloat16"})

AllBlockedPolicy = Literal["zeros", "nan", "mean-v"]
ALL_BLOCKED_POLICIES: tuple[str, ...] = ("zeros", "nan", "mean-v")
CausalAlignment = Literal["top-left", "bottom-right"]
CAUSAL_ALIGNMENTS: tuple[str, ...] = ("top-left", "bottom-right")
MaskSense = Literal["blocked", "attend"]
MemoryScaling = Literal["linear", "quadratic"]
MEMORY_SCALINGS: tuple[str, ...] = ("linear", "quadratic")
LseBase = Literal["e", "2"]
LseEmpty = Literal["-inf", "+inf", "large-negative"]
# "large-negative": a kernel that fills blocked scores with a large finite negative number (XLA's
# jax.nn.dot_product_attention: -0.7 x the float32 maximum) returns about that number as the lse of a
# row that sees no key; the suite accepts any value at or below this bound there (or -inf).
LSE_LARGE_NEGATIVE_MAX = -1e30
MeanVKeys = Literal["sequence", "buffer"]
# Formulations (conformance/oracle_formulations.py): what a kernel computes where the spec's 000 §8
# upcasts. ``float32_computed_as``: the format the operands of both products (Q, K; P, V) of a
# float32 case are rounded to before a float32-accumulated product (TF32 tensor cores, an inference
# runtime's bfloat16 "fast math"). ``float16_computed_as`` / ``bfloat16_computed_as``: "float32", the
# spec's upcast; "<dtype>-products", the product Q K^T rounded to the input dtype (accumulated in
# float32; past the dtype's range it is +-inf), scale, mask and softmax in float32 afterwards, P
# rounded to the input dtype for P V; "<dtype>-sums", the same with both products' sums accumulated
# in the input dtype (each partial sum rounded: NumPy's einsum); "<dtype>-scores", the scores formed
# in the input dtype: the product rounded, then scaled in the input dtype (rounded again) and a fill
# added there; "<dtype>-masked", "-products" with the additive mask M taken in the input dtype and
# added there (s + M rounded again: MLX, whose additive mask must have the inputs' dtype).
Float32ComputedAs = Literal["float32", "tf32", "bfloat16", "float16"]
FLOAT32_FORMATS: tuple[str, ...] = ("float32", "tf32", "bfloat16", "float16")
Float16ComputedAs = Literal["float32", "float16-products", "float16-masked", "float16-sums", "float16-scores"]
Bfloat16ComputedAs = Literal["float32", "bfloat16-products", "bfloat16-masked", "bfloat16-sums", "bfloat16-scores"]
LOWP_COMPUTED_AS: dict[str, tuple[str, ...]] = {
    "float16": ("float32", "float16-products", "float16-masked", "float16-sums", "float16-scores"),
    "bfloat16": ("float32", "bfloat16-products", "bfloat16-masked", "bfloat16-sums", "bfloat16-scores"),
}
# Where the scale multiplies: "scores", the spec's (the scores, in the compute precision, after any
# rounding of the product); "product", inside the product (a GEMM's alpha: with a low-precision
# product it is the *scaled* product that is rounded); "query", Q times the scale rounded to the
# input dtype before the product (the scale itself may be a number of that dtype).
ScaleApplied = Literal["scores", "product", "query"]
SCALE_APPLIED: tuple[str, ...] = ("scores", "product", "query")
# The fill of blocked keys (the boolean mask's and causal's; an additive mask's -inf stays -inf):
# "-inf", the spec's; or "set:F" (the score replaced by F, jnp.where) or "add:F" (F added to the
# score, an additive 0 / F mask), F one of "min" (the input dtype's lowest number; float64's
# overflows the float32 softmax of a kernel that declares float64_computed_as=float32), "-0.7max"
# (-0.7 x the input dtype's largest, capped at float32's range: keras, XLA), "-0.7max-float32"
# (-0.7 x float32's largest whatever the input: logits formed in float32), or a number ("-1e4").
BLOCKED_FILL_NAMES: tuple[str, ...] = ("min", "-0.7max", "-0.7max-float32")
# The finite fills discovery and likely causes try, in order: the set fill of -0.7 x float32's largest
# (XLA, keras's NumPy backend) first, which no float16 witness tells from the others; then the named
# fills; then the round numbers older code uses.
FINITE_FILLS: tuple[str, ...] = (
    "set:-0.7max-float32",
    "set:-0.7max",
    "set:min",
    "add:-0.7max",
    "add:min",
    "add:-0.7max-float32",
    "add:-1e9",
    "set:-1e9",
    "add:-1e4",
    "set:-1e4",
)
# The all-blocked policy name a varlen case gets from a kernel whose mean-v fill averages the whole
# padded key buffer (Declaration.mean_v_keys="buffer"); only the variant oracle knows it.
MEAN_V_BUFFER = "mean-v-buffer"

# The exception classes a kernel rejects invalid input with, unless it declares others: what
# Python, NumPy, torch and jax raise for bad shapes and dtypes. Names, not classes, so that
# ``--declare rejects_with=...`` can say them and the contract imports no framework; a raised
# exception matches when any class of its MRO has one of these names (bare or module-qualified).
REJECTS_WITH_DEFAULT: frozenset[str] = frozenset({"ValueError", "RuntimeError", "TypeError"})


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype that carries ``name`` across the adapter boundary."""
    if name == "bfloat16":
        if BFLOAT16 is None:  # pragma: no cover
            raise RuntimeError("bfloat16 needs the ml_dtypes package")
        return BFLOAT16
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; the contract knows {', '.join(DTYPES)}")
    return np.dtype(name)


def dtype_name(dtype: np.dtype) -> str:
    """Inverse of :func:`np_dtype`; unknown dtypes are returned by their NumPy name.

    Asked for on every array the suite looks at (hundreds of thousands of times in a certification),
    so each distinct argument is answered once and remembered."""
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable argument, answered without the memo
        pass
    resolved = np.dtype(dtype)
    name = "bfloat16" if BFLOAT16 is not None and resolved == BFLOAT16 else resolved.name
    try:
        _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


_DTYPE_NAMES: dict[object, str] = {}


@dataclass(frozen=True)
class CacheForm:
    """How a KV-cache kernel receives a case's keys and values (``--signature=flash-attn-kvcache``).

    It changes the form, never the meaning: every adapter but a KV-cache one ignores it, and the
    answer is the case's. ``page_size``: None for one contiguous cache per sequence, else pages of
    that many slots placed in a shuffled block table (block 0 a null block no sequence owns, unused
    table entries pointing at it, unused slots filled with values no correct kernel reads);
    ``append``: the last ``append`` keys and values of every sequence are passed as new ones for the
    kernel to append to its cache before attending; ``splits``: the kernel's ``num_splits`` (0: its
    own choice); ``seed``: the shuffle and the filler.
    """

    page_size: int | None = None
    append: int = 0
    splits: int = 0
    seed: int = 0

    def describe(self) -> str:
        parts = ["contiguous cache" if self.page_size is None else f"paged cache, page size {self.page_size}"]
        if self.append:
            parts.append(f"append {self.append}")
        if self.splits:
            parts.append(f"num_splits {self.splits}")
        return ", ".join(parts)


# The transforms an adapter can ask of its kernel (the adapter's ``transforms``, the module docstring):
# "jvp" forward-mode AD, "vjp_vjp" a double backward (create_graph), "jvp_vjp" forward-mode AD of the backward
# (forward over reverse), "vmap" vectorising map, "fake" the forward on fake tensors (shape, dtype and device
# without data), "vmap_vjp" vmap of the VJP (batched, per-example gradients).
TRANSFORMS: tuple[str, ...] = ("jvp", "vjp_vjp", "jvp_vjp", "vmap", "fake", "vmap_vjp")

# The preconditions of 000 §8 a call can violate, by the names ``Declaration.accepts_invalid`` and the
# verdict use (conformance/harness/cases/preconditions.py says what each is and how a case breaks it).
PRECONDITIONS: tuple[str, ...] = (
    "rank",
    "integer",
    "mixed-dtype",
    "batch",
    "heads",
    "gqa-flag",
    "feature",
    "kv-length",
    "mask-shape",
    "mask-larger",
    "dropout-range",
)

# How a case's numbers reach the kernel, beyond the numbers (Case.presentation, Declaration.presents).
# A kernel must give the same answer however the same numbers are handed over; each attribute is one
# way the handing over can vary, and an adapter names the ones its kernel really receives:
#   "memory"         the arrays' own memory: strides, a storage offset, views into one buffer shared
#                    with other arguments, stride-0 (expanded) axes, the cotangent's layout too
#   "identity"       one array object given for two arguments reaches the kernel as one object
#   "requires_grad"  which inputs ask for a gradient (Presentation.requires_grad)
#   "grad_mode"      the forward's autograd context: no_grad, grad enabled, inference mode
#   "backward"       a second backward over the same graph (Presentation.backward)
#   "default_dtype"  the process's default float dtype during the call (Presentation.default_dtype)
#   "threads"        torch's intra-op thread count during the call (Presentation.threads)
#   "bias_dtype"     the dtype a half-precision case's additive M reaches the kernel in (Presentation.bias_dtype)
#   "context"        a switch of the framework's the caller set around the call (Presentation.context: a backend
#                    flag, a forced SDP backend, deterministic algorithms, matmul precision, autocast, anomaly
#                    mode, flush-denormal, saved-tensor hooks, activation checkpointing, another thread); the
#                    adapter names the ones it can apply (``contexts()``), generated from the framework's API
#   "scalars"        the Python type a scalar argument reaches the kernel as (Presentation.scalars: ``scale=1``
#                    as an int, a numpy.float32, a 0-d tensor; ``is_causal`` as a numpy.bool_ or 1; ...)
#   "transform"      the forward asked under a transform of the framework's (Presentation.transform: forward-mode
#                    AD, vmap), through the adapter's ``jvp`` and ``vmap_forward`` (its ``transforms`` names them)
PRESENTATION_ATTRIBUTES: tuple[str, ...] = (
    "memory",
    "identity",
    "requires_grad",
    "grad_mode",
    "backward",
    "default_dtype",
    "threads",
    "bias_dtype",
    "context",
    "scalars",
    "transform",
)
# The transforms a case's forward can be asked under (Presentation.transform): "jvp" forward-mode AD (the output
# and its tangent along tangents of Q, K and V), "vmap" the framework's vmap over two cases stacked on a new axis.
PRESENTED_TRANSFORMS: tuple[str, ...] = ("jvp", "vmap")
# The kinds of caller's context (Presentation.context, "<kind>" or "<kind>:<what>"), each a switch a caller of a
# framework sets around a call: "flag" a boolean backend flag flipped ("flag:torch.backends.mkldnn.enabled=False");
# "sdp_backend" one SDP backend forced ("sdp_backend:MATH"); "deterministic" deterministic algorithms on;
# "matmul_precision" float32 matmul precision lowered ("matmul_precision:medium"); "autocast" mixed precision
# ("autocast:cpu:bfloat16": the kernel's output is then the framework's autocast dtype, converted back);
# "anomaly" autograd's anomaly detection; "flush_denormal" subnormals flushed to zero; "saved_tensors_hooks"
# every tensor saved for the backward packed to a copy and unpacked back (as a CPU offload does); "checkpoint"
# the call inside activation checkpointing (the backward recomputes it); "thread" the call made from a thread
# other than the one that imported the kernel; jax's: "x64" its 64-bit mode set for the call ("x64:off", jax's
# default, which a caller of a float32 or 16-bit case runs under); "jit" jax.jit disabled around the call
# ("jit:off": every jitted function runs op by op). "matmul_precision" is jax's default matmul precision there
# (jax.default_matmul_precision). The names themselves come from the adapter (``contexts()``).
CONTEXT_KINDS: tuple[str, ...] = (
    "flag",
    "sdp_backend",
    "deterministic",
    "matmul_precision",
    "autocast",
    "anomaly",
    "flush_denormal",
    "saved_tensors_hooks",
    "checkpoint",
    "thread",
    "x64",
    "jit",
)
# The Python types a caller passes a scalar argument in (Presentation.scalars, "<argument>:<type>"): each gives
# the value of the plain float / bool form. "int" is used only where the value is integral (``scale=2``,
# ``dropout_p=0``, ``is_causal=1``); "tensor" is a 0-d tensor of the framework's.
SCALAR_FORMS: tuple[str, ...] = (
    "scale:int",
    "scale:numpy.float64",
    "scale:numpy.float32",
    "scale:tensor",
    "is_causal:numpy.bool_",
    "is_causal:int",
    "dropout_p:int",
    "dropout_p:numpy.float64",
    "enable_gqa:numpy.bool_",
    "enable_gqa:int",
)
GradMode = Literal["no_grad", "grad", "inference"]


def joined(text: str | None) -> tuple[str, ...]:
    """The parts of a "+"-joined Presentation.context or Presentation.scalars (none for None)."""
    return tuple(text.split("+")) if text else ()


GRAD_MODES: tuple[str, ...] = ("no_grad", "grad", "inference")
GRAD_INPUTS: tuple[str, ...] = ("query", "key", "value", "bias")
BackwardCalls = Literal["once", "twice"]


@dataclass(frozen=True)
class Presentation:
    """How a case reaches the kernel besides its values and its arrays' memory (which the arrays
    themselves carry: a view with strides and an offset, one object given twice, a stride-0 axis).

    ``requires_grad``: the inputs that ask for a gradient, of :data:`GRAD_INPUTS` ("bias" is the
    additive M, as the float mask the kernel receives); None is the direction's default (a forward:
    none; a VJP: query, key and value). In a VJP the adapter returns None for each input that did not
    ask, and the gradient of M fourth when "bias" asked. ``grad_mode``: the forward's context ("no_grad",
    the default; "grad": autograd enabled, so an input that asks must get an output on the graph;
    "inference": torch.inference_mode); a VJP always runs with autograd enabled. ``backward``: "twice"
    runs the backward a second time over the same graph (retain_graph) and returns the second
    result, which must equal the first. ``default_dtype``: the process's default float dtype during
    the call ("float64" as a caller may have set it), None leaves it as it is.

    Two arguments that are the same array object reach the kernel as one object; a VJP then returns
    that object's whole gradient (the sum of both arguments' parts) under each of the two names.
    """

    requires_grad: frozenset[str] | None = None
    grad_mode: GradMode = "no_grad"
    backward: BackwardCalls = "once"
    default_dtype: str | None = None
    # The call made with torch's intra-op thread count at this number (restored after): a kernel that
    # splits its work by thread count must give the same answer with one thread as with three.
    threads: int | None = None
    # The dtype a float16 / bfloat16 case's additive M reaches the kernel in: "query" (the input dtype),
    # "float32" (exact, as torch's SDPA also takes it); None: the adapter's own choice.
    bias_dtype: str | None = None
    # A caller's context around the call, of CONTEXT_KINDS ("<kind>" or "<kind>:<what>"); None: none. Two
    # switches set at once are joined by "+" ("deterministic+thread"), applied in that order.
    context: str | None = None
    # A scalar argument in another Python type, of SCALAR_FORMS ("scale:int"); None: plain float / bool. Several
    # arguments at once are joined by "+" ("scale:numpy.float64+dropout_p:numpy.float64": a config read by NumPy).
    scalars: str | None = None
    # The forward asked under a transform of PRESENTED_TRANSFORMS ("jvp", "vmap"); None: a plain call.
    transform: str | None = None

    def __post_init__(self) -> None:
        if self.requires_grad is not None:
            asked = frozenset(self.requires_grad)
            unknown = sorted(asked - set(GRAD_INPUTS))
            if unknown:
                raise ValueError(f"requires_grad names {unknown}; known inputs: {', '.join(GRAD_INPUTS)}")
            object.__setattr__(self, "requires_grad", asked)
        if self.grad_mode not in GRAD_MODES:
            raise ValueError(f"grad_mode={self.grad_mode!r}; one of {GRAD_MODES}")
        if self.backward not in ("once", "twice"):
            raise ValueError(f"backward={self.backward!r}; 'once' or 'twice'")
        if self.default_dtype not in (None, "float32", "float64"):
            raise ValueError(f"default_dtype={self.default_dtype!r}; None, 'float32' or 'float64'")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads={self.threads!r}; None or a count >= 1")
        if self.bias_dtype not in (None, "query", "float32"):
            raise ValueError(f"bias_dtype={self.bias_dtype!r}; None, 'query' or 'float32'")
        if self.context is not None and any(p.partition(":")[0] not in CONTEXT_KINDS for p in joined(self.context)):
            raise ValueError(f"context={self.context!r}; '<kind>[:<what>]' with a kind of {CONTEXT_KINDS}, '+'-joined")
        if self.scalars is not None and any(p not in SCALAR_FORMS for p in joined(self.scalars)):
            raise ValueError(f"scalars={self.scalars!r}; None or '+'-joined forms of {SCALAR_FORMS}")
        if self.transform not in (None, *PRESENTED_TRANSFORMS):
            raise ValueError(f"transform={self.transform!r}; None or one of {PRESENTED_TRANSFORMS}")

    def asked(self, direction: str) -> frozenset[str]:
        """The inputs that ask for a gradient in a call of ``direction`` ("forward" or "vjp")."""
        if self.requires_grad is not None:
            return self.requires_grad
        return frozenset(("query", "key", "value")) if direction == "vjp" else frozenset()

    def describe(self) -> str:
        parts = []
        if self.requires_grad is not None:
            parts.append("requires_grad=" + ("{" + ",".join(sorted(self.requires_grad, key=GRAD_INPUTS.index)) + "}"))
        if self.grad_mode != "no_grad":
            parts.append(f"forward under {self.grad_mode}")
        if self.backward != "once":
            parts.append("backward twice over one graph")
        if self.default_dtype is not None:
            parts.append(f"default dtype {self.default_dtype}")
        if self.threads is not None:
            parts.append(f"{self.threads} thread(s)")
        if self.bias_dtype is not None:
            parts.append(f"M in {self.bias_dtype}")
        if self.context is not None:
            parts.append(f"under {self.context}")
        if self.scalars is not None:
            for one in joined(self.scalars):
                arg, _, form = one.partition(":")
                parts.append(f"{arg} as {form}")
        if self.transform is not None:
            parts.append({"jvp": "under forward-mode AD", "vmap": "under vmap"}[self.transform])
        return ", ".join(parts) or "as usual"


@dataclass(frozen=True, eq=False)
class Case:
    """One attention problem, in the spec's layout and mask convention.

    query ``[B, Hq, T, Dk]``, key ``[B, Hkv, S, Dk]``, value ``[B, Hkv, S, Dv]``, all of one dtype
    (the working dtype). ``mask`` is boolean, broadcastable to ``[B, Hq, T, S]``, True = blocked.
    ``bias`` is the spec's additive mask M (float64 values, ``-inf`` allowed), broadcastable the
    same way. ``scale=None`` means ``1/sqrt(Dk)``. ``seed`` seeds anything random in the kernel
    (dropout). A Case is not validated on construction: the bad-input clauses build invalid ones on
    purpose.
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    mask: np.ndarray | None = None
    bias: np.ndarray | None = None
    is_causal: bool = False
    scale: float | None = None
    dropout_p: float = 0.0
    seed: int = 0
    label: str = ""
    # The variants kernel authors ship (FlashAttention's signature); None is the seed's SDPA. See
    # conformance/oracle_variants.py for their definitions. ``window`` is (left, right): query i sees
    # keys i + off - left ... i + off + right (off from the declared causal alignment), a negative
    # side unbounded. ``softcap`` c > 0 caps the scaled scores to c*tanh(s/c). ``alibi_slopes``,
    # [Hq] or [B, Hq], adds -slope * |i + off - j| to the score of query i and key j.
    window: tuple[int, int] | None = None
    softcap: float | None = None
    alibi_slopes: np.ndarray | None = None
    # Variable lengths (FlashAttention's varlen API): sequence b is the problem of its first
    # seqlens_q[b] queries and seqlens_k[b] keys, with its own causal / window / ALiBi positions
    # (bottom-right: S_b - T_b). Query rows past a sequence's length are padding, no part of the
    # result (0 in the output). None: every sequence has T queries and S keys.
    seqlens_q: np.ndarray | None = None
    seqlens_k: np.ndarray | None = None
    kv_form: CacheForm | None = None  # the form a KV-cache kernel receives the keys in (no change of meaning)
    # Attention sinks (gpt-oss, FlashInfer ``sinks``): one learned logit per query head, [Hq], that
    # joins every row's softmax as a key with no value: weights exp(s_j) / (exp(sink_h) + sum_k exp(s_k)).
    sinks: np.ndarray | None = None
    # How the case reaches the kernel besides its values (Presentation); None: as usual.
    presentation: Presentation | None = None
    # The GQA flag a caller passes where the kernel's signature has one (torch's ``enable_gqa``); None:
    # set exactly when Hq != Hkv. False with Hq != Hkv is an invalid call (000 §8: heads must match).
    enable_gqa: bool | None = None

    @property
    def dtype(self) -> str:
        return dtype_name(self.query.dtype)

    # Sizes are read from the trailing axes ([..., H, L, D]), so that a case with an array of another rank
    # (a precondition clause's bad input) still has sizes an adapter can read on its way to the kernel,
    # which is what must meet the bad input, not the adapter.
    @property
    def B(self) -> int:
        return self.query.shape[0] if np.ndim(self.query) >= 4 else 1

    @property
    def Hq(self) -> int:
        return self.query.shape[-3] if np.ndim(self.query) >= 3 else 1

    @property
    def Hkv(self) -> int:
        return self.key.shape[-3] if np.ndim(self.key) >= 3 else 1

    @property
    def T(self) -> int:
        return self.query.shape[-2]

    @property
    def S(self) -> int:
        return self.key.shape[-2]

    @property
    def Dk(self) -> int:
        return self.query.shape[-1]

    @property
    def Dv(self) -> int:
        return self.value.shape[-1]

    @property
    def has_variant(self) -> bool:
        """True when the case uses a window, softcap, ALiBi, sinks or variable lengths (the seed's SDPA has none)."""
        return (
            self.window is not None
            or bool(self.softcap)
            or self.alibi_slopes is not None
            or self.sinks is not None
            or self.is_varlen
        )

    @property
    def is_varlen(self) -> bool:
        return self.seqlens_q is not None or self.seqlens_k is not None

    @property
    def is_gqa(self) -> bool:
        return self.Hq != self.Hkv

    @property
    def effective_scale(self) -> float:
        return 1.0 / math.sqrt(self.Dk) if self.scale is None else float(self.scale)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.Hq, self.T, self.Dv)

    @property
    def weights_shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.Hq, self.T, self.S)

    def replace(self, **changes) -> Case:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line a person can read in a failure report."""
        parts = [
            f"q{list(self.query.shape)} k{list(self.key.shape)} v{list(self.value.shape)}",
            f"dtype={self.dtype}",
        ]
        if self.mask is not None:
            m = np.asarray(self.mask)
            parts.append(f"mask{list(m.shape)}(True=blocked, {int(m.sum())} blocked)")
        if self.bias is not None:
            parts.append(f"bias{list(np.shape(self.bias))}")
        if self.is_causal:
            parts.append("is_causal=True")
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        if self.dropout_p:
            parts.append(f"dropout_p={self.dropout_p:g}")
        if self.window is not None:
            parts.append(f"window={tuple(self.window)}")
        if self.softcap:
            parts.append(f"softcap={self.softcap:g}")
        if self.alibi_slopes is not None:
            slopes = np.asarray(self.alibi_slopes)
            parts.append(f"alibi_slopes{list(slopes.shape)}")
        if self.sinks is not None:
            parts.append(f"sinks{list(np.shape(self.sinks))}")
        if self.seqlens_q is not None:
            parts.append(f"seqlens_q={np.asarray(self.seqlens_q).tolist()}")
        if self.seqlens_k is not None:
            parts.append(f"seqlens_k={np.asarray(self.seqlens_k).tolist()}")
        if self.kv_form is not None:
            parts.append(f"[{self.kv_form.describe()}]")
        parts.append(f"seed={self.seed}")
        aliased = aliases(self)
        if aliased:
            parts.append("same object: " + "; ".join(" is ".join(group) for group in aliased))
        if self.presentation is not None and self.presentation.describe() != "as usual":
            parts.append(f"[{self.presentation.describe()}]")
        if self.label:
            parts.append(f"[{self.label}]")
        return " ".join(parts)


@dataclass(frozen=True)
class Declaration:
    """What a kernel supports and which conventions it follows.

    Every field is a claim the suite tests: features marked unsupported make the clauses that need
    them *not applicable* (reported with the reason); conventions select which oracle the output is
    compared with. Defaults describe the spec's own kernel (000_f3dcd408372d9e02.txt §8).

    ``causal_with_mask`` says whether the kernel's own call takes ``is_causal`` together with a mask
    (the article's §12: "训练 Decoder 时常常需要同时使用"). It matters to adapters that translate a
    Case into such a call (implementations/function.py): True passes both through and any error is
    the kernel's; False folds the causal part into the mask (torch's SDPA refuses the combination on
    some backends); None tries both and folds only when the call rejects the combination with one of
    the ``rejects_with`` classes. Either way the case means the union, and the clauses test that.
    """

    dtypes: frozenset[str] = frozenset(DTYPES)
    device: str = "cpu"
    grad: bool = False
    dropout: bool = False
    gqa: bool = False
    bool_mask: bool = True
    float_mask: bool = False
    causal: bool = True
    custom_scale: bool = True
    causal_alignment: CausalAlignment = "top-left"
    all_blocked: AllBlockedPolicy = "zeros"
    all_blocked_float_mask: AllBlockedPolicy | None = None
    float64_computed_as: Literal["float64", "float32"] = "float64"
    # Formulations that depart from 000 §8's upcast and -inf (see the Literal types above and
    # conformance/oracle_formulations.py): each a listed deviation (harness.records.deviations), under
    # which a case is judged against the oracle re-run with the formulation's roundings and fill.
    float32_computed_as: Float32ComputedAs = "float32"
    float16_computed_as: Float16ComputedAs = "float32"
    bfloat16_computed_as: Bfloat16ComputedAs = "float32"
    scale_applied: ScaleApplied = "scores"
    blocked_fill: str = "-inf"
    # Merges of partial results whose error is relative to the output's norm, not to each weight
    # (ring attention's out -= sigmoid(lse_b - lse) (out - out_b): one per ring step after the first).
    normwise_merges: int = 0
    mask_sense: MaskSense = "blocked"
    max_head_dim: int | None = None
    requires_dk_eq_dv: bool = False
    # Two bitwise claims, apart (003 §边界与失败方式: "“精确注意力”不表示逐 bit 相同"). ``deterministic``: the
    # same call on the same memory gives the same bits (measured by repeating a call). ``layout_invariant``:
    # the same numbers give the same bits in ANY memory: another alignment (offsets that are not multiples
    # of 64 bytes), strides, a transposed or packed view, which inputs ask for a gradient. No library
    # promises the second (SIMD and GEMM paths pick their blocking by alignment and layout, and the bits
    # follow), so it is False unless declared or measured (discovery); without it the PRESENT-* clauses
    # judge each presentation within the error model, as the spec's "exact" asks.
    deterministic: bool = True
    layout_invariant: bool = False
    batch_invariant: bool = False
    returns_weights: bool = False
    # The kernel gives the additive M (a float mask) its gradient when M asks for one (torch's SDPA does:
    # a learned bias is trained through it); a kernel that detaches or folds M declares False.
    bias_grad: bool = False
    # 000 §8's preconditions: the spec's kernel refuses every invalid input (rank, dtype, matching
    # dims, a mask that broadcasts, dropout_p in [0, 1]) with an error. False declares that it refuses
    # none; ``accepts_invalid`` names the ones it accepts (PRECONDITIONS); either is a listed deviation,
    # and every run measures and lists what the kernel accepts whatever it declares.
    validates_inputs: bool = True
    accepts_invalid: frozenset[str] = frozenset()
    # The kernel's signature has a GQA flag (torch's ``enable_gqa``): grouped heads are valid only with it.
    gqa_flag: bool = False
    rejects_with: frozenset[str] = REJECTS_WITH_DEFAULT
    causal_with_mask: bool | None = None
    # What a case's boolean mask and additive M reach the kernel as, when a case has both: False, as
    # two arguments (jax.nn.dot_product_attention's ``mask`` and ``bias``); True, as ONE additive mask
    # with -inf where the boolean mask blocks (an adapter that lowers to a single ``attn_mask``, as
    # every SDPA-signature function gets: implementations/_torch.sdpa_kwargs). Set by the adapter for
    # its own lowering: a row blocked entirely then follows ``all_blocked_float_mask``, the policy of
    # the mask kind the kernel actually received.
    masks_combined: bool = False
    # Variants (FlashAttention's signature; conformance/oracle_variants.py): sliding window, softcap,
    # ALiBi slopes, and a returned log-sum-exp [B, Hq, T] in ``lse_base`` ("e": natural log, "2":
    # log2) with ``lse_empty`` on rows that see no key (FlashAttention 2 returns +inf there; jax a
    # large finite negative number, "large-negative");
    # ``varlen``: the kernel takes per-sequence lengths (Case.seqlens_q / seqlens_k).
    window: bool = False
    softcap: bool = False
    alibi: bool = False
    returns_lse: bool = False
    lse_base: LseBase = "e"
    lse_empty: LseEmpty = "-inf"
    varlen: bool = False
    # Which keys the ``mean-v`` fill of a row that sees no key averages when a case has per-sequence
    # lengths: "sequence", the sequence's own keys (a packed kernel has no others); "buffer", every
    # slot of the padded key axis, past-the-end padding included (a padded-form kernel that masks
    # padding with the same large negative number as blocked keys: jax.nn.dot_product_attention).
    mean_v_keys: MeanVKeys = "sequence"
    # Attention sinks (Case.sinks): a per-query-head logit in every row's softmax denominator.
    sinks: bool = False
    # KV caches (flash_attn_with_kvcache): per-sequence key lengths with dense queries (cache_seqlens),
    # paged caches with a block table (page sizes a multiple of ``page_size_multiple``; FlashAttention
    # 2: 256), and new keys appended to the cache by the kernel (Case.kv_form says which form a case uses).
    kv_lengths: bool = False
    paged_kv: bool = False
    page_size_multiple: int | None = None
    kv_append: bool = False
    # Performance claims (tested by the perf profile's clauses, conformance/clauses/test_perf.py):
    # ``memory_scaling``: how the forward's peak extra memory grows with S at T = S ("linear": the
    # T x S matrix is never stored, FlashAttention-style; None: not claimed, measured and reported).
    # ``backend``: the kernel the adapter claims runs (e.g. "flash", "math", "cudnn", "xla"), which
    # its ``kernel_ran`` report must show; None: not claimed.
    memory_scaling: MemoryScaling | None = None
    backend: str | None = None
    # How the kernel runs, not what it computes: True when it compiles a program for each new input
    # structure (shapes, strides, dtypes, static arguments: XLA's jit, torch.compile, Triton, TVM), so
    # that a certification's cost is the number of distinct shapes it meets. The ci profile then takes
    # every case's shapes from a few buckets (conformance/harness/cases/buckets.py), each value class
    # of the case space still reached; discovery measures it (a new shape's first call against its
    # second). No clause's verdict depends on it.
    compiles_per_shape: bool = False
    # What of a case's presentation reaches the kernel (PRESENTATION_ATTRIBUTES), set by the adapter for
    # its own translation: an adapter that hands its kernel fresh dense copies presents none, NumPy
    # kernels that take the case's arrays as they are present "memory" and "identity", an adapter
    # calling a torch function can present them all. The case space varies only what is presented.
    presents: frozenset[str] = frozenset()
    # The kinds of caller's context (CONTEXT_KINDS) the adapter applies, where it presents "context": the
    # covering array's switch rows (harness.covering.table.SWITCHES) are admitted for these kinds only. None:
    # every kind the table names (an adapter around torch, which offers them all).
    context_kinds: frozenset[str] | None = None
    # The kernel takes only inputs whose last axis is unit-strided (torch's fused CPU kernels: "All fused
    # kernels require the last dimension of the input to have stride 1"): a case with Q, K or V strided
    # along its feature axis is not applicable to it.
    unit_last_stride: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.dtypes) - set(DTYPES)
        if unknown:
            raise ValueError(f"unknown dtypes {sorted(unknown)}; known: {', '.join(DTYPES)}")
        if self.all_blocked not in ALL_BLOCKED_POLICIES:
            raise ValueError(f"all_blocked={self.all_blocked!r}; one of {ALL_BLOCKED_POLICIES}")
        if self.all_blocked_float_mask not in (None, *ALL_BLOCKED_POLICIES):
            raise ValueError(f"all_blocked_float_mask={self.all_blocked_float_mask!r}; one of {ALL_BLOCKED_POLICIES}")
        if self.float64_computed_as not in ("float64", "float32"):
            raise ValueError(f"float64_computed_as={self.float64_computed_as!r}; 'float64' or 'float32'")
        self._check_formulations()
        if self.causal_alignment not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"causal_alignment={self.causal_alignment!r}; one of {CAUSAL_ALIGNMENTS}")
        if self.mask_sense not in ("blocked", "attend"):
            raise ValueError(f"mask_sense={self.mask_sense!r}; 'blocked' or 'attend'")
        if self.mean_v_keys not in ("sequence", "buffer"):
            raise ValueError(f"mean_v_keys={self.mean_v_keys!r}; 'sequence' or 'buffer'")
        if self.lse_base not in ("e", "2"):
            raise ValueError(f"lse_base={self.lse_base!r}; 'e' or '2'")
        if self.lse_empty not in ("-inf", "+inf", "large-negative"):
            raise ValueError(f"lse_empty={self.lse_empty!r}; '-inf', '+inf' or 'large-negative'")
        if self.memory_scaling not in (None, *MEMORY_SCALINGS):
            raise ValueError(f"memory_scaling={self.memory_scaling!r}; one of {MEMORY_SCALINGS} or None")
        if self.backend is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:+/-]*", self.backend):
            raise ValueError(f"backend={self.backend!r}: a kernel name such as flash, math, cudnn or xla")
        self._normalise_rejects_with()
        accepts = frozenset(
            n.strip() for n in (self.accepts_invalid.split(",") if isinstance(self.accepts_invalid, str)
                                else self.accepts_invalid) if n.strip()
        )  # fmt: skip
        unknown = sorted(accepts - set(PRECONDITIONS))
        if unknown:
            raise ValueError(f"accepts_invalid names {unknown}; known: {', '.join(PRECONDITIONS)}")
        object.__setattr__(self, "accepts_invalid", accepts)
        presents = frozenset(self.presents)
        unknown = sorted(presents - set(PRESENTATION_ATTRIBUTES))
        if unknown:
            raise ValueError(f"presents names {unknown}; known: {', '.join(PRESENTATION_ATTRIBUTES)}")
        object.__setattr__(self, "presents", presents)
        if self.context_kinds is not None:
            kinds = frozenset(self.context_kinds)
            unknown = sorted(kinds - set(CONTEXT_KINDS))
            if unknown:
                raise ValueError(f"context_kinds names {unknown}; known: {', '.join(CONTEXT_KINDS)}")
            object.__setattr__(self, "context_kinds", kinds)

    def _check_formulations(self) -> None:
        if self.float32_computed_as not in FLOAT32_FORMATS:
            raise ValueError(f"float32_computed_as={self.float32_computed_as!r}; one of {FLOAT32_FORMATS}")
        for dtype, allowed in LOWP_COMPUTED_AS.items():
            value = getattr(self, f"{dtype}_computed_as")
            if value not in allowed:
                raise ValueError(f"{dtype}_computed_as={value!r}; one of {allowed}")
        if self.scale_applied not in SCALE_APPLIED:
            raise ValueError(f"scale_applied={self.scale_applied!r}; one of {SCALE_APPLIED}")
        parse_fill(self.blocked_fill)
        if not isinstance(self.normwise_merges, int) or self.normwise_merges < 0:
            raise ValueError(f"normwise_merges={self.normwise_merges!r}; a count >= 0")

    def computed_as(self, dtype: str) -> str:
        """The declared formulation of ``dtype``'s precision: float64 -> float64 or float32, float32 ->
        its operand format, float16 / bfloat16 -> float32 (the upcast) or a ``-products`` /
        ``-scores`` formulation."""
        return getattr(self, f"{dtype}_computed_as")

    def _normalise_rejects_with(self) -> None:
        """``rejects_with`` as a frozenset of class names; a comma-separated string is accepted.

        ``NotApplicable`` is refused: it says "this kernel does not take such cases", which is not
        the same claim as "these inputs are invalid", and a rejection clause never counts it.
        """
        raw = self.rejects_with
        names = raw.split(",") if isinstance(raw, str) else list(raw)
        names = frozenset(str(n).strip() for n in names if str(n).strip())
        bad = sorted(n for n in names if not all(part.isidentifier() for part in n.split(".")))
        if not names or bad:
            raise ValueError(
                f"rejects_with={sorted(names)!r}: expected one or more exception class names "
                f"such as ValueError,RuntimeError{f'; not names: {bad}' if bad else ''}"
            )
        if any(n.rpartition(".")[2] == "NotApplicable" for n in names):
            raise ValueError("rejects_with may not name NotApplicable: a refusal is not a rejection of invalid input")
        object.__setattr__(self, "rejects_with", names)

    def replace(self, **changes) -> Declaration:
        return dataclasses.replace(self, **changes)

    def __hash__(self) -> int:
        """The fields' hash, computed once: a declaration keys the planner's caches, asked hundreds of thousands of
        times per plan, and hashing its forty fields each time was a third of planning. Not pickled (string hashes
        differ between processes)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dtypes"] = sorted(self.dtypes, key=DTYPES.index)
        d["rejects_with"] = sorted(self.rejects_with)
        d["presents"] = [a for a in PRESENTATION_ATTRIBUTES if a in self.presents]
        if self.context_kinds is not None:
            d["context_kinds"] = [k for k in CONTEXT_KINDS if k in self.context_kinds]
        d["accepts_invalid"] = [a for a in PRECONDITIONS if a in self.accepts_invalid]
        return d

    def all_blocked_policy(self, case: Case) -> str:
        """The fill this kernel uses for all-blocked rows of ``case``.

        Some kernels fill differently when the blocking comes from an additive ``-inf`` mask than
        from a boolean one (``jax.nn.dot_product_attention``: mean of V for a boolean mask, NaN for
        an all ``-inf`` bias); ``all_blocked_float_mask`` declares the second. It applies to a
        case with an additive M and no boolean mask, and to one with both when the adapter hands the
        kernel the two as one additive mask (``masks_combined``). A varlen case of a
        kernel declaring ``mean_v_keys="buffer"`` gets ``"mean-v-buffer"``, which only the variant
        oracle takes (the lowered base case of such a case is a padded mask, where mean-v means it).
        """
        received_float_only = case.bias is not None and (case.mask is None or self.masks_combined)
        if received_float_only and self.all_blocked_float_mask is not None:
            return self.all_blocked_float_mask
        if self.all_blocked == "mean-v" and self.mean_v_keys == "buffer" and case.is_varlen:
            return MEAN_V_BUFFER  # the variant oracle's name for it (conformance/oracle_variants.py)
        return self.all_blocked

    def tolerance_dtype(self, case: Case) -> str:
        """The dtype whose tolerance rule applies: float64 cases of a kernel that declares
        float32 computation are held to the float32 rule (and the suite says so)."""
        if case.dtype == "float64" and self.float64_computed_as == "float32":
            return "float32"
        return case.dtype

    def not_supported_reasons(self, case: Case) -> list[str]:
        """Sentences saying why this kernel cannot run ``case``; empty when it can."""
        reasons = []
        if case.dtype not in self.dtypes:
            reasons.append(f"declares dtypes {sorted(self.dtypes)}, not {case.dtype}")
        if case.is_gqa and not self.gqa:
            reasons.append(f"declares no GQA support (Hq={case.Hq} != Hkv={case.Hkv})")
        if case.mask is not None and not self.bool_mask:
            reasons.append("declares no boolean mask support")
        if case.bias is not None and not self.float_mask:
            reasons.append("declares no additive float mask support")
        if case.is_causal and not self.causal:
            reasons.append("declares no is_causal support")
        if case.scale is not None and not self.custom_scale:
            reasons.append("declares no custom scale support")
        if case.dropout_p > 0 and not self.dropout:
            reasons.append("declares no dropout support")
        if self.max_head_dim is not None and max(case.Dk, case.Dv) > self.max_head_dim:
            reasons.append(f"declares max head dim {self.max_head_dim}, case has Dk={case.Dk}, Dv={case.Dv}")
        if self.requires_dk_eq_dv and case.Dk != case.Dv:
            reasons.append(f"declares Dk == Dv required, case has Dk={case.Dk}, Dv={case.Dv}")
        if self.unit_last_stride:
            strided = [
                n
                for n, a in (("query", case.query), ("key", case.key), ("value", case.value))
                if np.ndim(a) and np.shape(a)[-1] > 1 and np.asarray(a).strides[-1] != np.asarray(a).itemsize
            ]
            if strided:
                reasons.append(f"declares inputs with a unit stride along the feature axis; {', '.join(strided)} not")
        if case.window is not None and not self.window:
            reasons.append("declares no sliding window support")
        if case.softcap and not self.softcap:
            reasons.append("declares no softcap support")
        if case.alibi_slopes is not None and not self.alibi:
            reasons.append("declares no ALiBi support")
        if case.sinks is not None and not self.sinks:
            reasons.append("declares no attention sinks (sinks)")
        if case.seqlens_q is not None and not self.varlen:
            reasons.append("declares no variable-length query sequences (varlen)")
        if case.seqlens_k is not None and not (self.varlen or self.kv_lengths):
            reasons.append("declares no per-sequence key lengths (varlen, kv_lengths)")
        form = case.kv_form
        if form is not None and form.page_size is not None:
            if not self.paged_kv:
                reasons.append("declares no paged KV cache (paged_kv)")
            elif self.page_size_multiple and form.page_size % self.page_size_multiple:
                reasons.append(f"declares page sizes multiple of {self.page_size_multiple}, case has {form.page_size}")
        if form is not None and form.append and not self.kv_append:
            reasons.append("declares no appending to the KV cache (kv_append)")
        return reasons


def aliases(case: Case) -> list[tuple[str, ...]]:
    """The groups of Q, K, V arguments that are one array object (``("query", "key")`` for
    self-attention's ``q = k = x``), in argument order; empty when all three are distinct."""
    groups: dict[int, list[str]] = {}
    for name in ("query", "key", "value"):
        groups.setdefault(id(getattr(case, name)), []).append(name)
    return [tuple(g) for g in groups.values() if len(g) > 1]


def parse_fill(text: str) -> tuple[str, str] | None:
    """``Declaration.blocked_fill`` as (mode, value): None for "-inf"; ("set" | "add", value) with value
    one of :data:`BLOCKED_FILL_NAMES` or a finite negative number's text. ValueError otherwise."""
    if text == "-inf":
        return None
    mode, sep, value = str(text).partition(":")
    if sep and mode in ("set", "add"):
        if value in BLOCKED_FILL_NAMES:
            return mode, value
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number) and number < 0:
            return mode, value
    raise ValueError(
        f"blocked_fill={text!r}: '-inf', or 'set:F' / 'add:F' with F one of "
        f"{', '.join(BLOCKED_FILL_NAMES)} or a finite negative number such as -1e4"
    )


def capabilities(
    *,
    dtypes: frozenset[str] = frozenset(DTYPES),
    grad: bool = True,
    dropout: bool = True,
    gqa: bool = True,
    bool_mask: bool = True,
    float_mask: bool = True,
    causal: bool = True,
    custom_scale: bool = True,
    max_head_dim: int | None = None,
    requires_dk_eq_dv: bool = False,
    returns_weights: bool = False,
    returns_lse: bool = False,
    bias_grad: bool = False,
    window: bool = False,
    softcap: bool = False,
    alibi: bool = False,
    sinks: bool = False,
    varlen: bool = False,
    kv_lengths: bool = False,
    paged_kv: bool = False,
    page_size_multiple: int | None = None,
    kv_append: bool = False,
) -> dict[str, object]:
    """What a kernel can take and give, for a :class:`Declaration`: every field that decides whether a
    clause or a case applies to it (``Declaration.not_supported_reasons``, ``grad``, the extra outputs).

    The seed's SDPA is claimed unless switched off by name: all four dtypes, any head dim, and the
    seven features ``grad`` ... ``custom_scale``; the extra outputs (``returns_weights``,
    ``returns_lse``, ``bias_grad``: the gradient of M) and FlashAttention's variants (``window`` ...
    ``kv_append``) are not claimed unless switched on. So
    ``Declaration(**capabilities(dropout=False, sinks=True), ...)`` is a kernel with everything the
    seed's SDPA has but dropout, plus attention sinks; ``capabilities()`` is exactly the seed's SDPA.
    The defaults are not the Declaration's own (which claim only a boolean mask, ``is_causal`` and a
    custom scale).

    Why: every adapter listed the seed's seven features one keyword a line (``grad=True,
    dropout=True, gqa=True, ...``), the same lines in every file, and the one that mattered, what a
    kernel lacks, was lost among what it has. With this, a declaration reads in two parts: what
    applies (this call, naming only the departures from the seed's SDPA), then how the kernel answers
    (its conventions, ``causal_alignment``, ``all_blocked``, ``mask_sense`` ..., stated in full in each
    adapter) with the claims in which it differs from the Declaration's defaults.
    """
    return {
        "dtypes": dtypes,
        "grad": grad,
        "dropout": dropout,
        "gqa": gqa,
        "bool_mask": bool_mask,
        "float_mask": float_mask,
        "causal": causal,
        "custom_scale": custom_scale,
        "max_head_dim": max_head_dim,
        "requires_dk_eq_dv": requires_dk_eq_dv,
        "returns_weights": returns_weights,
        "returns_lse": returns_lse,
        "bias_grad": bias_grad,
        "window": window,
        "softcap": softcap,
        "alibi": alibi,
        "sinks": sinks,
        "varlen": varlen,
        "kv_lengths": kv_lengths,
        "paged_kv": paged_kv,
        "page_size_multiple": page_size_multiple,
        "kv_append": kv_append,
    }


@runtime_checkable
class Adapter(Protocol):
    """The protocol every kernel adapter satisfies (see the module docstring)."""

    name: str
    declaration: Declaration

    def forward(self, case: Case) -> np.ndarray: ...


class NotApplicable(Exception):
    """Raised by an adapter when its kernel refuses a case for a documented, legitimate reason.

    The suite reports the clause as not applicable with this message (e.g. torch's own reason why a
    forced backend cannot take the inputs), never as a pass.
    """


class ContextRefused(NotApplicable):
    """Raised by an adapter when the framework itself refused a call under a caller's context
    (``Presentation.context``) in its own words (a forced SDP backend that cannot take the inputs: "No
    available kernel"; an op without a deterministic implementation under deterministic algorithms): that
    context is not applicable to that case. Never a failure of the kernel, never a refusal of the case."""


class KernelFault(Exception):
    """Raised by an adapter for a fault of the kernel that only the adapter can see, because it lies in
    the kernel's own objects: an output cut from the autograd graph although an input asked for its
    gradient, no gradient for an input that asked, a second backward over one graph that differs from
    the first. The suite fails the running clause with this message; it is never a refusal.
    """

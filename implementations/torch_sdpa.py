"""Adapters around ``torch.nn.functional.scaled_dot_product_attention`` (torch 2.13).

One adapter per backend choice, because the backends are different kernels with different limits:
``cpu_default`` lets torch choose, the others force one backend with
``torch.nn.attention.sdpa_kernel`` so that a refusal shows up as a refusal (``NotApplicable`` with
torch's own warning text) instead of a silent fallback to another kernel.

Translation of a ``Case`` (why each step exists):

* mask sense: torch's boolean ``attn_mask`` means *may attend*; the suite's means *blocked*, so the
  adapter passes ``~mask``.
* torch refuses ``is_causal=True`` together with ``attn_mask`` (math backend: "Explicit attn_mask
  should not be set when is_causal=True"; the CPU flash path silently accepts it). A case with both
  gets one combined mask built here: the causal part in this adapter's declared alignment
  (top-left: query i may see keys j <= i), OR-ed with the blocked mask.
* a boolean mask together with a float bias is folded into one float mask (blocked -> ``-inf``),
  since torch takes a single ``attn_mask``.
* float masks are passed as float64 for float64 cases and float32 otherwise: torch accepts a
  float32 mask with half/bfloat16 queries, and rounding the bias to 8 mantissa bits would be the
  adapter's error, not the kernel's.
* ``enable_gqa=True`` is passed only when Hq != Hkv. Masks are passed with their own (broadcast)
  shape, not expanded: a kernel that mishandles broadcasting must be seen doing so.
* dropout: the generators seeded with ``case.seed`` (``_torch.manual_seed``) before every call with
  dropout, so ``vjp`` (which re-runs the forward) draws the same dropout mask as ``forward``; without
  dropout the caller's generator is left as it was.
* the case's own memory and presentation reach torch (``_torch.Arguments``, ``_torch.forward`` and
  ``_torch.vjp``): strides, offsets, shared buffers, one object for two arguments, which inputs ask
  for a gradient, the autograd context, a second backward.

Measured on this build (torch 2.13.0+cpu, 2 threads; tests/test_adapter_declarations.py re-measures):

* CPU, default / MATH / FLASH_ATTENTION alike: all four dtypes accepted and returned; fully
  blocked rows give exact zeros and finite gradients, with a boolean mask and with an all ``-inf``
  float mask; ``is_causal`` with T != S is aligned top-left; GQA query head h reads kv head
  ``h // (Hq/Hkv)``; repeated calls are bitwise equal (forward and backward); a batch item's output
  is bitwise the same alone and inside a batch of 4 (T=300, S=700, D=64 and smaller); head dims up
  to 1024 run.
* CPU FLASH_ATTENTION refuses dropout ("Both fused kernels do not support non-zero dropout.") and
  Dk != Dv ("Flash attention requires q,k,v to have the same last dimension."); the default
  backend routes those cases to MATH (``torch._fused_sdp_choice`` reports 0 = math for dropout).
* input validation (000 §8's preconditions, measured by calling F.scaled_dot_product_attention
  directly, 2026-12-05): integer and mixed dtypes, a key feature dim or head count that does not fit
  the query's, GQA heads without ``enable_gqa`` and masks that do not broadcast are refused
  (RuntimeError). Two acceptances are torch's on purpose and declared (``accepts_invalid``): leading
  batch dims are "any number of other batch dimensions" (its docstring's shape legend, ``(N, ...,
  Hq, L, E)``) and broadcast as the documented equivalent code's ``query @ key.transpose(-2, -1)``
  does: a 5-D key [1, 2, 2, 5, 8] against a 4-D query gives a 5-D output, a 3-D query or a key and
  value of batch 1 are read for every batch item (on MATH equal to the same call with the inputs
  expanded, difference 0.0); the fused kernels decline both ("To broadcast dense inputs, try using
  unsqueeze and expand_to before passing them into the kernel"). Two are bugs, in
  implementations/expectations/: the default and FLASH paths run a value shorter than the key
  (MATH refuses it), and MATH takes ``dropout_p=-0.1`` as no dropout.
* a forced backend's refusal ("No available kernel") is raised as ``NotApplicable`` only when the
  MATH backend takes the same inputs; when MATH rejects them too (6 query heads against 4 kv heads)
  the inputs are invalid, and torch's RuntimeError is kept: a rejection, not a refusal.
* default and FLASH fail on masks of rank < 2 (IndexError "Dimension out of range"), MATH accepts
  them; the adapter does not paper over this.

CUDA adapters: not yet run on a CUDA device. Their
declarations are read from torch's backend filters (aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp: flash = fp16/bf16, no attn_mask, head dim <= 256 and Dk == Dv, no causal with
T != S; efficient = fp16/fp32/bf16, masks allowed; cuDNN = fp16/bf16, head dim multiple of 8,
dropout in steps of 1/16, not deterministic) and are re-measured by the CUDA declaration tests.

Longer than 250 lines because every backend, CPU and CUDA, is the same adapter with one backend
forced: the translation of a Case must be the same for all of them.
"""

from __future__ import annotations

import re
import warnings
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.contract import DTYPES, LOW_PRECISION, Case, Declaration, NotApplicable, capabilities
from implementations import _torch, _torch_contexts
from implementations._torch import TORCH_DTYPES, manual_seed, qkv, sdpa_kwargs, to_numpy, to_torch

__all__ = [
    "TorchSDPA",
    "cpu_default",
    "cpu_math",
    "cpu_flash",
    "cuda_default",
    "cuda_flash",
    "cuda_efficient",
    "cuda_cudnn",
    "cuda_math",
]

# torch prefixes each backend's list of reasons with one of these warnings (select_sdp_backend).
_REASON_HEADERS: dict[SDPBackend, str] = {
    SDPBackend.FLASH_ATTENTION: "Flash attention kernel not used because",
    SDPBackend.EFFICIENT_ATTENTION: "Memory efficient kernel not used because",
    SDPBackend.CUDNN_ATTENTION: "cuDNN attention kernel not used because",
}
_ANY_HEADER = re.compile(r"kernel not used because:?\s*$")
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?\s*$")
_REFUSALS = ("No available kernel", "No viable backend for scaled_dot_product_attention")


def _refusal_reason(messages: list[str], backend: SDPBackend | None, error: str) -> str:
    """torch's own sentences saying why ``backend`` refused, without the other backends' noise."""
    lines = [_TRIGGERED.sub("", m).strip() for m in messages]
    header = _REASON_HEADERS.get(backend) if backend is not None else None
    picked: list[str] = []
    if header is not None:
        inside = False
        for line in lines:
            if line.startswith(header):
                inside = True
                continue
            if inside and _ANY_HEADER.search(line):
                break
            if inside and line and "runtime disabled" not in line:
                picked.append(line)
    if not picked:
        picked = [l for l in lines if l and not _ANY_HEADER.search(l) and "runtime disabled" not in l]
    reason = " ".join(picked) if picked else error.strip()
    name = backend.name if backend is not None else "default"
    return f"torch SDPA backend {name} refused the case: {reason}"


class TorchSDPA:
    """``F.scaled_dot_product_attention`` on one device, optionally forced to one backend."""

    def __init__(
        self,
        name: str,
        declaration: Declaration,
        device: str = "cpu",
        backend: SDPBackend | None = None,
    ) -> None:
        self.name = name
        self.declaration = declaration
        self.device = device
        self.backend = backend
        self._unavailable: str | None | bool = False  # False = not probed yet
        # The release its CPU declarations and regression baselines were measured with (constraints.txt pins
        # it); the verdict line names an installed release that differs. The CUDA adapters are not yet run.
        self.measured_with = {"torch": "2.13.0"} if device == "cpu" else {}

    def __repr__(self) -> str:
        return f"TorchSDPA({self.name!r}, device={self.device!r}, backend={self.backend})"

    def contexts(self) -> tuple[str, ...]:
        """The caller's contexts this adapter applies around its kernel (Presentation.context), from torch's API."""
        return _torch_contexts.names(self.device)

    # -- availability -------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        if self._unavailable is False:
            self._unavailable = self._probe()
        return self._unavailable  # type: ignore[return-value]

    def _probe(self) -> str | None:
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return "no CUDA device: torch.cuda.is_available() is False"
        if self.backend is None or self.backend == SDPBackend.MATH:
            return None
        # A tiny case every backend's filters accept (half precision, head dim 64, S > 1), so a
        # refusal here means the backend itself is missing on this build/device, not this case.
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        q = torch.zeros(1, 1, 16, 64, dtype=dtype, device=self.device)
        try:
            self._run(q, q, q, {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None})
        except NotApplicable as e:
            return f"backend {self.backend.name} unusable on {self.device}: {e}"
        return None

    # -- running ------------------------------------------------------------------------------
    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The function under test (implementations/torch_compile.py: torch.compile of it)."""
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    def _context(self):
        """The forced backend around one kernel call (one thread at a time: ``_torch_contexts.forced_backend``)."""
        return nullcontext() if self.backend is None else _torch_contexts.forced_backend(self.backend)

    def _outer(self):
        """The forced backend around a whole forward and backward (the backward in it too), without the lock: the
        call inside may run on another thread (the caller's ``thread`` context) and take the lock there."""
        return nullcontext() if self.backend is None else sdpa_kernel(self.backend)

    def _run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self._context():
                    return self._sdpa(q, k, v, **kwargs)
            except RuntimeError as e:
                if any(r in str(e) for r in _REFUSALS):
                    messages = [str(w.message) for w in caught]
                    reason = _refusal_reason(messages, self.backend, str(e))
                    invalid = self._math_rejects(q, k, v, kwargs)
                    if invalid is not None:  # not beyond this backend: invalid for every backend
                        raise RuntimeError(f"{reason} (the MATH backend rejects the same inputs: {invalid})") from e
                    raise NotApplicable(reason) from e
                raise

    def _math_rejects(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> str | None:
        """Why torch's reference backend rejects these inputs too, or None when it takes them.

        A forced backend answers "No available kernel" both for inputs it cannot handle (dropout on
        FLASH: a capability, so ``NotApplicable``) and for inputs no backend may answer (6 query
        heads against 4 kv heads: a rejection, torch's RuntimeError). MATH implements every valid
        input, so its verdict tells the two apart; it runs only on the refusal path.
        """
        if self.backend is None or self.backend == SDPBackend.MATH:
            return None
        try:
            with warnings.catch_warnings(), torch.no_grad(), _torch_contexts.forced_backend(SDPBackend.MATH):
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), **kwargs)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None

    def _presented(self, case: Case, args: _torch.Arguments) -> torch.Tensor:
        if case.dropout_p:  # only then: without dropout the caller's generator is the kernel's to leave alone
            manual_seed(case.seed)
        return self._run(*args.qkv(case), sdpa_kwargs(case, self.device, args=args))

    def forward(self, case: Case) -> np.ndarray:
        return _torch.forward(case, self.device, lambda args: self._presented(case, args))

    # -- the performance profile's optional half of the contract (conformance/contract.py) -------
    framework = "torch"

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def prepare(self, case: Case) -> tuple:
        """Inputs (and mask) on the device once, so that ``run`` times the kernel alone."""
        return qkv(case, self.device), sdpa_kwargs(case, self.device), case.seed

    def run(self, handle: tuple) -> torch.Tensor:
        (q, k, v), kwargs, seed = handle
        manual_seed(seed)
        with torch.no_grad():
            out = self._run(q, k, v, kwargs)
        self._sync()
        return out

    def fetch(self, result: torch.Tensor) -> np.ndarray:
        return to_numpy(result)

    def prepare_backward(self, case: Case, grad_out: np.ndarray) -> tuple:
        q, k, v = qkv(case, self.device, requires_grad=True)
        g = to_torch(grad_out, self.device)
        return (q, k, v), sdpa_kwargs(case, self.device), case.seed, g

    def run_backward(self, handle: tuple) -> tuple:
        (q, k, v), kwargs, seed, g = handle
        manual_seed(seed)
        with torch.enable_grad():
            out = self._run(q, k, v, kwargs)
            with self._outer():
                grads = torch.autograd.grad(out, (q, k, v), grad_outputs=g.to(out.dtype))
        self._sync()
        return grads

    def device_times(self, handle: tuple, n: int, backward: bool = False) -> list[float]:
        """CUDA: per-call times from CUDA events recorded around each call, read after a synchronise;
        on the CPU there are no device timestamps and wall time around ``run`` is used instead."""
        call = self.run_backward if backward else self.run
        if not self.device.startswith("cuda"):
            import time

            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                call(handle)
                times.append(time.perf_counter() - t0)
            return times
        pairs = []
        for _ in range(n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(handle)
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) / 1e3 for s, e in pairs]

    def kernel_ran(self, case: Case) -> tuple[str | None, str]:
        """The SDPA op torch dispatched to, as its profiler saw it (the backend's own aten op)."""
        from torch.profiler import ProfilerActivity, profile

        handle = self.prepare(case)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self.run(handle)
        ops = sorted({e.key for e in prof.key_averages() if "scaled_dot_product" in e.key})
        for op in ops:
            for marker, name in _BACKEND_OPS:
                if marker in op:
                    return name, f"torch profiler saw {', '.join(ops)}"
        return None, f"torch profiler saw no backend op of SDPA (ops: {', '.join(ops) or 'none'})"

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple:
        with self._outer():  # the backward in the forced backend too
            return _torch.vjp(case, grad_out, self.device, lambda args: self._presented(case, args))

    # the transforms a caller applies to torch's SDPA (conformance/contract.py), in the forced backend too
    transforms = _torch.TRANSFORMS

    def jvp(self, case: Case, tangents: dict) -> tuple:
        with self._outer():
            return _torch.jvp(case, tangents, self.device, lambda args: self._presented(case, args))

    def vjp_vjp(self, case: Case, grad_out: np.ndarray, w: tuple) -> tuple:
        with self._outer():
            return _torch.vjp_vjp(case, grad_out, w, self.device, lambda args: self._presented(case, args))

    def jvp_vjp(self, case: Case, grad_out: np.ndarray, tangents: dict) -> tuple:
        with self._outer():
            return _torch.jvp_vjp(case, grad_out, tangents, self.device, lambda args: self._presented(case, args))

    def vmap_forward(self, cases: list[Case]) -> np.ndarray:
        with self._outer():
            return _torch.vmap_forward(cases, self.device, lambda args: self._presented(cases[0], args))

    def vmap_vjp(self, cases: list[Case], grad_outs: list[np.ndarray]) -> tuple:
        with self._outer():
            return _torch.vmap_vjp(cases, grad_outs, self.device, lambda args: self._presented(cases[0], args))

    def fake_forward(self, case: Case) -> tuple:
        with self._outer():
            return _torch.fake_forward(case, self.device, lambda args: self._presented(case, args))


# The aten op each SDPA backend dispatches to (torch 2.13), and the backend name adapters declare.
_BACKEND_OPS = (
    ("_scaled_dot_product_flash_attention", "flash"),  # CUDA and (…_for_cpu) CPU flash
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_attention_math", "math"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
)

_ALL = frozenset(TORCH_DTYPES)
_HALF = LOW_PRECISION

# The name a forced backend is declared by (Declaration.backend): the one kernel_ran reports for its
# aten op (_BACKEND_OPS above).
_DECLARED_BACKEND = {
    SDPBackend.MATH: "math",
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.EFFICIENT_ATTENTION: "efficient",
    SDPBackend.CUDNN_ATTENTION: "cudnn",
}


def _forced(name: str, base: Declaration, backend: SDPBackend, **changes: Any) -> TorchSDPA:
    """The adapter forced to ``backend`` on ``base``'s device: ``base`` (the CPU or CUDA declaration)
    with ``changes``, claiming that backend.

    Why: each forced adapter used to say its backend twice (the SDPBackend that forces it, the name
    its declaration claims) and its device twice (the declaration's, the adapter's); said once here,
    the two cannot disagree."""
    return TorchSDPA(
        name, base.replace(backend=_DECLARED_BACKEND[backend], **changes), device=base.device, backend=backend
    )


_CPU = Declaration(
    **capabilities(dtypes=_ALL, bias_grad=True),
    presents=_torch.PRESENTS,
    causal_alignment="top-left",
    all_blocked="zeros",
    mask_sense="attend",
    masks_combined=True,  # sdpa_kwargs: a boolean mask and an additive M become one attn_mask
    gqa_flag=True,  # enable_gqa
    # torch's documented leading batch dims, broadcast as its equivalent code's `@` does (the module docstring)
    accepts_invalid=frozenset({"rank", "batch"}),
    batch_invariant=True,
    notes=(
        "torch 2.13 CPU, backend chosen by torch (flash for most cases; math for dropout and "
        "Dk != Dv). Measured: all-blocked rows (bool or all -inf float mask) -> zeros with finite "
        "grads; is_causal top-left when T != S; GQA head h -> kv head h // (Hq/Hkv); bitwise "
        "repeatable and batch invariant. Causal + mask is combined into one top-left mask by the "
        "adapter (torch refuses both together). Masks of rank < 2 crash this path (IndexError). Accepts on purpose "
        "(declared): leading batch dims of any number ((N, ..., Hq, L, E)), broadcast like its equivalent code's "
        "query @ key^T (a 3-D query, a 5-D key, a key and value of batch 1 against 2)."
    ),
)

cpu_default = TorchSDPA("torch-sdpa", _CPU)

cpu_math = _forced(
    "torch-sdpa-math",
    _CPU,
    SDPBackend.MATH,
    notes=(
        "torch 2.13 CPU, SDPBackend.MATH forced. Measured like torch-sdpa: zeros for all-blocked "
        "rows, top-left causal, GQA h // (Hq/Hkv), bitwise repeatable, batch invariant; accepts "
        "dropout, Dk != Dv and masks of any broadcastable rank."
    ),
)

cpu_flash = _forced(
    "torch-sdpa-flash",
    _CPU,
    SDPBackend.FLASH_ATTENTION,
    dropout=False,
    requires_dk_eq_dv=True,
    unit_last_stride=True,
    bias_grad=False,  # "No available kernel" for a float mask that asks for its gradient
    memory_scaling="linear",
    notes=(
        "torch 2.13 CPU, SDPBackend.FLASH_ATTENTION forced. Refuses Q, K, V strided along the feature "
        "axis ('All fused kernels require the last dimension of the input to have stride 1'). Measured: "
        "all four dtypes, bool and "
        "float masks, GQA, head dims up to 1024; refuses dropout ('Both fused kernels do not "
        "support non-zero dropout.') and Dk != Dv; refusals are raised as NotApplicable with "
        "torch's reason, so are the leading batch dims torch accepts on purpose (a 3-D query, a 5-D key, a key "
        "batch of 1 against 2: 'All fused kernels requires query, key and value to be 4 dimensional'). "
        "Zeros for all-blocked rows, top-left causal, repeatable, batch invariant. "
        "Peak extra memory of a forward grows linearly in S at T = S (MEM-SCALING-01: exponent ~0.3 "
        "from 512 to 2048, against 2 for a materialised T x S matrix)."
    ),
)

_CUDA_UNMEASURED = (
    "Not yet run on a CUDA device: declared from torch 2.13's sdp_utils.cpp backend filters; "
    "tests/test_adapter_declarations.py re-measures it on a CUDA machine. "
)

_CUDA = _CPU.replace(
    device="cuda",
    deterministic=False,
    batch_invariant=False,
    notes=_CUDA_UNMEASURED + "Backend chosen by torch (cuDNN/flash/efficient/math by its priority order).",
)

cuda_default = TorchSDPA("torch-sdpa-cuda", _CUDA, device="cuda")

cuda_math = _forced(
    "torch-sdpa-cuda-math",
    _CUDA,
    SDPBackend.MATH,
    notes=_CUDA_UNMEASURED + "SDPBackend.MATH forced: same composite code as the CPU math path.",
)

cuda_flash = _forced(
    "torch-sdpa-cuda-flash",
    _CUDA,
    SDPBackend.FLASH_ATTENTION,
    dtypes=_HALF,
    bool_mask=False,
    float_mask=False,
    max_head_dim=256,
    requires_dk_eq_dv=True,
    memory_scaling="linear",
    notes=_CUDA_UNMEASURED + "SDPBackend.FLASH_ATTENTION forced: fp16/bf16 on sm80+, no attn_mask, Dk == Dv <= 256; "
    "is_causal with T != S is refused (torch will not expose FlashAttention-2's bottom-right "
    "alignment), so every causal case it runs is square and the alignment is moot.",
)

cuda_efficient = _forced(
    "torch-sdpa-cuda-efficient",
    _CUDA,
    SDPBackend.EFFICIENT_ATTENTION,
    dtypes=frozenset(DTYPES) - {"float64"},
    memory_scaling="linear",
    notes=_CUDA_UNMEASURED + "SDPBackend.EFFICIENT_ATTENTION forced: fp16/fp32/bf16, bool and float masks, Dk == Dq, "
    "head dims aligned to 4 (fp32) or 8 (half); causal uses the top-left mask type.",
)

cuda_cudnn = _forced(
    "torch-sdpa-cuda-cudnn",
    _CUDA,
    SDPBackend.CUDNN_ATTENTION,
    dtypes=_HALF,
    max_head_dim=128,
    memory_scaling="linear",
    notes=_CUDA_UNMEASURED
    + "SDPBackend.CUDNN_ATTENTION forced: fp16/bf16 on sm80+, head dims multiple of 8 and <= 128 "
    "(256 on sm90/sm100 with new cuDNN), S > 1, dropout only in multiples of 1/16; torch calls "
    "it non-deterministic.",
)

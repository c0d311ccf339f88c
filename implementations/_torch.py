"""NumPy <-> torch conversion shared by the torch adapters.

bfloat16 crosses the boundary through float32, which holds every bfloat16 value exactly, so the
conversion never changes a number. Inputs are copied: a kernel that writes into its inputs must not
be able to reach the suite's arrays through shared memory (the harness checks for that separately).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import numpy as np
import torch

from conformance.contract import LOW_PRECISION, Case, np_dtype
from implementations._masks import causal_blocked

TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_ACCELERATORS = ("cuda", "xpu", "mps", "mtia")


@functools.cache
def _has_accelerator() -> bool:
    return any(getattr(getattr(torch, n, None), "is_available", lambda: False)() for n in _ACCELERATORS)


def manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``, without its cost where no accelerator exists: there it still
    queues a lazy seed for CUDA, XPU and MTIA, each with a formatted stack of the caller (1 ms a
    call at the depth a clause runs at, about 2 s of a CPU certification). With no accelerator
    only the CPU generator can draw a dropout mask; with one, torch's own call seeds them all."""
    if _has_accelerator():
        torch.manual_seed(seed)
    else:
        torch.random.default_generator.manual_seed(seed)


# torch.compile compiles at most ``torch._dynamo.config.recompile_limit`` (8) programs for one function
# and then runs every new input structure eagerly, with a warning (torch 2.13: the ninth shape ran in
# 0.04 s against 0.5 s for each compiled one). A certification gives a kernel hundreds of structures;
# under that limit it would certify the eager function after the eighth.
RECOMPILE_LIMIT = 1 << 20


def compiled_throughout(fn: Any = None) -> Any:
    """A context in which a ``torch.compile``d ``fn`` (or, without ``fn``, any) compiles every new
    structure it meets instead of falling back to eager: dynamo's recompile limits raised for the call
    only (``torch._dynamo.config.patch``). For a function torch.compile did not wrap, nothing."""
    if fn is not None and getattr(fn, "_torchdynamo_orig_callable", None) is None:
        return contextlib.nullcontext()
    import torch._dynamo

    # inductor's compile threads warn that torch.jit.script_method is deprecated, once per compilation and
    # outside any test's capture (torch 2.13): torch's own call, nothing the kernel's author can act on.
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning)

    return torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=RECOMPILE_LIMIT)


def to_torch(a: np.ndarray, device: str = "cpu", requires_grad: bool = False) -> torch.Tensor:
    a = np.asarray(a)
    # A broadcast (stride 0) axis stays one: its one stored slice is copied and expanded, as a user's
    # tensor.expand() would be (a copy of the whole array with order="K" would make that axis the
    # innermost and hand the kernel a last dimension whose stride is not 1).
    wide = [i for i, (n, s) in enumerate(zip(a.shape, a.strides)) if s == 0 and n > 1]
    src = a[tuple(slice(0, 1) if i in wide else slice(None) for i in range(a.ndim))] if wide else a
    # order="K" keeps a permuted layout (e.g. [B,T,H,D] viewed as [B,H,T,D]) so that kernels meet
    # the non-contiguous strides a clause built on purpose; the copy keeps the suite's arrays safe.
    if src.dtype == np_dtype("bfloat16"):
        t = torch.from_numpy(np.array(src, dtype=np.float32, order="K")).to(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(src, copy=True, order="K"))
    if t.ndim and t.shape[-1] == 1 and t.stride(-1) != 1:
        # NumPy gives a length-1 axis any stride and order="K" may keep it; a user's tensor has stride 1
        # there (torch's fused kernels refuse anything else, even for a dimension of one element).
        t = t.as_strided(t.shape, (*t.stride()[:-1], 1))
    t = t.to(device)
    if wide:
        t = t.expand(a.shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Back to NumPy in the tensor's own dtype: a kernel that returns the wrong dtype stays wrong."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(np_dtype("bfloat16"))
    return t.numpy().copy()


def qkv(case: Case, device: str = "cpu", requires_grad: bool = False):
    return tuple(to_torch(x, device, requires_grad) for x in (case.query, case.key, case.value))


def mask_tensor(mask: np.ndarray, device: str = "cpu", invert: bool = False) -> torch.Tensor:
    """A boolean mask (``~mask`` when ``invert``) as a torch tensor in its own rank, its stride-0 axes
    still expanded: a user's ``mask[:, None].expand(B, H, T, S)`` reaches the kernel as that view (a
    contiguous copy would test another input)."""
    mask = np.asarray(mask, dtype=bool)
    wide = [i for i, (n, s) in enumerate(zip(mask.shape, mask.strides)) if s == 0 and n > 1]
    src = mask[tuple(slice(0, 1) if i in wide else slice(None) for i in range(mask.ndim))]
    return to_torch(np.broadcast_to(~src if invert else src, mask.shape), device)


def blocked_mask(case: Case, device: str = "cpu") -> torch.Tensor | None:
    """The case's mask in the suite's convention (True = blocked), as a torch bool tensor."""
    if case.mask is None:
        return None
    return torch.from_numpy(np.array(case.mask, dtype=bool)).to(device)


def dtype_of(t: torch.Tensor) -> str:
    return _NAMES.get(t.dtype, str(t.dtype))


def sdpa_kwargs(
    case: Case,
    device: str,
    alignment: str = "top-left",
    half_bias: str = "float32",
    mask_sense: str = "attend",
    fold_causal: bool = True,
) -> dict[str, Any]:
    """The keyword arguments of a ``torch.nn.functional.scaled_dot_product_attention``-style call.

    Why each step: torch's boolean mask means *may attend*, the suite's means *blocked* (``~mask``);
    torch refuses ``is_causal`` together with ``attn_mask`` (2.13 CPU: on its math path), so a causal case with a mask
    gets the causal part folded into the mask, in the kernel's declared ``alignment`` (a causal case
    without a mask passes ``is_causal=True`` through: that is the kernel's own alignment under
    test); with ``fold_causal=False`` such a case passes ``is_causal=True`` *and* the mask, for a
    callee that takes both (the causal part is then the callee's own, in its own alignment); a
    boolean mask together with a float bias becomes one float mask with ``-inf``.
    ``half_bias`` is the dtype of a float mask for float16/bfloat16 cases: "float32" keeps the bias
    exact (torch accepts it), "query" matches the query dtype for functions that insist.
    ``mask_sense`` is the callee's boolean convention: "attend" (torch's) gets ``~mask``, "blocked"
    (nn.MultiheadAttention's, the spec's) gets the mask as it is. ``enable_gqa`` is passed only when
    Hq != Hkv.
    """
    mask = None if case.mask is None else np.asarray(case.mask, dtype=bool)
    bias = None if case.bias is None else np.asarray(case.bias, dtype=np.float64)
    is_causal = bool(case.is_causal)
    if fold_causal and is_causal and (mask is not None or bias is not None):
        causal = causal_blocked(case.T, case.S, alignment)
        mask = causal if mask is None else (mask | causal)
        is_causal = False
    attn_mask = None
    if bias is not None:
        if mask is not None:
            bias = np.where(mask, -np.inf, bias)
        if case.dtype == "float64":
            bias_dtype = torch.float64
        elif case.dtype in LOW_PRECISION and half_bias == "query":
            bias_dtype = TORCH_DTYPES[case.dtype]
        else:
            bias_dtype = torch.float32
        attn_mask = torch.from_numpy(np.ascontiguousarray(bias)).to(device=device, dtype=bias_dtype)
    elif mask is not None:
        attn_mask = mask_tensor(mask, device, invert=mask_sense == "attend")
    kwargs: dict[str, Any] = {
        "attn_mask": attn_mask,
        "dropout_p": float(case.dropout_p),
        "is_causal": is_causal,
        "scale": case.scale,
    }
    if case.Hq != case.Hkv:
        kwargs["enable_gqa"] = True
    return kwargs

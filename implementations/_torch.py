"""NumPy <-> torch conversion shared by the torch adapters.

bfloat16 crosses the boundary through float32, which holds every bfloat16 value exactly, so the
conversion never changes a number. Inputs are copied: a kernel that writes into its inputs must not
be able to reach the suite's arrays through shared memory (the harness checks for that separately).
"""

from __future__ import annotations

import numpy as np
import torch

from conformance.contract import Case, np_dtype

TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def to_torch(a: np.ndarray, device: str = "cpu", requires_grad: bool = False) -> torch.Tensor:
    a = np.asarray(a)
    # order="K" keeps a permuted layout (e.g. [B,T,H,D] viewed as [B,H,T,D]) so that kernels meet
    # the non-contiguous strides a clause built on purpose; the copy keeps the suite's arrays safe.
    if a.dtype == np_dtype("bfloat16"):
        t = torch.from_numpy(np.array(a, dtype=np.float32, order="K")).to(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(a, copy=True, order="K"))
    t = t.to(device)
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


def blocked_mask(case: Case, device: str = "cpu") -> torch.Tensor | None:
    """The case's mask in the suite's convention (True = blocked), as a torch bool tensor."""
    if case.mask is None:
        return None
    return torch.from_numpy(np.array(case.mask, dtype=bool)).to(device)


def dtype_of(t: torch.Tensor) -> str:
    return _NAMES.get(t.dtype, str(t.dtype))

"""The floor: the two GEMMs of the row's shapes, through the kernel's own framework, on its device.

Attention cannot cost less than Q K^T and P V (4 B Hq T S D flops in all); the time this framework
takes for exactly those two products, measured in the same run on the same device, is the figure a
kernel's latency is divided by ("x floor", 1.0 = nothing beyond the two GEMMs). GQA rows multiply
the Hq / Hkv query heads that share a kv head as one operand, so K and V are read once per kv head,
as a GQA kernel reads them. The backward floor is taken as three times the forward's (forward
recomputed, then four GEMMs of the same shapes: dV, dP, dQ, dK), measured once.

The GEMMs run in the dtype the framework multiplies the row's dtype in: the row's own on torch
and jax, except where the framework cannot (NumPy has no half-precision BLAS, XLA:CPU no float16
dot), where float32 is used and the floor says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.harness.perf.grid import Row

BACKWARD_FACTOR = 3.0


def _shapes(row: Row) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    g = row.Hq // row.Hkv
    return (row.B, row.Hkv, g * row.T, row.D), (row.B, row.Hkv, row.D, row.S), (row.B, row.Hkv, row.S, row.D)


def numpy_floor(row: Row) -> tuple[Callable[[], Any], str]:
    dtype = np.float64 if row.dtype == "float64" else np.float32
    rng = np.random.default_rng(0)
    qs, ks, vs = _shapes(row)
    q, kt, v = (rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in (qs, ks, vs))
    p = np.empty(qs[:3] + (row.S,), dtype=dtype)

    def call() -> Any:
        np.matmul(q, kt, out=p)
        return p @ v

    return call, f"numpy.matmul in {np.dtype(dtype).name}"


def torch_floor(row: Row, device: str) -> tuple[Callable[[], Any], str]:
    import torch

    dtype = getattr(torch, row.dtype)  # the contract's dtype names are torch's
    qs, ks, vs = _shapes(row)
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, kt, v = (torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in (qs, ks, vs))
    cuda = device.startswith("cuda")

    def call() -> Any:
        out = torch.matmul(torch.matmul(q, kt), v)
        if cuda:
            torch.cuda.synchronize(device)
        return out

    return call, f"torch.matmul in {row.dtype} on {device}"


def jax_floor(row: Row) -> tuple[Callable[[], Any], str]:
    import jax
    import jax.numpy as jnp

    from conformance.contract import np_dtype

    name = row.dtype
    if name == "float16" and jax.default_backend() == "cpu":
        name = "float32"  # XLA:CPU cannot compile a float16 dot (F16_F16_F32), see implementations/jax_attention.py
    qs, ks, vs = _shapes(row)
    rng = np.random.default_rng(0)
    with jax.enable_x64(name == "float64"):
        q, kt, v = (jnp.asarray(rng.standard_normal(s, dtype=np.float32).astype(np_dtype(name))) for s in (qs, ks, vs))
        fn = jax.jit(lambda a, b, c: jnp.matmul(jnp.matmul(a, b), c))

        def call() -> Any:
            with jax.enable_x64(name == "float64"):
                return fn(q, kt, v).block_until_ready()

    return call, f"jax.numpy.matmul (jitted) in {name} on {jax.default_backend()}"


def floor_call(row: Row, framework: str, device: str) -> tuple[Callable[[], Any], str]:
    """A zero-argument call doing the row's two GEMMs, and what it is, in words."""
    if framework == "torch":
        return torch_floor(row, device)
    if framework == "jax":
        return jax_floor(row)
    return numpy_floor(row)

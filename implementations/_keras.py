"""What the three keras adapters share: loading keras 3 and one backend's ``nn`` module, the layout,
and what an adapter object needs besides its call (:class:`KerasAdapter`).

keras picks ONE backend per process from ``KERAS_BACKEND`` (default ``tensorflow``), at its first
import. The adapters do not need that global choice: each calls its backend's own module,
``keras.src.backend.<numpy|jax|torch>.nn.dot_product_attention``, which is the function
``keras.ops.dot_product_attention`` dispatches to for a user of that backend, and the three modules
import and run side by side in one process whatever the global backend is (measured: keras 3.15.1,
each backend under each of ``KERAS_BACKEND=numpy|jax|torch``, outputs within 5e-7 of each other).
When ``KERAS_BACKEND`` is unset and keras is not imported yet, it is set to ``numpy`` (the one
backend that needs no framework of its own) so that importing keras cannot fail for want of
tensorflow; a value the user set is kept.

The modules are looked up in ``sys.modules`` (``importlib.import_module``), not by attribute:
under ``KERAS_BACKEND=numpy``, ``keras.src.backend.numpy`` is rebound to its ``numpy`` submodule,
and ``import keras.src.backend.numpy.nn`` fails ("cannot import name 'nn'").

Layout: keras takes [B, T, N, H] (the contract speaks [B, N, T, H]); q, k, v are transposed and made
contiguous, as a keras user's arrays are, and the output transposed back. Masks and biases keep
[B, N, T, S], keras's own order for them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from types import ModuleType

import numpy as np

from conformance.contract import Case, Declaration, NotApplicable

KERAS_DTYPES = frozenset({"float32", "float16", "bfloat16"})

# keras (non-tensorflow backends) turns every 64-bit float into float32 before computing:
# keras.src.backend.common.dtypes.BIT64_TO_BIT32_DTYPE ("to be aligned with JAX's default behavior").
# keras casts query, key and value to one compute dtype, ``backend.result_type(query.dtype, key.dtype,
# value.dtype)``, its documented type promotion (keras.ops.result_type), before any backend computes: a key of
# another float dtype than the query's is taken on purpose (measured, keras 3.15.1, query float32 and key
# float64 on the numpy and torch backends: a float32 output within 2.1e-07 of the float64 reference).
ACCEPTS_INVALID = frozenset({"mixed-dtype"})
ACCEPTS_INVALID_NOTE = "Accepts on purpose (declared): a key in another float dtype, cast to keras's result_type."

FLOAT64_REASON = (
    "keras 3 casts float64 inputs to float32 on its numpy, jax and torch backends "
    "(keras.src.backend.common.dtypes.BIT64_TO_BIT32_DTYPE) and returns float32: it has no float64 attention"
)


def load(backend: str) -> tuple[ModuleType | None, ModuleType | None, str | None]:
    """(keras, keras.src.backend.<backend>.nn, None) or (None, None, why not)."""
    if "keras" not in sys.modules:
        os.environ.setdefault("KERAS_BACKEND", "numpy")
    try:
        keras = importlib.import_module("keras")
        nn = importlib.import_module(f"keras.src.backend.{backend}.nn")
    except Exception as exc:  # noqa: BLE001 - ImportError, or keras failing on a backend it cannot load
        return None, None, f"cannot load keras's {backend} backend: {type(exc).__name__}: {exc}"
    return keras, nn, None


def version() -> str | None:
    try:
        return importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        return None


class KerasAdapter:
    """What the three keras adapters share: the name and declaration they are built with, the version
    line of their certificate, ``repr``, and why keras's backend cannot run here.

    A subclass names ``framework`` (keras's backend, and the library it runs on: "numpy", "jax" or
    "torch"), ``framework_version`` (that library's version) and ``load_error`` (the reason
    :func:`load` gave for that backend, None when it loaded)."""

    framework: str
    framework_version: str | None
    load_error: str | None

    def __init__(self, name: str, declaration: Declaration) -> None:
        self.name = name
        self.declaration = declaration
        self.version = f"keras {version()} ({self.framework} backend), {self.framework} {self.framework_version}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def unavailable_reason(self) -> str | None:
        return self.load_error


def check_case(case: Case) -> None:
    """Refusals of what keras's ``dot_product_attention`` has no argument or dtype for: any ``dropout_p`` but
    0 (an invalid -0.1 too: dropping it would answer a call nobody made, without dropout)."""
    if case.dropout_p:
        raise NotApplicable("keras.ops.dot_product_attention has no dropout argument")
    if case.dtype == "float64":
        raise NotApplicable(FLOAT64_REASON)


def to_keras_layout(a: np.ndarray) -> np.ndarray:
    """[B, N, T, H] -> [B, T, N, H], contiguous: the head and length axes, counted from the end, so that an
    array of another rank (a precondition clause's [N, T, H] query) reaches keras in that rank, as a user's
    would, for keras to accept or refuse."""
    return np.ascontiguousarray(np.swapaxes(np.asarray(a), -3, -2))


def from_keras_layout(a: np.ndarray) -> np.ndarray:
    """keras's [B, T, N, H] output back to [B, N, T, H] (:func:`to_keras_layout`'s inverse), contiguous."""
    return np.ascontiguousarray(np.swapaxes(np.asarray(a), -3, -2))


def attend(case: Case) -> np.ndarray | None:
    """keras's boolean mask (True = take part) from the suite's (True = blocked), in its own shape."""
    return None if case.mask is None else np.ascontiguousarray(~np.asarray(case.mask, dtype=bool))


def bias_f32(case: Case) -> np.ndarray | None:
    """The additive mask as float32 (exact for the suite's biases; keras casts it to the compute dtype)."""
    return None if case.bias is None else np.asarray(case.bias, dtype=np.float64).astype(np.float32)

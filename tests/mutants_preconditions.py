"""Kernels that accept one invalid input each: the torch reference of tests/trust_kernels.py with one
precondition of 000 §8 left unchecked, and what real code then does with the call instead of raising.

Plain functions with torch's SDPA signature behind the real FunctionAdapter, as a user certifies one.
Each is right on every valid call; on its one kind of invalid call it returns a plausible array (a
batch broadcast, a mask sliced or reshaped, the value truncated to the key's length, a dropout rate
clamped), which is the bug a caller never sees. Claimed by the PRECOND-* clause of its precondition.
And NumPy kernels that meet an empty size (T = 0) with a crash, a wrong shape or a backward that crashes
(EMPTY-SIZES-*).
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, np_dtype
from tests.mutants import BaseKernel, mutant
from tests.trust_kernels import _attention


def _fixed(name: str, q, k, v, attn_mask, dropout_p, enable_gqa):
    """The call as the kernel that skips ``name`` goes on with it (what such code does in the wild)."""
    import torch

    if name == "rank":
        q, k, v = (x.reshape((1,) * (4 - x.dim()) + tuple(x.shape)) if x.dim() < 4 else x for x in (q, k, v))
        q, k, v = (x.reshape(-1, *x.shape[-3:]) if x.dim() > 4 else x for x in (q, k, v))
    elif name in ("integer", "mixed-dtype"):
        work = q.dtype if q.is_floating_point() else torch.get_default_dtype()
        q, k, v = (x.to(work) for x in (q, k, v))
    elif name == "batch":
        k, v = (x.expand(q.shape[0], *x.shape[1:]) for x in (k, v))
    elif name == "heads":  # h % Hkv: an invented mapping for a ratio that has none
        idx = torch.arange(q.shape[1]) % k.shape[1]
        k, v = k[:, idx], v[:, idx]
    elif name == "gqa-flag":
        enable_gqa = True
    elif name == "feature":
        q = q[..., : k.shape[-1]]
    elif name == "kv-length":
        n = min(k.shape[-2], v.shape[-2])
        k, v = k[..., :n, :], v[..., :n, :]
    elif name == "mask-shape" and attn_mask is not None:
        T, S = q.shape[-2], k.shape[-2]
        if attn_mask.dim() == 2 and attn_mask.shape[0] == q.shape[0] and attn_mask.shape[0] != T:
            attn_mask = attn_mask[:, None, None, :]  # a [B, S] padding mask read as meant
        else:
            attn_mask = attn_mask[..., :T, :S]
    elif name == "mask-larger" and attn_mask is not None:
        while attn_mask.dim() > 4:
            attn_mask = attn_mask[0]
    elif name == "dropout-range":
        dropout_p = min(max(dropout_p, 0.0), 1.0)
    return q, k, v, attn_mask, dropout_p, enable_gqa


def accepting(name: str):
    """The reference that does not check precondition ``name`` and goes on as :func:`_fixed` says."""

    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q, k, v, attn_mask, dropout_p, enable_gqa = _fixed(name, q, k, v, attn_mask, dropout_p, enable_gqa)
        return _attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, skip=frozenset({name}))

    fn.__name__ = f"accepts_{name.replace('-', '_')}"
    return fn


def _register(name: str) -> None:
    mutant_name = f"accepts_{name.replace('-', '_')}"

    class Accepting:
        def __new__(cls, label: str = mutant_name):
            from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

            return FunctionAdapter(accepting(name), name=label, declaration=FUNCTION_DEFAULTS)

    Accepting.__name__ = Accepting.__qualname__ = "Accepts" + "".join(p.title() for p in name.split("-"))
    mutant(mutant_name)(Accepting)


for _name in ("rank", "integer", "mixed-dtype", "batch", "heads", "gqa-flag", "feature", "kv-length",
              "mask-shape", "mask-larger", "dropout-range"):  # fmt: skip
    _register(_name)


# -- empty sizes (EMPTY-SIZES-*): the NumPy base kernel without its "every dim positive" check ----------
class _Empty(BaseKernel):
    """The base kernel, which answers empty sizes as torch does once its positivity check is dropped."""

    def validate(self, case: Case) -> None:
        if min(*np.shape(case.query), *np.shape(case.key), *np.shape(case.value)) > 0:
            super().validate(case)


@mutant("empty_sizes_crash")
class EmptySizesCrash(_Empty):
    """A reduction over zero query rows: IndexError on T = 0 (a class no kernel declares)."""

    def forward(self, case: Case):
        if case.T == 0:
            raise IndexError("index 0 is out of bounds for axis 2 with size 0")
        return super().forward(case)


@mutant("empty_sizes_wrong_shape")
class EmptySizesWrongShape(_Empty):
    """Sizes its output from max(T, 1): one row of zeros where there should be none."""

    def forward(self, case: Case):
        if case.T == 0:
            return np.zeros((case.B, case.Hq, 1, case.Dv), dtype=np_dtype(case.dtype))
        return super().forward(case)


@mutant("empty_sizes_grad_crash")
class EmptySizesGradCrash(_Empty):
    """Answers T = 0 forward, and its backward divides by the row count: ZeroDivisionError."""

    def vjp(self, case: Case, grad_out):
        if case.T == 0:
            raise ZeroDivisionError("division by zero")
        return super().vjp(case, grad_out)


@mutant("empty_keys_nan")
class EmptyKeysNan(_Empty):
    """Answers S = 0 with 0 / 0: NaN rows where a row that sees no key is 0 (the spec's fill, torch's answer)."""

    def forward(self, case: Case):
        if case.S == 0:
            return np.full(case.out_shape, np.nan, dtype=np_dtype(case.dtype))
        return super().forward(case)

"""Certify a plain function with FlashAttention 2's signature (``--signature=flash-attn``).

``fn(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
alibi_slopes=None, deterministic=False, return_attn_probs=False)``, as ``flash_attn.flash_attn_func``:
torch tensors in the layout ``[B, T, H, D]`` (K and V with Hkv heads, Hq a multiple of Hkv, query
head h reading kv head h // (Hq // Hkv)), ``causal`` aligned **bottom-right** when T != S,
``window_size`` (left, right) with -1 for an unbounded side, ``softcap`` 0 for none, ALiBi slopes
float32 ``[H]`` or ``[B, H]``; with ``return_attn_probs=True`` it returns ``(out, softmax_lse,
S_dmask)`` with the lse ``[B, H, T]``.

This adapter only translates: the contract's case ``[B, H, T, D]`` is transposed to ``[B, T, H, D]``
(contiguous), each variant goes to its own argument, and the result comes back transposed. It
never emulates a feature the function lacks: a case with a boolean mask or an additive bias has no
argument to go to, so the declaration says ``bool_mask=False, float_mask=False`` and such clauses
are not applicable; a function that lacks an argument (an older FlashAttention without
``window_size``) is described with ``--declare window=false`` and friends, and arguments a case does
not use are not passed at all. ``dropout`` is off by default (FlashAttention's dropout draws from its
own CUDA generator, which a case cannot seed); ``lse_empty`` defaults to the definition's ``-inf``,
while FlashAttention 2's CUDA kernels write ``+inf`` there (``--declare lse_empty=+inf``), and FA2
needs ``--declare requires_dk_eq_dv=true``.

Longer than 250 lines because it is one translation, a Case into FlashAttention 2's arguments and
its answers back, for the forward, the weights and the lse; split, the two directions would drift.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.contract import Case, Declaration, NotApplicable, capabilities

FLASH_ATTN_DEFAULTS = Declaration(
    **capabilities(
        dropout=False, bool_mask=False, float_mask=False, returns_lse=True, window=True, softcap=True, alibi=True
    ),
    causal_alignment="bottom-right",
    all_blocked="zeros",
    lse_base="e",
    lse_empty="-inf",
    notes="plain function with FlashAttention 2's flash_attn_func signature",
)


def _bthd(x: np.ndarray, device: str, requires_grad: bool = False):
    """[B, H, T, D] NumPy -> contiguous [B, T, H, D] torch tensor (a copy). The head and length axes are
    counted from the end, so that an array of another rank (a precondition clause's [H, T, D] query) reaches
    the function in that rank, as a caller's would, for the function to refuse."""
    from implementations._torch import to_torch

    return to_torch(np.ascontiguousarray(np.swapaxes(np.asarray(x), -3, -2)), device, requires_grad)


class TorchFunctionAdapter:
    """What every adapter around a plain torch-tensor function shares: the function, its name, its
    declaration on its device, and why it cannot run here (no torch, or no CUDA for a CUDA device)."""

    signature = "flash-attn"  # named in the unavailable reason

    def __init__(self, fn: Callable, name: str, declaration: Declaration, device: str = "cpu") -> None:
        self.fn = fn
        self.name = name
        self.declaration = declaration.replace(device=device)
        self.device = device

    def unavailable_reason(self) -> str | None:
        try:
            import torch
        except ImportError as exc:
            return (
                f"torch is not importable ({exc}); {self.signature}-signature functions are called with torch tensors"
            )
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return "no CUDA device: torch.cuda.is_available() is False"
        return None

    def _variant_kwargs(self, case: Case) -> dict[str, Any]:
        """window_size, softcap and alibi_slopes as FlashAttention's functions take them, only those the case uses."""
        import torch

        kwargs: dict[str, Any] = {}
        if case.window is not None:
            kwargs["window_size"] = tuple(int(w) for w in case.window)
        if case.softcap:
            kwargs["softcap"] = float(case.softcap)
        if case.alibi_slopes is not None:
            slopes = np.asarray(case.alibi_slopes, dtype=np.float32)
            kwargs["alibi_slopes"] = torch.from_numpy(slopes.copy()).to(self.device)
        return kwargs


class FlashAttnFunctionAdapter(TorchFunctionAdapter):
    """Wraps ``fn`` with FlashAttention 2's ``flash_attn_func`` signature into the adapter contract."""

    def __init__(
        self, fn: Callable, name: str, declaration: Declaration = FLASH_ATTN_DEFAULTS, device: str = "cpu"
    ) -> None:
        super().__init__(fn, name, declaration, device)

    def _kwargs(self, case: Case, want_lse: bool) -> dict[str, Any]:
        """The keyword arguments for ``case``: only those the case uses beyond causal and the scale."""
        import torch

        if case.mask is not None or case.bias is not None:
            raise NotApplicable("the flash-attn signature has no mask or bias argument")
        kwargs: dict[str, Any] = {"softmax_scale": case.scale, "causal": bool(case.is_causal)}
        if case.dropout_p:
            kwargs["dropout_p"] = float(case.dropout_p)
        kwargs.update(self._variant_kwargs(case))
        if case.sinks is not None:  # not FA2's: FlashInfer's / FA3's name, passed only when a case has sinks
            sinks = np.asarray(case.sinks, dtype=np.float32)
            kwargs["sinks"] = torch.from_numpy(sinks.copy()).to(self.device)
        if want_lse:
            kwargs["return_attn_probs"] = True
        return kwargs

    def _call(self, case: Case, q, k, v, want_lse: bool = False):
        from implementations._torch import manual_seed

        kwargs = self._kwargs(case, want_lse)
        if case.dropout_p:  # only then: without dropout the caller's generator is left alone
            manual_seed(case.seed)
        return self.fn(q, k, v, **kwargs)

    @staticmethod
    def _out(res: Any):
        return res[0] if isinstance(res, (tuple, list)) else res

    def _qkv(self, case: Case, requires_grad: bool = False):
        return tuple(_bthd(x, self.device, requires_grad) for x in (case.query, case.key, case.value))

    def forward(self, case: Case) -> np.ndarray:
        import torch

        from implementations._torch import to_numpy

        with torch.no_grad():
            out = self._out(self._call(case, *self._qkv(case)))
        return to_numpy(out.transpose(-3, -2))

    def forward_with_lse(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from implementations._torch import to_numpy

        with torch.no_grad():
            res = self._call(case, *self._qkv(case), want_lse=True)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise TypeError(f"return_attn_probs=True returned {type(res).__name__}, not (out, softmax_lse, ...)")
        lse = res[1].detach().cpu().to(torch.float64).numpy().copy()  # lossless for every float dtype
        return to_numpy(res[0].transpose(-3, -2)), lse

    def vjp(self, case: Case, grad_out: np.ndarray):
        from implementations._torch import to_numpy

        q, k, v = self._qkv(case, requires_grad=True)
        out = self._out(self._call(case, q, k, v))
        out.backward(_bthd(grad_out, self.device))
        return tuple(to_numpy(t.grad.transpose(-3, -2)) for t in (q, k, v))


# -- variable lengths: flash_attn_varlen_func ------------------------------------------------------
FLASH_ATTN_VARLEN_DEFAULTS = FLASH_ATTN_DEFAULTS.replace(
    varlen=True, kv_lengths=True, notes="plain function with FlashAttention 2's flash_attn_varlen_func signature"
)


def _own_lengths(x: np.ndarray, given: np.ndarray | None) -> np.ndarray:
    """The sequence lengths of ``x`` [B, H, L, D]: ``given`` (the case's), else L for each of its own B
    sequences. Its own B and L, not the case's: a key whose batch or length differs from the query's (a
    precondition clause's bad input) is packed as what it is, and the cumulative lengths say so."""
    if given is not None:
        return np.asarray(given, dtype=np.int64)
    shape = np.shape(x)
    return np.full(shape[-4] if len(shape) >= 4 else 1, shape[-2], dtype=np.int64)


def _lengths(case: Case) -> tuple[np.ndarray, np.ndarray]:
    return _own_lengths(case.query, case.seqlens_q), _own_lengths(case.key, case.seqlens_k)


def _cu(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _packed(x: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[B, H, L, D] -> [total, H, D]: the first lengths[b] positions of each sequence (axis -4), back to back.
    Axes ahead of the batch stay (a 5-D key packs to 4-D), and an array without one is one sequence: an
    array of another rank reaches the function in another rank, for the function to refuse."""
    x = np.asarray(x)
    if x.ndim < 4:
        x = x[None]
    parts = [np.swapaxes(x[..., b, :, :n, :], -3, -2) for b, n in enumerate(lengths)]
    if not parts:  # no sequence at all (B = 0): an empty packed array, for the function to answer
        return np.zeros((*x.shape[:-4], 0, x.shape[-3], x.shape[-1]), dtype=x.dtype)
    return np.ascontiguousarray(np.concatenate(parts, axis=-3))


def _unpacked(x: np.ndarray, lengths: np.ndarray, L: int) -> np.ndarray:
    """[total, H, D] -> [B, H, L, D], positions past a sequence's length 0."""
    cu = _cu(lengths)
    out = np.zeros((len(lengths), x.shape[1], L, x.shape[2]), dtype=x.dtype)
    for b in range(len(lengths)):
        out[b, :, : lengths[b]] = np.swapaxes(x[cu[b] : cu[b + 1]], 0, 1)
    return out


class FlashAttnVarlenFunctionAdapter(FlashAttnFunctionAdapter):
    """``fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False)``, as ``flash_attn.flash_attn_varlen_func``.

    The case's sequences (``seqlens_q`` / ``seqlens_k``, or all of length T and S) are packed back to
    back into ``[total, H, D]`` with int32 cumulative lengths ``[B + 1]`` and the longest lengths;
    the packed output comes back to ``[B, H, T, Dv]`` with padded rows 0, the lse from ``[H, total_q]``
    to ``[B, H, T]``. Causal and window positions are each sequence's own (bottom-right: S_b - T_b).
    """

    def __init__(
        self, fn: Callable, name: str, declaration: Declaration = FLASH_ATTN_VARLEN_DEFAULTS, device: str = "cpu"
    ) -> None:
        super().__init__(fn, name, declaration, device)

    def _args(self, case: Case, requires_grad: bool = False):
        from implementations._torch import to_torch

        tq, sk = _lengths(case)
        q = to_torch(_packed(case.query, tq), self.device, requires_grad)
        k = to_torch(_packed(case.key, sk), self.device, requires_grad)
        v = to_torch(_packed(case.value, _own_lengths(case.value, case.seqlens_k)), self.device, requires_grad)
        cu_q, cu_k = (to_torch(_cu(n), self.device) for n in (tq, sk))
        return (q, k, v, cu_q, cu_k, int(tq.max(initial=0)), int(sk.max(initial=0))), tq, sk

    def _run(self, case: Case, args, want_lse: bool = False):
        from implementations._torch import manual_seed

        kwargs = self._kwargs(case, want_lse)
        if case.dropout_p:  # only then: without dropout the caller's generator is left alone
            manual_seed(case.seed)
        return self.fn(*args, **kwargs)

    def forward(self, case: Case) -> np.ndarray:
        import torch

        from implementations._torch import to_numpy

        args, tq, _ = self._args(case)
        with torch.no_grad():
            out = self._out(self._run(case, args))
        return _unpacked(to_numpy(out), tq, case.T)

    def forward_with_lse(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        import torch

        from implementations._torch import to_numpy

        args, tq, _ = self._args(case)
        with torch.no_grad():
            res = self._run(case, args, want_lse=True)
        if not isinstance(res, (tuple, list)) or len(res) < 2:
            raise TypeError(f"return_attn_probs=True returned {type(res).__name__}, not (out, softmax_lse, ...)")
        lse = res[1].detach().cpu().to(torch.float64).numpy()  # [H, total_q]
        packed = np.ascontiguousarray(lse.T)[:, :, None]  # [total_q, H, 1]
        full = _unpacked(packed, tq, case.T)[..., 0]
        pad = np.arange(case.T)[None, None, :] >= tq[:, None, None]
        full[np.broadcast_to(pad, full.shape)] = -np.inf  # padded rows: no part of the result
        return _unpacked(to_numpy(res[0]), tq, case.T), full

    def vjp(self, case: Case, grad_out: np.ndarray):
        from implementations._torch import to_numpy, to_torch

        args, tq, sk = self._args(case, requires_grad=True)
        out = self._out(self._run(case, args))
        out.backward(to_torch(_packed(grad_out, tq), self.device))
        q, k, v = args[:3]
        return (
            _unpacked(to_numpy(q.grad), tq, case.T),
            _unpacked(to_numpy(k.grad), sk, case.S),
            _unpacked(to_numpy(v.grad), sk, case.S),
        )

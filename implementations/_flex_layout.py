"""Where a query and a key of a FlexAttention call sit in a Case: FlexAttention's mods see only indices.

A ``mask_mod`` or ``score_mod`` is called with (batch, head, query index, key index) of the kernel's
own call. For a Case in the padded layout those are the case's own; for a Case with variable lengths
the adapter packs the sequences into one batch row (FlexAttention's document masking), and each index
must be mapped back to its sequence and its position within it, the positions causal, windows and
ALiBi count from. Apart from ``implementations/torch_flex.py`` so that the adapter holds the mods and
the call, and this the bookkeeping of packing.
"""

from __future__ import annotations

import numpy as np
import torch

from conformance.contract import Case


def index(shape: tuple[int, ...], b, h, q, k):
    """Indices into an array broadcastable to [B, H, T, S]: 0 along an axis of length 1."""
    return tuple(0 if n == 1 else i for n, i in zip(shape, (b, h, q, k)))


class Layout:
    """Where a query and a key of the kernel's call sit in the case: the sequence (batch item), the
    position within it, and its offset for the declared causal alignment. Padded (one batch row per
    sequence) unless the case has variable lengths, then packed into one row with a document index."""

    def __init__(self, case: Case, alignment: str, device: str) -> None:
        B, T, S = case.B, case.T, case.S
        self.packed = case.is_varlen
        if self.packed:
            tq = np.full(B, T) if case.seqlens_q is None else np.asarray(case.seqlens_q, dtype=np.int64)
            sk = np.full(B, S) if case.seqlens_k is None else np.asarray(case.seqlens_k, dtype=np.int64)
        else:
            tq, sk = np.full(B, T), np.full(B, S)
        self.tq, self.sk = tq, sk
        off = sk - tq if alignment == "bottom-right" else np.zeros(B, dtype=np.int64)

        def t(a):
            return torch.as_tensor(np.asarray(a, dtype=np.int64), device=device)

        self.off = t(off)
        if self.packed:
            self.doc_q = t(np.repeat(np.arange(B), tq))
            self.doc_k = t(np.repeat(np.arange(B), sk))
            self.loc_q = t(np.concatenate([np.arange(n) for n in tq]) if tq.sum() else np.zeros(0))
            self.loc_k = t(np.concatenate([np.arange(n) for n in sk]) if sk.sum() else np.zeros(0))
            self.Q_LEN, self.KV_LEN = int(tq.sum()), int(sk.sum())
        else:
            self.Q_LEN, self.KV_LEN = T, S

    def where(self, b, q_idx, kv_idx):
        """(sequence, query position, key position, same sequence or None)."""
        if not self.packed:
            return b, q_idx, kv_idx, None
        return self.doc_q[q_idx], self.loc_q[q_idx], self.loc_k[kv_idx], self.doc_q[q_idx] == self.doc_k[kv_idx]

    def pack(self, x: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
        """[B, H, L, D] -> [1, H, sum(lengths), D]: each sequence's first lengths[b] rows, in order."""
        if not self.packed:
            return x
        parts = [x[b, :, : int(n)] for b, n in enumerate(lengths)]
        return torch.cat(parts, dim=1)[None] if parts else x[:1, :, :0]

    def unpack(self, out: torch.Tensor, B: int, T: int) -> torch.Tensor:
        """[1, H, sum(tq), D] -> [B, H, T, D] with zeros on the padding rows."""
        if not self.packed:
            return out
        full = out.new_zeros((B, out.shape[1], T, out.shape[3]))
        start = 0
        for b, n in enumerate(self.tq):
            full[b, :, : int(n)] = out[0, :, start : start + int(n)]
            start += int(n)
        return full

"""FlexAttention (``torch.nn.attention.flex_attention``) compiled: masks as mask_mod and block mask, M as score_mod.

FlexAttention is attention written as two small functions that torch.compile fuses into one kernel
(a C++ template on the CPU, Triton on CUDA): ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says which
keys a query may see (True = may attend) and ``score_mod(score, b, h, q_idx, kv_idx)`` rewrites a
scaled score. It has no ``attn_mask``, ``is_causal`` or variant arguments: everything a Case asks for
is one of the two functions, as FlexAttention's users write them (attention-gym's recipes):

* a boolean mask of any broadcast form: a ``mask_mod`` that reads the case's mask (as captured
  tensor, indexed with 0 along a broadcast axis), and a block mask built by ``create_block_mask``
  with ``B=None`` / ``H=None`` where the mask has no batch / head axis (FlexAttention's own
  broadcasting). The mask_mod indexes the mask as if broadcast to [B, H, T, S], so the mask is first
  checked to be (``torch.broadcast_to``, as a caller's code must: a [B, S] padding mask or a 5-D one
  would be read out of bounds, a [T + 1, S] one in part): torch's RuntimeError refuses it there, in the
  caller's part of the call, since FlexAttention itself never sees a mask;
* ``is_causal`` and a sliding window: ``mask_mod`` terms in the *declared* causal alignment
  (top-left unless ``--declare causal_alignment=bottom-right``: FlexAttention has no convention of
  its own, the mask_mod is the user's, so both alignments are what a user can ask of it);
* the additive M, the softcap and ALiBi: ``score_mod`` terms, in the oracle's order (softcap on the
  scaled score, then M and the ALiBi bias: ``conformance/oracle_variants.py``);
* variable lengths: the sequences packed into one batch row with a document mask (each query sees
  its own sequence's keys only, positions counted within its sequence), the packed output unpacked
  into the padded layout with zeros on padding rows;
* GQA through ``enable_gqa`` (the case's flag as given, else Hq != Hkv), the scale through ``scale``,
  the lse through ``return_lse`` where FlexAttention returns one (not on the CPU), the backward through
  autograd (not on the CPU).

Scalars the mods read (softcap, window, offsets, slopes) are captured as tensors: dynamo specializes a
program on a captured Python number, a cost of the adapter's, not the kernel's (``scale`` is the kernel's own).

Measured (torch 2.13.0+cpu, gcc; ``python -m conformance.discover --impl=torch-flex``): float32,
float16, bfloat16, no float64, no backward and no lse on the CPU (torch's own refusals, quoted in
docs/compiled-kernels.md); rows blocked entirely, by the block mask or by -inf from the score_mod,
give zeros. Compiling costs seconds per new structure cold (gcc builds the C++ template), about 1 s
from inductor's warm cache: it declares ``compiles_per_shape``.

Input validation (000 §8's preconditions, measured with the compiled ``flex_attention`` called directly,
2026-12-05): 3-D or 5-D inputs, integer and mixed dtypes, a batch, head count or feature dim that does not
fit and grouped heads without ``enable_gqa`` are refused (dynamo's Unsupported, inductor's errors: a
RuntimeError, or FlexAttention's ValueError); a value shorter than the key is run, reading past the value
(implementations/expectations/torch-flex.toml). A query or key length of 0 kills the process on the CPU
(SIGFPE), so such a call is not made (``EMPTY_LENGTH_CRASH``).
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import torch

from conformance.contract import Case, Declaration, NotApplicable, capabilities
from implementations import _torch
from implementations._flex_layout import Layout, index
from implementations._torch import TORCH_DTYPES, compiled_throughout, qkv, to_numpy

__all__ = ["TorchFlex", "cpu", "cuda"]


class TorchFlex:
    """``torch.compile(flex_attention, dynamic=False, fullgraph=True)`` with the Case translated into mask_mod /
    score_mod."""

    framework = "torch"

    def __init__(self, name: str, declaration: Declaration, device: str = "cpu") -> None:
        self.name = name
        self.declaration = declaration
        self.device = device
        self._compiled: Any = None

    def __repr__(self) -> str:
        return f"TorchFlex({self.name!r}, device={self.device!r})"

    def unavailable_reason(self) -> str | None:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as exc:
            return f"torch {torch.__version__} has no FlexAttention ({exc})"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return "no CUDA device: torch.cuda.is_available() is False"
        if self.device == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "no C++ compiler on PATH (g++, c++ or clang++): inductor builds FlexAttention's CPU kernel with one"
        return None

    # -- the two functions ------------------------------------------------------------------------
    def _mask_mod(self, case: Case, where: Layout):
        """(mask_mod or None, B argument, H argument) of the block mask."""
        dev = self.device
        mask = None
        if case.mask is not None:
            m = np.asarray(case.mask, dtype=bool)
            # The mask_mod is the caller's code and reads the mask as if it were broadcast to [B, H, T, S]; a caller
            # makes sure it is (torch.broadcast_to), and torch's RuntimeError refuses one that is not: a [B, S]
            # padding mask or a 5-D one would be read out of bounds, a [T + 1, S] one in part.
            torch.broadcast_to(torch.from_numpy(np.ascontiguousarray(m)), (case.B, case.Hq, case.T, case.S))
            m = m.reshape((1,) * (4 - m.ndim) + m.shape)
            mask = torch.as_tensor(np.ascontiguousarray(m), device=dev)
        causal = bool(case.is_causal)
        window = None
        if case.window is not None:
            window = torch.as_tensor([int(case.window[0]), int(case.window[1])], device=dev)
        if mask is None and not causal and window is None and not where.packed:
            return None, None, None

        def mask_mod(b, h, q_idx, kv_idx):
            seq, i, j, same = where.where(b, q_idx, kv_idx)
            ok = j >= 0 if same is None else same
            if mask is not None:
                ok = ok & ~mask[index(tuple(mask.shape), seq, h, i, j)]
            pos = i + where.off[seq]
            if causal:
                ok = ok & (j <= pos)
            if window is not None:
                ok = ok & ((window[0] < 0) | (j >= pos - window[0])) & ((window[1] < 0) | (j <= pos + window[1]))
            return ok

        # FlexAttention's own broadcasting: a block mask without a batch (head) axis where the mask has none
        # (a packed varlen case is one batch row).
        per_batch = not where.packed and mask is not None and mask.shape[0] > 1
        per_head = mask is not None and mask.shape[1] > 1
        return mask_mod, (case.B if per_batch else None), (case.Hq if per_head else None)

    def _score_mod(self, case: Case, where: Layout):
        dev = self.device
        bias = None
        if case.bias is not None:
            b = np.asarray(case.bias, dtype=np.float64)
            b = b.reshape((1,) * (4 - b.ndim) + b.shape)
            bias_dtype = torch.float64 if case.dtype == "float64" else torch.float32
            bias = torch.as_tensor(np.ascontiguousarray(b), device=dev, dtype=bias_dtype)
        cap = None if not case.softcap else torch.as_tensor(float(case.softcap), device=dev)
        slopes = None
        if case.alibi_slopes is not None:
            sl = np.broadcast_to(np.asarray(case.alibi_slopes, dtype=np.float64), (case.B, case.Hq))
            slopes = torch.as_tensor(np.array(sl, copy=True), device=dev, dtype=torch.float32)
        if bias is None and cap is None and slopes is None:
            return None

        def score_mod(score, b, h, q_idx, kv_idx):
            seq, i, j, _ = where.where(b, q_idx, kv_idx)
            if cap is not None:
                score = cap * torch.tanh(score / cap)
            if bias is not None:
                score = score + bias[index(tuple(bias.shape), seq, h, i, j)]
            if slopes is not None:
                score = score - slopes[seq, h] * torch.abs(i + where.off[seq] - j)
            return score

        return score_mod

    # -- calling ----------------------------------------------------------------------------------
    def _flex(self):
        if self._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            # fullgraph: without it, a call that raises inside the compiled function (an invalid input: a 3-D query's
            # "NYI: query, key, and value must be 4D tensors") leaves dynamo running every later call through eager,
            # unfused FlexAttention (measured, torch 2.13 CPU: a later valid call bitwise equal to eager flex_attention,
            # int32 inputs then answered), so a certification would certify the unfused path after its first invalid
            # input. With it each call is compiled or refused (dynamo's Unsupported, a RuntimeError) on its own.
            self._compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
        return self._compiled

    def _call(self, case: Case, q, k, v, return_lse: bool = False):
        from torch.nn.attention.flex_attention import create_block_mask

        if case.dropout_p or case.sinks is not None:  # no argument or mod says either: refused, not ignored
            raise NotApplicable("FlexAttention has no dropout" if case.dropout_p else "no attention sinks here")

        where = Layout(case, self.declaration.causal_alignment, self.device)
        if self.device == "cpu" and 0 in (where.Q_LEN, where.KV_LEN):
            raise NotApplicable(EMPTY_LENGTH_CRASH)
        mask_mod, mb, mh = self._mask_mod(case, where)
        score_mod = self._score_mod(case, where)
        q, k, v = where.pack(q, where.tq), where.pack(k, where.sk), where.pack(v, where.sk)
        block_mask = None
        if mask_mod is not None:
            block_mask = create_block_mask(mask_mod, mb, mh, where.Q_LEN, where.KV_LEN, device=self.device)
        with compiled_throughout():
            res = self._flex()(
                q,
                k,
                v,
                score_mod=score_mod,
                block_mask=block_mask,
                scale=case.scale,
                # the caller's flag as given (False with grouped heads: an invalid call, FlexAttention's to refuse)
                enable_gqa=case.Hq != case.Hkv if case.enable_gqa is None else bool(case.enable_gqa),
                return_lse=return_lse,
            )
        out, lse = res if return_lse else (res, None)
        out = where.unpack(out, case.B, case.T)
        if lse is not None:
            lse = where.unpack(lse[..., None], case.B, case.T)[..., 0]
        return out, lse

    def _inputs(self, case: Case, requires_grad: bool = False):
        return qkv(case, self.device, requires_grad=requires_grad)

    def forward(self, case: Case) -> np.ndarray:
        return _torch.forward(case, self.device, lambda args: self._call(case, *args.qkv(case))[0])

    def forward_with_lse(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            out, lse = self._call(case, *self._inputs(case), return_lse=True)
        return to_numpy(out), lse.detach().to("cpu", torch.float32).numpy().copy()

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple:
        return _torch.vjp(case, grad_out, self.device, lambda args: self._call(case, *args.qkv(case))[0])


# Measured, torch 2.13.0+cpu (torch.compile(flex_attention) called directly on q, k, v [2, 2, 3 or 0, 8] /
# [2, 2, 5 or 0, 8], with and without fullgraph): the compiled CPU kernel dies with SIGFPE (exit status 136) at a
# query or key length of 0, taking the process, and with it the pytest worker, down; eager flex_attention answers
# T = 0 and raises IndexError for S = 0. Such a call is not made: refused with this reason, the refusal fails
# EMPTY-SIZES-01 as what it stands for (a kernel that cannot take the case), where the crash would end the run.
EMPTY_LENGTH_CRASH = (
    "compiled FlexAttention on the CPU kills the process with SIGFPE when the query or key length is 0 "
    "(torch 2.13.0, measured with flex_attention called directly): the call is not made"
)

_FLEX = dict(
    causal_alignment="top-left",
    all_blocked="zeros",
    mask_sense="blocked",  # the adapter writes the mask_mod: the case's mask (True = blocked) is negated there
    masks_combined=False,  # the boolean mask reaches the kernel as the block mask, M as the score_mod
    compiles_per_shape=True,
)

cpu = TorchFlex(
    "torch-flex",
    Declaration(
        **capabilities(
            dtypes=frozenset(TORCH_DTYPES) - {"float64"},
            grad=False,
            dropout=False,
            window=True,
            softcap=True,
            alibi=True,
            varlen=True,
        ),
        **_FLEX,
        notes=(
            "torch 2.13 CPU, torch.compile(flex_attention, dynamic=False, fullgraph=True) (inductor's C++ template); "
            "the boolean mask, is_causal (declared alignment) and the window as mask_mod with a block mask, M, softcap "
            "and ALiBi as score_mod, varlen as a packed document mask. CPU: no float64, no backward, no lse."
        ),
    ),
)

cuda = TorchFlex(
    "torch-flex-cuda",
    Declaration(
        **capabilities(
            dtypes=frozenset(TORCH_DTYPES),
            dropout=False,
            returns_lse=True,
            window=True,
            softcap=True,
            alibi=True,
            varlen=True,
        ),
        **_FLEX,
        deterministic=False,
        lse_base="e",
        lse_empty="-inf",
        device="cuda",
        notes=(
            "NOT measured by the author (no CUDA device): FlexAttention compiled to Triton on CUDA, forward and "
            "backward, its lse (return_lse); translated as torch-flex; re-checked by "
            "tests/test_compiled_adapters.py and discovery on a CUDA machine."
        ),
    ),
    device="cuda",
)

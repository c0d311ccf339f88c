"""What the two Hugging Face adapters share: calling an attention-interface function as Llama does.

transformers' attention functions (``eager_attention_forward`` in transformers.models.llama.
modeling_llama, ``sdpa_attention_forward`` in transformers.integrations.sdpa_attention) are called
by ``LlamaAttention.forward`` as ``fn(self, query, key, value, attention_mask, dropout=..., scaling=
self.scaling)`` with [B, H, T, D] tensors (key and value with the model's kv heads) and return
(output [B, T, H, D], weights or None). ``self`` is the attention module; the functions read
``num_key_value_groups``, ``training`` and (sdpa) ``is_causal`` from it, so a small ``nn.Module``
with exactly those attributes stands in for it (:class:`LlamaLikeModule`). The output is transposed
back to the contract's [B, H, T, D]. ``dropout`` is passed for any ``dropout_p`` but 0, with
``training=True`` (Llama passes ``0.0`` in eval), so an invalid probability reaches the function;
torch's generator is seeded from the case before every call, so forward and backward draw the same
dropout mask.

Each adapter builds the ``attention_mask`` the way transformers builds one for its function
(hf_eager.py: additive 0 / finfo.min; hf_sdpa.py: boolean, True = attend), 4-D as a model's masks
always are: a mask of lower rank gets leading unit axes (no broadcast along T or S is expanded; a
2-D mask reaching ``sdpa_attention_forward``'s decode GQA path, ``pack_gqa``, raises "not enough
values to unpack (expected 4, got 2)", which no model meets).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

import numpy as np
import torch

from conformance.contract import Case, Declaration
from implementations import _torch
from implementations._torch import manual_seed


def version() -> str:
    def v(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return f"transformers {v('transformers')}, torch {v('torch')}"


class LlamaLikeModule(torch.nn.Module):
    """The attributes of ``LlamaAttention`` that the attention functions read."""

    def __init__(self, num_key_value_groups: int, is_causal: bool, training: bool) -> None:
        super().__init__()
        self.num_key_value_groups = num_key_value_groups
        self.is_causal = is_causal
        self.train(training)


class HFAttention:
    """One transformers attention-interface function, called as a Llama model calls it."""

    framework = "torch"
    # The releases its declaration and expectations file were measured with (constraints.txt pins them);
    # the verdict line names an installed release that differs.
    measured_with = {"transformers": "5.24.0", "torch": "2.13.0"}

    def __init__(
        self,
        name: str,
        declaration: Declaration,
        load: Callable[[], Callable],
        attention_mask: Callable[[Case, torch.dtype], torch.Tensor | None],
    ) -> None:
        self.name = name
        self.declaration = declaration
        self._load = load
        self._attention_mask = attention_mask
        self._fn: Callable | None = None
        self._unavailable: str | None | bool = False
        self.version = version()

    def __repr__(self) -> str:
        return f"HFAttention({self.name!r})"

    def contexts(self) -> tuple[str, ...]:
        """The caller's contexts this adapter applies around its kernel (Presentation.context), from torch's API."""
        from implementations import _torch_contexts

        return _torch_contexts.names("cpu")

    def unavailable_reason(self) -> str | None:
        if self._unavailable is False:
            try:
                self._fn = self._load()
                self._unavailable = None
            except Exception as exc:  # noqa: BLE001 - ImportError or a transformers that moved the function
                self._unavailable = f"cannot load transformers' attention function: {type(exc).__name__}: {exc}"
        return self._unavailable  # type: ignore[return-value]

    def _call(self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self._fn is None:
            self.unavailable_reason()
        # LlamaAttention's own arithmetic (num_attention_heads // num_key_value_heads), whatever the ratio: a
        # head count that is not a multiple reaches the function as a model configured so would hand it over.
        groups = case.Hq // case.Hkv if case.Hkv else 1
        # Any dropout_p but 0 is passed, in training mode, as Llama passes attention_dropout while training: an
        # invalid probability (-0.1) reaches the function, which is what must meet it.
        module = LlamaLikeModule(groups, is_causal=bool(case.is_causal), training=bool(case.dropout_p))
        scaling = case.effective_scale
        kwargs = {"dropout": float(case.dropout_p)} if case.dropout_p else {}
        mask = self._attention_mask(case, q.dtype)
        if mask is not None and mask.ndim < 4:  # a model's masks are 4-D, [B, 1, T, S] (masking_utils)
            mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
        if case.dropout_p:  # only then: without dropout the caller's generator is left alone
            manual_seed(case.seed)
        out, _ = self._fn(module, q, k, v, mask, scaling=scaling, **kwargs)
        return out.transpose(1, 2)

    def forward(self, case: Case) -> np.ndarray:
        return _torch.forward(case, "cpu", lambda args: self._call(case, *args.qkv(case)))

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple:
        return _torch.vjp(case, grad_out, "cpu", lambda args: self._call(case, *args.qkv(case)))

    transforms = _torch.TRANSFORMS  # conformance/contract.py; implementations/_torch.py

    def jvp(self, case: Case, tangents: dict) -> tuple:
        return _torch.jvp(case, tangents, "cpu", lambda args: self._call(case, *args.qkv(case)))

    def vjp_vjp(self, case: Case, grad_out: np.ndarray, w: tuple) -> tuple:
        return _torch.vjp_vjp(case, grad_out, w, "cpu", lambda args: self._call(case, *args.qkv(case)))

    def jvp_vjp(self, case: Case, grad_out: np.ndarray, tangents: dict) -> tuple:
        return _torch.jvp_vjp(case, grad_out, tangents, "cpu", lambda args: self._call(case, *args.qkv(case)))

    def vmap_forward(self, cases: list) -> np.ndarray:
        return _torch.vmap_forward(cases, "cpu", lambda args: self._call(cases[0], *args.qkv(cases[0])))

    def vmap_vjp(self, cases: list, grad_outs: list) -> tuple:
        return _torch.vmap_vjp(cases, grad_outs, "cpu", lambda args: self._call(cases[0], *args.qkv(cases[0])))

    def fake_forward(self, case: Case) -> tuple:
        return _torch.fake_forward(case, "cpu", lambda args: self._call(case, *args.qkv(case)))


def bias_tensor(bias: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask that keeps the suite's bias exact: float64 for float64, else float32."""
    return torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float64 if dtype == torch.float64 else np.float32))


def bias_mask(bias: np.ndarray, attend: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A case's bias with the boolean mask folded in as ``-inf`` where ``attend`` is False: the one
    additive ``attention_mask`` both adapters hand a case with a bias (declared ``masks_combined``)."""
    bias = bias_tensor(bias, dtype)
    return bias if attend is None else torch.where(attend, bias, float("-inf"))

"""NumPy <-> torch conversion and the presented call, shared by the torch adapters.

The kernel receives the case's own memory (:class:`Arguments`): each array becomes a view of one
torch tensor made over its NumPy buffer without a copy, with the array's strides and storage offset,
so views into one buffer stay views into one storage, an array given for two arguments stays one
tensor object, a stride-0 axis stays an expanded axis, and a kernel that writes into its inputs
writes into the suite's arrays, where the guarded call sees it (and puts them back). bfloat16 crosses
as its bits (ml_dtypes' bfloat16 viewed as int16), so no number changes. Only what NumPy can hold and
torch cannot (a negative stride) is copied, in the same order of axes. Outputs come back the same way,
as NumPy views of the kernel's own tensors: a kernel that later writes into a tensor it returned
changes what the suite holds, and the suite looks (``STATE-KEYS-01`` and the guarded call).

:func:`forward` and :func:`vjp` run one call as the case's ``Presentation`` says (which inputs ask for
a gradient, the forward's autograd context, a second backward over the graph, the default dtype), so
every torch adapter presents the same things the same way (``PRESENTS``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Any

import numpy as np
import torch

from conformance.contract import (
    LOW_PRECISION,
    PRESENTATION_ATTRIBUTES,
    Case,
    ContextRefused,
    KernelFault,
    Presentation,
    np_dtype,
)
from implementations import _torch_contexts
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


# What every adapter built on :func:`forward` / :func:`vjp` and :class:`Arguments` presents (Declaration.presents).
PRESENTS: frozenset[str] = frozenset(PRESENTATION_ATTRIBUTES)
_SHARED = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(bool)}
_SHARED |= {np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8)}


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _flat(root: np.ndarray, device: str) -> torch.Tensor | None:
    """``root``'s memory as a 1-D tensor sharing it (a copy for a read-only root), or None when torch
    cannot hold its dtype."""
    data = root if root.flags.writeable else root.copy()
    data = data.reshape(-1)
    if data.dtype == np_dtype("bfloat16"):
        t = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    elif data.dtype in _SHARED:
        t = torch.from_numpy(data)
    else:
        return None
    return t if device == "cpu" else t.to(device)


def _copied(a: np.ndarray, device: str) -> torch.Tensor:
    """A copy of ``a`` that keeps the order of its axes and its stride-0 axes (what a negative stride
    or an unusual dtype needs)."""
    wide = [i for i, (n, st) in enumerate(zip(a.shape, a.strides)) if st == 0 and n > 1]
    src = a[tuple(slice(0, 1) if i in wide else slice(None) for i in range(a.ndim))] if wide else a
    if src.dtype == np_dtype("bfloat16"):
        t = torch.from_numpy(np.array(src, dtype=np.float32, order="K")).to(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(src, copy=True, order="K"))
    t = t.to(device)
    return t.expand(a.shape) if wide else t


class Arguments:
    """A call's arrays as torch tensors that keep what the arrays share (the module docstring): the
    same array object gives the same tensor, views of one buffer give views of one storage.

    ``bias_grad``: the additive M asked for its gradient (Presentation.requires_grad holds "bias"); an
    adapter that passes a float mask gives it to :meth:`bias` so it becomes that leaf."""

    def __init__(self, device: str = "cpu", requires_grad: frozenset[str] = frozenset()) -> None:
        self.device = device
        self.requires_grad = requires_grad
        self.bias_grad = "bias" in requires_grad
        self.bias_leaf: torch.Tensor | None = None
        self._roots: dict[tuple[int, str], torch.Tensor | None] = {}
        self._objects: dict[int, torch.Tensor] = {}
        self._held: list[Any] = []  # the arrays whose ids key the memos, so that no id is reused meanwhile

    def __call__(self, a: Any, requires_grad: bool = False) -> torch.Tensor:
        key = id(a)
        t = self._objects.get(key)
        if t is None:
            t = self._convert(np.asarray(a))
            if requires_grad:
                t.requires_grad_(True)
            self._objects[key] = t
            self._held.append(a)
        return t

    def _convert(self, a: np.ndarray) -> torch.Tensor:
        size = a.itemsize
        if a.size == 0 or any(st < 0 or st % size for st in a.strides):
            return _copied(a, self.device)
        root = _root(a)
        offset = _address(a) - _address(root)
        if not root.flags.c_contiguous or offset % size or offset < 0:
            return _copied(a, self.device)
        memo = (id(root), a.dtype.str if root.dtype != a.dtype else "")
        if root.dtype != a.dtype:  # a raw byte buffer (an array placed at a chosen alignment): its bytes as a.dtype
            if root.nbytes < size:
                return _copied(a, self.device)
            raw = root.reshape(-1).view(np.uint8)
            root = raw[: root.nbytes - root.nbytes % size].view(a.dtype)
        if memo not in self._roots:
            self._roots[memo] = _flat(root, self.device)
            self._held.append(root)
        flat = self._roots[memo]
        if flat is None:
            return _copied(a, self.device)
        # A length-1 axis may have any stride in NumPy; a user's tensor has stride 1 in its last axis there
        # (torch's fused kernels refuse anything else, even for a dimension of one element).
        strides = [st // size for st in a.strides]
        if a.ndim and a.shape[-1] == 1:
            strides[-1] = 1
        return flat.as_strided(a.shape, strides, offset // size)

    def qkv(self, case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V of ``case``, each asking for its gradient when the presentation says so."""
        return tuple(  # type: ignore[return-value]
            self(getattr(case, n), n in self.requires_grad) for n in ("query", "key", "value")
        )

    def bias(self, t: torch.Tensor) -> torch.Tensor:
        """The float mask an adapter built from the case's additive M: the leaf asking for M's gradient
        when the presentation says so, else ``t`` as it is."""
        if self.bias_grad:
            t = t.detach().requires_grad_(True)
            self.bias_leaf = t
        return t


def to_torch(a: np.ndarray, device: str = "cpu", requires_grad: bool = False) -> torch.Tensor:
    """One array as a tensor over its own memory (:class:`Arguments`)."""
    return Arguments(device)(a, requires_grad)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Back to NumPy in the tensor's own dtype (a kernel that returns the wrong dtype stays wrong), as a
    view of the tensor's memory where it is on the CPU: what the kernel later writes there shows."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np_dtype("bfloat16"))
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # a dtype NumPy has no name for: the kernel's answer, converted
        return t.float().numpy()


def qkv(case: Case, device: str = "cpu", requires_grad: bool = False):
    args = Arguments(device)
    return tuple(args(x, requires_grad) for x in (case.query, case.key, case.value))


def mask_tensor(mask: np.ndarray, device: str = "cpu", invert: bool = False) -> torch.Tensor:
    """A boolean mask (``~mask`` when ``invert``) as a torch tensor in its own rank, its stride-0 axes
    still expanded: a user's ``mask[:, None].expand(B, H, T, S)`` reaches the kernel as that view (a
    contiguous copy would test another input)."""
    mask = np.asarray(mask, dtype=bool)
    if invert:
        inverted = _inverted_in_its_memory(mask)
        if inverted is not None:
            return to_torch(inverted, device)
    wide = [i for i, (n, s) in enumerate(zip(mask.shape, mask.strides)) if s == 0 and n > 1]
    src = mask[tuple(slice(0, 1) if i in wide else slice(None) for i in range(mask.ndim))]
    return to_torch(np.broadcast_to(~src if invert else src, mask.shape), device)


def _inverted_in_its_memory(mask: np.ndarray) -> np.ndarray | None:
    """``~mask`` in the memory form ``mask`` has: a view at the same offset and strides into a copy of its buffer
    placed at the same address modulo 64 bytes, so that a mask sliced from a wider one (rows further apart than S)
    or placed off a vector boundary still reaches the kernel so once inverted into the kernel's sense. None for a
    mask that owns contiguous memory (the plain inversion keeps its form) or has a negative stride."""
    root = _root(mask)
    if root is mask or not root.flags.c_contiguous or any(st < 0 for st in mask.strides):
        return None
    offset = _address(mask) - _address(root)
    raw = np.empty(root.nbytes + 64, dtype=np.uint8)
    start = (_address(root) - _address(raw)) % 64
    buffer = raw[start : start + root.nbytes]
    buffer[...] = root.reshape(-1).view(np.uint8)
    inverted = np.ndarray(mask.shape, dtype=bool, buffer=buffer, offset=offset, strides=mask.strides)
    inverted[...] = ~mask
    return inverted


def blocked_mask(case: Case, device: str = "cpu") -> torch.Tensor | None:
    """The case's mask in the suite's convention (True = blocked), as a torch bool tensor."""
    if case.mask is None:
        return None
    return torch.from_numpy(np.array(case.mask, dtype=bool)).to(device)


def dtype_of(t: torch.Tensor) -> str:
    return _NAMES.get(t.dtype, str(t.dtype))


def _bias_dtype(case: Case, adapter_choice: str) -> str:
    """The dtype of a half-precision case's float mask: the presentation's where it names one, else the adapter's."""
    named = case.presentation.bias_dtype if case.presentation is not None else None
    return named or adapter_choice


def sdpa_kwargs(
    case: Case,
    device: str,
    alignment: str = "top-left",
    half_bias: str = "float32",
    mask_sense: str = "attend",
    fold_causal: bool = True,
    args: Arguments | None = None,
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
    Hq != Hkv. ``args``: the call's :class:`Arguments`, whose float-mask leaf the additive M becomes
    when the presentation asks for M's gradient.
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
        elif case.dtype in LOW_PRECISION and _bias_dtype(case, half_bias) == "query":
            bias_dtype = TORCH_DTYPES[case.dtype]
        else:
            bias_dtype = torch.float32
        attn_mask = torch.from_numpy(np.ascontiguousarray(bias)).to(device=device, dtype=bias_dtype)
        if args is not None:
            attn_mask = args.bias(attn_mask)
    elif mask is not None:
        attn_mask = mask_tensor(mask, device, invert=mask_sense == "attend")
    kwargs: dict[str, Any] = {
        "attn_mask": attn_mask,
        "dropout_p": float(case.dropout_p),
        "is_causal": is_causal,
        "scale": case.scale,
    }
    if case.enable_gqa is not None:  # the caller's flag, as given (False with grouped heads: an invalid call)
        kwargs["enable_gqa"] = bool(case.enable_gqa)
    elif case.Hq != case.Hkv:
        kwargs["enable_gqa"] = True
    return _in_form(kwargs, case.presentation.scalars if case.presentation is not None else None, device)


def _in_form(kwargs: dict[str, Any], form: str | None, device: str) -> dict[str, Any]:
    """One scalar argument in the Python type ``form`` names (Presentation.scalars, "<argument>:<type>"), as
    callers pass them: ``scale=2`` an int, a numpy.float64 or numpy.float32 read from a config, a 0-d tensor,
    ``is_causal`` a numpy.bool_ or 1. The value is the same (an int only where it is integral, a float32 only
    where it is exact); an argument the call does not pass, or a value the form cannot hold, stays as it is."""
    if form is not None and "+" in form:  # several arguments at once ("scale:numpy.float64+dropout_p:...")
        for one in form.split("+"):
            kwargs = _in_form(kwargs, one, device)
        return kwargs
    arg, _, kind = (form or "").partition(":")
    value = kwargs.get(arg)
    if value is None or (arg == "scale" and not isinstance(value, float)):
        return kwargs
    if kind == "int" and float(value).is_integer():
        value = int(value)
    elif kind == "numpy.float64":
        value = np.float64(value)
    elif kind == "numpy.float32" and float(np.float32(value)) == value:
        value = np.float32(value)
    elif kind == "numpy.bool_":
        value = np.bool_(value)
    elif kind == "tensor":
        value = torch.tensor(value, device=device)
    return {**kwargs, arg: value}


# -- the presented call -------------------------------------------------------------------------
def _mode(mode: str) -> Any:
    """The autograd context of a call: none where the process is in it already, so that a kernel that
    leaves grad mode switched off is seen by its caller (a context manager would put it back)."""
    inference = torch.is_inference_mode_enabled()
    if mode == "grad":
        return contextlib.nullcontext() if torch.is_grad_enabled() and not inference else torch.enable_grad()
    if mode == "inference":
        return contextlib.nullcontext() if inference else torch.inference_mode()
    return contextlib.nullcontext() if not torch.is_grad_enabled() else torch.no_grad()


@contextlib.contextmanager
def _default_dtype(name: str | None):
    """The process's default float dtype set to ``name`` for the call, as a caller may have set it."""
    if name is None:
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(TORCH_DTYPES[name])
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _threads(n: int | None):
    """torch's intra-op thread count set to ``n`` for the call, as a caller (or a launcher) may set it."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _asking(args: Arguments, case: Case) -> list[tuple[str, torch.Tensor]]:
    names = [(n, args(getattr(case, n))) for n in ("query", "key", "value") if n in args.requires_grad]
    return names + ([("bias", args.bias_leaf)] if args.bias_leaf is not None else [])


@contextlib.contextmanager
def _presented(pres: Presentation, mode: Any) -> Any:
    """What a call runs inside for presentation ``pres``: ``mode`` (an autograd context manager: ``_mode(...)`` or
    forward AD's dual level), the default dtype, the thread count and the caller's context (``around``)."""
    with mode, _default_dtype(pres.default_dtype), _threads(pres.threads), _torch_contexts.around(pres.context):
        yield


def forward(case: Case, device: str, call: Any) -> np.ndarray:
    """``call(args)`` (an :class:`Arguments` for ``case``; it builds Q, K, V with ``args.qkv(case)``)
    under the case's presentation: its forward context and the inputs that ask for a gradient. Under
    autograd an output that asked inputs are not on the graph of is the kernel's fault."""
    pres = case.presentation or Presentation()
    args = Arguments(device, pres.asked("forward"))
    call = _torch_contexts.wrap(pres.context, call, TORCH_DTYPES.get(case.dtype))

    def body() -> torch.Tensor:
        with _presented(pres, _mode(pres.grad_mode)):
            return call(args)

    out = _in_context(pres.context, body)
    asking = _asking(args, case)
    if pres.grad_mode == "grad" and asking and not out.requires_grad:
        names = ", ".join(n for n, _ in asking)
        raise KernelFault(
            f"the output is not on the autograd graph although {names} asked for a gradient under "
            "torch.enable_grad() (the kernel detached it, ran under no_grad or went through NumPy)"
        )
    return to_numpy(out)


def vjp(case: Case, grad_out: np.ndarray, device: str, call: Any) -> tuple:
    """The VJP of ``call(args)`` (as in :func:`forward`) under the case's presentation: only the inputs
    that ask for a gradient do (None for the others; M's gradient fourth when it asked), the cotangent
    in its own memory, and a second backward over the same graph when ``backward="twice"`` (its
    result is returned). An input one object with another gets their whole gradient under both names."""
    pres = case.presentation or Presentation()
    args = Arguments(device, pres.asked("vjp"))
    call = _torch_contexts.wrap(pres.context, call, TORCH_DTYPES.get(case.dtype))
    asking, grads, leaves = _in_context(pres.context, lambda: _backward(case, pres, args, call, grad_out))
    by_leaf = {id(t): gr for t, gr in zip(leaves, grads)}
    result: dict[str, np.ndarray | None] = {"query": None, "key": None, "value": None}
    for name, t in asking:
        grad = by_leaf[id(t)]
        if grad is None:
            raise KernelFault(f"no gradient arrived for {name}, which asked for one (it is not on the output's graph)")
        result[name] = to_numpy(grad)
    values = (result["query"], result["key"], result["value"])
    return (*values, result["bias"]) if "bias" in result else values


def _backward(case: Case, pres: Presentation, args: Arguments, call: Any, grad_out: np.ndarray) -> tuple:
    """The forward under autograd and its backward, inside the caller's context: (asking, grads, leaves)."""
    with _presented(pres, _mode("grad")):
        out = call(args)
        asking = _asking(args, case)
        if args.bias_grad and args.bias_leaf is None:
            raise KernelFault("the additive M asked for its gradient, but no float mask reached the kernel")
        if not out.requires_grad:
            names = ", ".join(n for n, _ in asking)
            raise KernelFault(f"the output is not on the autograd graph although {names} asked for a gradient")
        g = args(grad_out)
        g = g if g.dtype == out.dtype else g.to(out.dtype)
        leaves: list[torch.Tensor] = []
        for _, t in asking:
            if not any(t is x for x in leaves):
                leaves.append(t)
        twice = pres.backward == "twice"
        grads = torch.autograd.grad(out, leaves, grad_outputs=g, retain_graph=twice, allow_unused=True)
        if twice:
            grads = torch.autograd.grad(out, leaves, grad_outputs=g, allow_unused=True)
    return asking, grads, leaves


def _in_context(name: str | None, body: Any) -> Any:
    """``body()`` as the caller's context ``name`` runs it (another thread for "thread"); torch refusing the call
    under that context in its own words (``_torch_contexts.refusal``) is ``ContextRefused``, not a fault."""
    try:
        return _torch_contexts.run(name, body)
    except ContextRefused:
        raise
    except Exception as exc:
        reason = _torch_contexts.refusal(name, exc)
        if reason is None:
            raise
        raise ContextRefused(reason) from exc


# -- transforms (conformance/contract.py: ``transforms``, ``jvp``, ``vjp_vjp``, ``jvp_vjp``, ``vmap_forward``) ----
# What every adapter built on :func:`forward` can ask of its kernel besides a forward and a VJP: forward-mode AD
# (torch.autograd.forward_ad, as PyTorch's test_ops_fwd_gradients does), a double backward (create_graph=True,
# as gradgradcheck), forward-mode AD of the backward (gradgradcheck's check_fwd_over_rev), torch.func.vmap over a
# leading axis of stacked cases, and the forward on fake tensors (FakeTensorMode: shape, dtype and device
# without data, as torch.compile and torch.export trace a call and torch.library.opcheck's test_faketensor
# checks an op). A kernel that refuses one raises what torch raises
# (NotImplementedError: "Trying to use forward AD with ... that does not support it"; under fake tensors a
# DataDependentOutputException for ``.item()`` or a branch on a value, a RuntimeError for ``.numpy()``); the
# suite records that as a capability.
TRANSFORMS: frozenset[str] = frozenset({"jvp", "vjp_vjp", "jvp_vjp", "vmap", "fake", "vmap_vjp"})


class _Dual(Arguments):
    """Arguments whose Q, K, V (those given a tangent) are forward-mode dual tensors over the case's own
    memory, and whose float mask carries the additive M's tangent (zero where M blocks). With
    ``requires_grad``, those inputs are also autograd leaves (the dual made first, as gradgradcheck's
    forward-over-reverse check makes them)."""

    def __init__(
        self, device: str, case: Case, tangents: dict[str, np.ndarray], requires_grad: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(device, requires_grad)
        self._tangent_of = {id(getattr(case, n)): tangents[n] for n in ("query", "key", "value") if n in tangents}
        self._bias_tangent = tangents.get("bias")
        self.bias_dual: torch.Tensor | None = None

    def __call__(self, a: Any, requires_grad: bool = False) -> torch.Tensor:
        from torch.autograd import forward_ad

        key = id(a)
        known = key in self._objects
        dual = not known and key in self._tangent_of
        t = super().__call__(a, requires_grad and not dual)
        if dual:
            tangent = to_torch(np.ascontiguousarray(self._tangent_of[key]).astype(np.asarray(a).dtype), self.device)
            if 0 in t.stride():  # a broadcast primal's tangent is broadcast too, in the primal's very layout
                tangent = _in_layout_of(t, tangent)
            t = forward_ad.make_dual(t, tangent.to(t.dtype))
            if requires_grad:
                t.requires_grad_(True)
            self._objects[key] = t
        return t

    def bias(self, t: torch.Tensor) -> torch.Tensor:
        from torch.autograd import forward_ad

        if self._bias_tangent is None:
            return t
        tangent = np.broadcast_to(np.asarray(self._bias_tangent, dtype=np.float64), tuple(t.shape))
        tangent = torch.from_numpy(np.array(tangent, copy=True)).to(device=t.device, dtype=t.dtype)
        tangent = torch.where(torch.isneginf(t), torch.zeros_like(tangent), tangent)
        self.bias_dual = forward_ad.make_dual(t, tangent)
        return self.bias_dual


def _in_layout_of(primal: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` (constant along the primal's stride-0 axes) in ``primal``'s strides and storage offset:
    make_dual copies a tangent of another layout into the primal's, which a stride-0 axis refuses."""
    strides, offset = primal.stride(), primal.storage_offset()
    one = tuple(1 if st == 0 else n for n, st in zip(primal.shape, strides))  # each element once
    size = offset + sum((n - 1) * st for n, st in zip(primal.shape, strides)) + 1
    buffer = torch.zeros(size, dtype=values.dtype, device=values.device)
    first = tuple(slice(0, 1) if st == 0 else slice(None) for st in strides)
    buffer.as_strided(one, strides, offset).copy_(values[first])
    return buffer.as_strided(primal.shape, strides, offset)


def jvp(case: Case, tangents: dict[str, np.ndarray], device: str, call: Any) -> tuple[np.ndarray, np.ndarray]:
    """(out, tangent_out): ``call(args)`` (as in :func:`forward`) with Q, K, V and the additive M as
    forward-mode duals carrying ``tangents``. An output without a tangent although an input carried one is
    the kernel's fault (forward mode cut: a detach, a trip through NumPy)."""
    from torch.autograd import forward_ad

    pres = case.presentation or Presentation()
    args = _Dual(device, case, tangents)
    with _presented(pres, forward_ad.dual_level()):
        out = call(args)
        if "bias" in tangents and args.bias_dual is None:
            raise KernelFault("the additive M was given a tangent, but no float mask reached the kernel")
        primal, tangent = forward_ad.unpack_dual(out)
        if tangent is None:
            raise KernelFault(
                "the output carries no tangent although its inputs did (forward mode cut: the kernel detached "
                "its result or went through NumPy)"
            )
        return to_numpy(primal), to_numpy(tangent)


def vjp_vjp(case: Case, grad_out: np.ndarray, w: tuple, device: str, call: Any) -> tuple:
    """(d2q, d2k, d2v): the gradient with respect to Q, K, V of <vjp(grad_out), w>, by a double backward:
    the first with ``create_graph=True`` (as a gradient penalty does), the second through it. Gradients
    that come out of the first backward off the graph (a backward computed from detached tensors) would
    make every second derivative silently zero: the kernel's fault."""
    pres = case.presentation or Presentation()
    names = ("query", "key", "value")
    args = Arguments(device, frozenset(names))
    with _presented(pres, _mode("grad")):
        out = call(args)
        leaves = [args(getattr(case, n)) for n in names]
        if not out.requires_grad:
            raise KernelFault("the output is not on the autograd graph although query, key and value asked")
        g = args(grad_out)
        g = g if g.dtype == out.dtype else g.to(out.dtype)
        firsts = torch.autograd.grad(out, leaves, grad_outputs=g, create_graph=True, allow_unused=True)
        terms = [
            (gr * to_torch(np.ascontiguousarray(wt), device).to(gr.dtype)).sum()
            for gr, wt in zip(firsts, w)
            if gr is not None
        ]
        phi = sum(terms[1:], terms[0]) if terms else None
        if phi is None or not phi.requires_grad:
            raise KernelFault(
                "the gradients of a backward with create_graph=True are not on the graph (the backward detached "
                "them): every second derivative would be silently zero"
            )
        seconds = torch.autograd.grad(phi, leaves, allow_unused=True)
    return tuple(to_numpy(torch.zeros_like(x) if s is None else s) for s, x in zip(seconds, leaves))


def jvp_vjp(case: Case, grad_out: np.ndarray, tangents: dict[str, np.ndarray], device: str, call: Any) -> tuple:
    """(dQ', dK', dV'): the tangent of the VJP (dQ, dK, dV for cotangent ``grad_out``) along ``tangents`` of Q,
    K, V, by forward-mode AD through the backward, as gradgradcheck's ``check_fwd_over_rev`` does: Q, K, V
    dual tensors that ask for their gradient, the forward under autograd, ``torch.autograd.grad`` with
    ``create_graph=True`` and the tangents of the gradients it returns. Gradients that come out of the
    backward without a tangent (a backward that detached its inputs or went through NumPy) would make the
    answer silently zero: the kernel's fault."""
    from torch.autograd import forward_ad

    pres = case.presentation or Presentation()
    names = ("query", "key", "value")
    given = {n: tangents[n] for n in names if tangents.get(n) is not None}
    args = _Dual(device, case, given, frozenset(names))
    with forward_ad.dual_level(), _presented(pres, _mode("grad")):
        out = call(args)
        leaves = [args(getattr(case, n), True) for n in names]
        if not out.requires_grad:
            raise KernelFault("the output is not on the autograd graph although query, key and value asked")
        g = args(grad_out)
        g = g if g.dtype == out.dtype else g.to(out.dtype)
        firsts = torch.autograd.grad(out, leaves, grad_outputs=g, create_graph=True, allow_unused=True)
        seconds = [None if gr is None else forward_ad.unpack_dual(gr).tangent for gr in firsts]
        if given and all(s is None for s in seconds):
            raise KernelFault(
                "the gradients of the backward carry no tangent although query, key and value did (the backward "
                "cut forward mode: it detached its inputs or went through NumPy): every answer would be silently zero"
            )
        return tuple(to_numpy(torch.zeros_like(x) if s is None else s) for s, x in zip(seconds, leaves))


class _Given(Arguments):
    """Arguments whose Q, K, V are the tensors a transform hands in (vmap's batched tensors)."""

    def __init__(self, device: str, given: dict[int, torch.Tensor]) -> None:
        super().__init__(device)
        self._given = given

    def __call__(self, a: Any, requires_grad: bool = False) -> torch.Tensor:
        t = self._given.get(id(a))
        return t if t is not None else super().__call__(a, requires_grad)


def stacked(items: list[np.ndarray]) -> np.ndarray:
    """``items`` (arrays of one shape and dtype) stacked along a new leading axis so that each item keeps the
    first's memory form: its strides (a transposed view, a stride-0 axis), its offset into its buffer and its
    address modulo 64 bytes. A kernel under vmap sees each item's own memory, as a caller's batch of views does."""
    first = np.asarray(items[0])
    root = _root(first)
    if root is first and first.flags.c_contiguous:
        return np.stack([np.asarray(a) for a in items])
    offset = _address(first) - _address(root)
    step = -(-root.nbytes // 64) * 64  # one item's buffer, a whole number of 64-byte lines
    raw = np.zeros(len(items) * step + 64, dtype=np.uint8)
    start = (_address(root) - _address(raw)) % 64
    out = np.ndarray((len(items), *first.shape), first.dtype, raw, start + offset, (step, *first.strides))
    for i, a in enumerate(items):
        out[i] = a
    return out


class _Batch:
    """The N cases' Q, K, V as vmap's inputs: one stacked array per array object (one object given for two
    arguments is one batched tensor), each item in the first case's memory form (:func:`stacked`), as tensors
    over the arrays' own memory, so that a write into a batched input lands where :meth:`check_unwritten` sees
    it."""

    NAMES = ("query", "key", "value")

    def __init__(self, cases: list[Case], device: str) -> None:
        first = cases[0]
        self.device = device
        self.objects = list(dict.fromkeys(id(getattr(first, n)) for n in self.NAMES))
        self.name_of = {id(getattr(first, n)): n for n in reversed(self.NAMES)}
        self.ids = [id(getattr(first, n)) for n in self.NAMES]
        self.arrays = [stacked([np.asarray(getattr(c, self.name_of[o])) for c in cases]) for o in self.objects]
        self._before = [a.tobytes() for a in self.arrays]
        self.args = Arguments(device)
        self.tensors = [self.args(a) for a in self.arrays]

    def given(self, batched: tuple) -> _Given:
        """The arguments of one call inside the map: the batched tensors in place of Q, K, V."""
        return _Given(self.device, dict(zip(self.objects, batched)))

    def check_unwritten(self, under: str) -> None:
        for o, a, b in zip(self.objects, self.arrays, self._before):
            if a.tobytes() != b:
                raise KernelFault(f"under {under} the kernel wrote into its {self.name_of[o]} (a batched input)")


def vmap_forward(cases: list[Case], device: str, call: Any) -> np.ndarray:
    """``torch.func.vmap`` of ``call(args)`` over a new leading axis of the N cases' stacked Q, K, V (the
    cases differ in nothing else; ``call`` builds the rest from the first): [N, B, Hq, T, Dv]. The kernel
    sees each case's own 4-D shapes and memory form, as batched tensors (:class:`_Batch`); a kernel that
    writes into them (the caller's stacked tensors) is caught here, where the writes land."""
    pres = cases[0].presentation or Presentation()
    batch = _Batch(cases, device)
    with _presented(pres, _mode(pres.grad_mode)):  # a batched forward under no_grad, grad or inference mode
        out = to_numpy(torch.func.vmap(lambda *xs: call(batch.given(xs)))(*batch.tensors))
    batch.check_unwritten("vmap")
    return out


def vmap_vjp(cases: list[Case], grad_outs: list[np.ndarray], device: str, call: Any) -> tuple:
    """``torch.func.vmap`` of ``torch.func.vjp`` of ``call(args)``, as per-example gradients are taken: Q, K, V
    stacked as in :func:`vmap_forward` and each item's cotangent; inside the map the kernel's inputs track
    gradients. Returns (dq, dk, dv), each [N, ...]: an object's whole gradient under each of its names."""
    pres = cases[0].presentation or Presentation()
    batch = _Batch(cases, device)
    g = batch.args(stacked([np.asarray(x) for x in grad_outs]))

    def item(*xs: torch.Tensor) -> tuple:
        *inputs, cot = xs
        out, pull = torch.func.vjp(lambda *ys: call(batch.given(ys)), *inputs)
        return pull(cot.to(out.dtype))

    with _presented(pres, _mode("grad")):
        grads = torch.func.vmap(item)(*batch.tensors, g)
    batch.check_unwritten("vmap of the backward")
    of = dict(zip(batch.objects, grads))
    return tuple(to_numpy(of[i]) for i in batch.ids)


def _fake_refusals() -> dict[type, str]:
    """torch's exceptions for a kernel that needs its inputs' values under fake tensors, and what each means."""
    from torch._subclasses import fake_tensor

    return {
        fake_tensor.DataDependentOutputException: "the kernel reads a value of its inputs (.item(), a Python "
        "branch on data)",
        fake_tensor.DynamicOutputShapeException: "an intermediate's shape depends on the inputs' values "
        "(nonzero, masked_select, boolean indexing)",
        fake_tensor.UnsupportedOperatorException: "the kernel calls an operator without a fake (meta) kernel",
    }


class _Fake(Arguments):
    """Arguments whose tensors are fake: each array is first made the real tensor :class:`Arguments` makes of it
    (its strides, offset and shared storage), outside the fake mode, then ``mode.from_tensor`` of that tensor, so
    the kernel sees the case's memory form without its data; the float mask handed to :meth:`bias` too."""

    def __init__(self, device: str, mode: Any, requires_grad: frozenset[str] = frozenset()) -> None:
        super().__init__(device, requires_grad)
        self._mode = mode
        self._fakes: dict[int, torch.Tensor] = {}

    def __call__(self, a: Any, requires_grad: bool = False) -> torch.Tensor:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        fake = self._fakes.get(id(a))
        if fake is None:
            with unset_fake_temporarily():
                real = super().__call__(a, requires_grad)
            fake = self._fakes[id(a)] = self._mode.from_tensor(real)
        return fake

    def bias(self, t: torch.Tensor) -> torch.Tensor:
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        if not isinstance(t, FakeTensor):
            with unset_fake_temporarily():
                t = super().bias(t)
            t = self._mode.from_tensor(t)
        return t


def fake_forward(case: Case, device: str, call: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of ``call(args)`` (as in :func:`forward`) run under
    ``torch._subclasses.fake_tensor.FakeTensorMode`` on fake Q, K, V (``mode.from_tensor`` of the tensors the
    real call gets, in their own memory): what torch.compile and torch.export see of the kernel when they trace
    it. A tensor the adapter or the kernel makes from NumPy inside the call (a mask, a constant) becomes fake at
    its first op (``allow_non_fake_inputs``), as a traced constant does. An output that is not a fake tensor (a
    result made outside the mode, from the inputs' data) is the kernel's fault.

    A kernel that needs its inputs' values refuses fake tensors, and torch's exception for that names only the
    operator ("DataDependentOutputException: aten._local_scalar_dense.default"); it is raised again as a
    NotImplementedError that names the exception and says what the kernel did, so the refusal line reads."""
    from torch._subclasses import fake_tensor

    pres = case.presentation or Presentation()
    mode = fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    args = _Fake(device, mode, pres.asked("forward"))
    refusals = _fake_refusals()
    try:
        with _presented(pres, _mode(pres.grad_mode)), mode:
            out = call(args)
    except tuple(refusals) as exc:  # the operator's name alone: say what the kernel asked of the data
        what = next(w for cls, w in refusals.items() if isinstance(exc, cls))
        first = (str(exc).splitlines() or [""])[0]
        raise NotImplementedError(f"{type(exc).__name__} ({first}): {what}, which fake tensors do not have") from exc
    if not isinstance(out, fake_tensor.FakeTensor):
        raise KernelFault(
            f"under fake tensors the kernel returned {type(out).__name__}, not a fake tensor (a result computed "
            "outside the fake mode from the inputs' data)"
        )
    return tuple(int(n) for n in out.shape), dtype_of(out)

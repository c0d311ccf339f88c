"""Wrong kernels generated from the torch reference: a trigger on how a call is made, times a perturbation.

``tests/generated_mutants.py`` generates NumPy kernels wrong where the *values* of a case meet (a mask
form and a head dim, ...). The bugs that hide in how the same numbers reach a kernel, in what happens
around the call and in what the kernel should refuse are in torch's vocabulary: storage offsets,
strides, one tensor given twice, which inputs ask for a gradient, the autograd context, the process's
default dtype, the incoming gradient's layout, the process state a call leaves behind, an output buffer
handed out twice, an invalid call answered. Here a *trigger* is a conjunction of 1 to 3 predicates over
a call (``PREDICATES``: what the function itself can see of its arguments and of torch's state), and a
*perturbation* is one way a kernel goes wrong there (``PERTURBATIONS``: a wrong answer, a wrong
gradient, a wrong thing done around the call). A mutant is the validating torch reference of
``tests/trust_kernels.py`` (torch's SDPA signature, behind the real FunctionAdapter) except where its
trigger holds. ``scripts/mutant_kill_rates.py --family calls`` samples and certifies them.

The arity counts every predicate the bug needs to show, the perturbation's own need included (dropping
the mask needs a mask: "a mask is given" joins the trigger), as for the NumPy family; an output buffer
handed out again shows only on a second call that meets the trigger with the same shapes, one more
condition (the NumPy family's "called before with the same shapes").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.trust_kernels import reference


@dataclass
class Call:
    """One call as the function sees it."""

    q: Any
    k: Any
    v: Any
    attn_mask: Any
    dropout_p: float
    is_causal: bool
    scale: float | None
    enable_gqa: bool


def _torch():
    import torch

    return torch


def _noncontig(t) -> bool:
    return not t.is_contiguous()


# name -> predicate over a call. Each is something a kernel can (and real ones do) branch on.
PREDICATES: dict[str, Callable[[Call], bool]] = {
    # memory
    "the query has a storage offset": lambda c: c.q.storage_offset() != 0,
    "the key is not contiguous": lambda c: _noncontig(c.k),
    "the value is not contiguous": lambda c: _noncontig(c.v),
    "Q, K and V share one storage": lambda c: (
        c.q.untyped_storage().data_ptr() == c.k.untyped_storage().data_ptr() == c.v.untyped_storage().data_ptr()
    ),
    "an input has a stride-0 axis": lambda c: any(0 in t.stride() for t in (c.q, c.k, c.v)),
    # identity
    "the query is the key": lambda c: c.q is c.k,
    "the key is the value": lambda c: c.k is c.v,
    # gradients asked and the autograd context
    "the query asks for a gradient": lambda c: c.q.requires_grad,
    "the key does not ask for a gradient": lambda c: not c.k.requires_grad,
    "the value asks for a gradient": lambda c: c.v.requires_grad,
    "autograd is on": lambda c: _torch().is_grad_enabled(),
    "inference mode": lambda c: _torch().is_inference_mode_enabled(),
    "the default dtype is float64": lambda c: _torch().get_default_dtype() == _torch().float64,
    # values (what the other family's classes would say of the call)
    "a mask is given": lambda c: c.attn_mask is not None,
    "is_causal": lambda c: bool(c.is_causal),
    "T != S": lambda c: c.q.shape[-2] != c.k.shape[-2],
    "grouped heads": lambda c: c.q.shape[-3] != c.k.shape[-3],
    "a half-precision dtype": lambda c: c.q.dtype in (_torch().float16, _torch().bfloat16),
    "Dk above 64": lambda c: c.q.shape[-1] > 64,
    "more than 64 keys": lambda c: c.k.shape[-2] > 64,
    "dropout is on": lambda c: c.dropout_p > 0,
}


def _unpacked_tangent(t) -> bool:
    import torch.autograd.forward_ad as fwd

    return fwd.unpack_dual(t).tangent is not None


def _batched(t) -> bool:
    import torch

    return bool(torch._C._functorch.is_batchedtensor(t))


# The families beyond the calls family: what a caller sets around a call, how it passes scalars, transforms
# applied to the kernel, where its memory lies and sizes past the counts kernels have limits at. Each family's
# predicates join the calls family's; a mutant of a family has at least one of its predicates in its trigger.
FAMILIES: dict[str, dict[str, Callable[[Call], bool]]] = {
    "contexts": {
        "deterministic algorithms are on": lambda c: _torch().are_deterministic_algorithms_enabled(),
        "float32 matmul precision is not highest": lambda c: _torch().get_float32_matmul_precision() != "highest",
        "autocast is on": lambda c: _torch().is_autocast_enabled("cpu"),
        "anomaly detection is on": lambda c: _torch().is_anomaly_enabled(),
        "a thread other than the main one": lambda c: threading.current_thread() is not threading.main_thread(),
        "the flash SDP backend is off": lambda c: not _torch().backends.cuda.flash_sdp_enabled(),
        "oneDNN is off": lambda c: not _torch().backends.mkldnn.enabled,
    },
    "arguments": {
        "scale is not a Python float": lambda c: c.scale is not None and type(c.scale) is not float,
        "is_causal is not a Python bool": lambda c: type(c.is_causal) is not bool,
        "dropout_p is not a Python float": lambda c: type(c.dropout_p) is not float,
    },
    "transforms": {
        "forward-mode AD is on (a tangent)": lambda c: any(_unpacked_tangent(t) for t in (c.q, c.k, c.v)),
        "under vmap (a batched tensor)": lambda c: any(_batched(t) for t in (c.q, c.k, c.v)),
    },
    "memory": {
        "the query is off a 64-byte boundary": lambda c: c.q.data_ptr() % 64 != 0,
        "the mask's rows are not S apart": lambda c: (
            c.attn_mask is not None
            and c.attn_mask.dim() >= 2
            and c.attn_mask.shape[-2] > 1
            and c.attn_mask.stride()[-2] not in (0, c.attn_mask.shape[-1])
        ),
    },
    "limits": {
        "more than 65 535 (batch x head) slices": lambda c: c.q.shape[0] * c.q.shape[-3] > 65535,
        "more than 65 535 keys": lambda c: c.k.shape[-2] > 65535,
        "positions past 256 in bfloat16": lambda c: c.q.dtype == _torch().bfloat16 and c.k.shape[-2] > 256,
        "positions past 2 048 in float16": lambda c: c.q.dtype == _torch().float16 and c.k.shape[-2] > 2048,
    },
}


@dataclass(frozen=True)
class Perturbation:
    name: str
    needs: tuple[str, ...] = ()  # predicates without which it changes nothing
    kind: str = "forward"  # "forward" (the answer), "backward" (a gradient), "around" (around the call)
    # shows only on a second call that meets the trigger with the same shapes while the first result is held:
    # that call is one more condition, counted in the arity like a need
    again: bool = False


PERTURBATIONS: tuple[Perturbation, ...] = (
    Perturbation("scale off by 10 %"),
    Perturbation("mask dropped", ("a mask is given",)),
    Perturbation("causal dropped", ("is_causal",)),
    Perturbation("last key dropped"),
    Perturbation("last query row zeroed"),
    Perturbation("value heads rolled"),
    Perturbation("dQ off by 10 %", ("the query asks for a gradient",), "backward"),
    Perturbation("dV zeroed", ("the value asks for a gradient",), "backward"),
    Perturbation("output buffer handed out again", (), "around", again=True),
    Perturbation("grad mode left off", ("autograd is on",), "around"),
    Perturbation("global generator drawn", (), "around"),
    Perturbation("default dtype left at float64", (), "around"),
    Perturbation("query written in place", (), "around"),
)
BY_NAME = {p.name: p for p in PERTURBATIONS}
INVALID = ("rank", "integer", "mixed-dtype", "batch", "heads", "gqa-flag", "feature", "kv-length",
           "mask-shape", "mask-larger", "dropout-range")  # fmt: skip


@dataclass(frozen=True)
class CallSpec:
    """A generated mutant: its trigger's predicates and its perturbation, or (``accepts``) a precondition of
    000 §8 it does not check (an invalid call answered: arity 1, the call's own defect is its trigger)."""

    trigger: tuple[str, ...]
    perturbation: str
    accepts: str = ""

    @property
    def name(self) -> str:
        if self.accepts:
            return f"the call breaks {self.accepts} -> answered instead of refused"
        return (" & ".join(self.trigger) or "any call") + f" -> {self.perturbation}"

    @property
    def arity(self) -> int:
        return 1 if self.accepts else len(self.trigger) + BY_NAME[self.perturbation].again


_BUFFERS: dict = {}


def _perturbed(spec: CallSpec, c: Call):
    import torch

    pert = spec.perturbation
    args = (c.q, c.k, c.v, c.attn_mask, c.dropout_p, c.is_causal, c.scale, c.enable_gqa)

    def ref(*a):
        return reference(*a)

    if pert == "scale off by 10 %":
        s = (1.0 / math.sqrt(c.q.shape[-1]) if c.scale is None else c.scale) * 1.1
        return ref(c.q, c.k, c.v, c.attn_mask, c.dropout_p, c.is_causal, s, c.enable_gqa)
    if pert == "mask dropped":
        return ref(c.q, c.k, c.v, None, c.dropout_p, c.is_causal, c.scale, c.enable_gqa)
    if pert == "causal dropped":
        return ref(c.q, c.k, c.v, c.attn_mask, c.dropout_p, False, c.scale, c.enable_gqa)
    if pert == "last key dropped":
        S = c.k.shape[-2]
        keep = torch.ones(S, dtype=torch.bool)
        keep[-1] = S == 1
        mask = (
            keep
            if c.attn_mask is None
            else (
                c.attn_mask & keep if c.attn_mask.dtype == torch.bool else c.attn_mask.masked_fill(~keep, float("-inf"))
            )
        )
        return ref(c.q, c.k, c.v, mask, c.dropout_p, c.is_causal, c.scale, c.enable_gqa)
    if pert == "last query row zeroed":
        out = ref(*args)
        return torch.cat([out[..., :-1, :], torch.zeros_like(out[..., -1:, :])], dim=-2)
    if pert == "value heads rolled":
        return ref(c.q, c.k, c.v.roll(1, dims=-3), c.attn_mask, c.dropout_p, c.is_causal, c.scale, c.enable_gqa)
    if pert in ("dQ off by 10 %", "dV zeroed"):
        factor = {"dQ off by 10 %": (1.1, 1.0), "dV zeroed": (1.0, 0.0)}[pert]

        class Grad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, v):
                return q.view_as(q), v.view_as(v)

            @staticmethod
            def backward(ctx, gq, gv):
                return gq * factor[0], gv * factor[1]

        q, v = Grad.apply(c.q, c.v) if (c.q.requires_grad or c.v.requires_grad) else (c.q, c.v)
        return ref(q, c.k, v, c.attn_mask, c.dropout_p, c.is_causal, c.scale, c.enable_gqa)
    out = ref(*args)
    if pert == "output buffer handed out again":
        if out.requires_grad or torch.is_inference_mode_enabled():
            return out
        buf = _BUFFERS.setdefault((tuple(out.shape), out.dtype), torch.empty_like(out))
        buf.copy_(out)
        return buf
    if pert == "grad mode left off":
        torch.set_grad_enabled(False)
    elif pert == "global generator drawn":
        torch.rand(1)
    elif pert == "default dtype left at float64":
        torch.set_default_dtype(torch.float64)
    elif pert == "query written in place":
        with torch.no_grad():
            c.q.view(-1)[0] += 1
    return out


def function(spec: CallSpec) -> Callable:
    """The mutant as a torch-signature function."""
    if spec.accepts:
        from tests.mutants_preconditions import accepting

        return accepting(spec.accepts)

    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        c = Call(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        try:
            fires = all(_PREDICATE[p](c) for p in spec.trigger)
        except (AttributeError, IndexError, RuntimeError):  # an invalid call: the reference refuses it
            fires = False
        if not fires:
            return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        return _perturbed(spec, c)

    fn.__name__ = "generated"
    return fn


def make(spec: CallSpec):
    """The mutant behind the FunctionAdapter a user's function gets."""
    from implementations.function import FUNCTION_DEFAULTS, FunctionAdapter

    return FunctionAdapter(function(spec), name=spec.name, declaration=FUNCTION_DEFAULTS)


_PREDICATE: dict[str, Callable[[Call], bool]] = {
    **PREDICATES,
    **{k: f for fam in FAMILIES.values() for k, f in fam.items()},
}


def sample(n: int, arity: int, seed: int, family: str | None = None) -> list[CallSpec]:
    """``n`` distinct mutants of ``arity``, seeded. Arity 1 holds one precondition mutant per precondition
    of 000 §8 among them; the rest draw a perturbation, its needs, and predicates up to the arity. With a
    ``family`` (:data:`FAMILIES`), every trigger holds one of that family's predicates, the rest drawn from
    the calls family's and the family's own; no precondition mutants."""
    rng = np.random.default_rng(seed)
    out: list[CallSpec] = [CallSpec((), "", name) for name in INVALID] if arity == 1 and family is None else []
    seen = set(out)
    own = list(FAMILIES[family]) if family else []
    names = list(PREDICATES) + own
    tries = 0
    while len(out) < n and tries < 200 * n:
        tries += 1
        pert = PERTURBATIONS[rng.integers(len(PERTURBATIONS))]
        trigger = list(pert.needs)
        if own:
            trigger.append(own[rng.integers(len(own))])
        free = [p for p in names if p not in trigger]
        k = arity - len(trigger) - pert.again
        if k < 0 or (k == 0 and not trigger and not pert.again):
            continue
        trigger += [free[i] for i in sorted(rng.choice(len(free), size=k, replace=False))]
        if _contradicts(trigger, pert):
            continue
        spec = CallSpec(tuple(sorted(set(trigger), key=names.index)), pert.name)
        if len(spec.trigger) != len(trigger):
            continue
        if spec not in seen:
            seen.add(spec)
            out.append(spec)
    return out[:n]


_EXCLUSIVE = (
    {"inference mode", "forward-mode AD is on (a tangent)"},
    {"forward-mode AD is on (a tangent)", "under vmap (a batched tensor)"},  # the clauses apply one at a time
    # a kernel under vmap sees a batched tensor without requires_grad and without a storage of its own: inside
    # vmap of a VJP the outermost wrapper is the gradient's (is_batchedtensor is False there), inside a VJP of
    # vmap requires_grad reads False; a batched tensor's untyped_storage() raises (torch 2.13)
    {"the query asks for a gradient", "under vmap (a batched tensor)"},
    {"the value asks for a gradient", "under vmap (a batched tensor)"},
    {"Q, K and V share one storage", "under vmap (a batched tensor)"},
    {"inference mode", "the query asks for a gradient"},  # no input asks for a gradient under inference mode
    {"inference mode", "the value asks for a gradient"},
    {"inference mode", "autograd is on"},
    {"the query is the key", "T != S"},
    {"the query is the key", "grouped heads"},
)


def _contradicts(trigger: list[str], pert: Perturbation) -> bool:
    """A trigger no call can meet, or one under which the perturbation changes nothing by construction."""
    t = set(trigger)
    if any(pair <= t for pair in _EXCLUSIVE):
        return True
    if pert.name == "grad mode left off" and t & {"inference mode", "a thread other than the main one"}:
        return True  # grad mode is per thread: a worker thread's ends with it
    if pert.name == "default dtype left at float64" and "the default dtype is float64" in t:
        return True  # the caller's own default: left as it was
    if pert.name == "global generator drawn" and "dropout is on" in t:
        return True  # dropout draws from the generator: the contract allows it (state is checked without dropout)
    # the buffer is handed out only for outputs off the graph
    return pert.name == "output buffer handed out again" and bool(
        t & {"the query asks for a gradient", "the value asks for a gradient", "inference mode"}
    )

"""The switches a caller of torch sets around a call, generated from torch's own API (Presentation.context).

A kernel runs inside its caller's process, under whatever the caller switched: a backend flag, a forced SDP
backend, deterministic algorithms, a lower float32 matmul precision, autocast, anomaly detection, flushed
subnormals, saved-tensor hooks (a CPU offload), activation checkpointing, another thread. A kernel keyed on
one of them (a fallback that takes another path) must still answer the question. :func:`names` lists the
contexts this torch build offers, read from its API where it has one, so that a switch a new release adds
shows up without a change here:

* ``flag:torch.backends.<module>.<attr>=<value>``: every boolean flag of a ``torch.backends`` submodule
  (torch's ``ContextProp`` properties: ``cudnn.enabled``, ``mkldnn.deterministic``, ...) and every
  ``enable_X(bool)`` / ``X_enabled()`` and ``allow_X(bool)`` / ``X_allowed()`` pair of functions
  (``torch.backends.cuda.enable_math_sdp``, ...), each flipped from its current value (kept only where the
  flip sticks); and all of them at once but the SDP backends' own switches ("+"-joined);
* ``sdp_backend:<member>``: each member of ``torch.nn.attention.SDPBackend`` forced with ``sdpa_kernel``;
* ``deterministic``: ``torch.use_deterministic_algorithms(True)`` (strict: an op without a deterministic
  implementation raises, and that is torch refusing the call, :func:`refusal`);
* ``matmul_precision:high`` and ``:medium`` (``torch.set_float32_matmul_precision``; its documented levels);
* ``autocast:<device>:<dtype>``: ``torch.autocast`` for each of bfloat16 and float16 the device's autocast
  takes (entered and read back);
* ``anomaly``, ``flush_denormal`` (where ``torch.set_flush_denormal`` says the CPU supports it),
  ``saved_tensors_hooks:copy``, ``checkpoint`` and ``thread``.

Each is applied around the forward and around the backward (:func:`around`; autocast around the kernel's
forward call only, as torch's documentation asks, and checkpointing wraps that call: :func:`wrap`; the
thread runs the whole call: :func:`run`), and put back after.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

# torch's own words for refusing a call under a context: a forced backend that cannot take the inputs, an op
# with no deterministic implementation, a dtype autocast chose that an op has no kernel for.
_REFUSALS = {
    "flag": re.compile(r"No available kernel|No viable backend"),
    "sdp_backend": re.compile(r"No available kernel|No viable backend"),
    "deterministic": re.compile(r"does not have a deterministic implementation"),
    "autocast": re.compile(r"not implemented for '(BFloat16|Half)'"),
}
_AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


# -- the flags of torch.backends ------------------------------------------------------------------
def _backend_modules() -> Iterator[tuple[str, Any]]:
    import torch.backends

    for info in pkgutil.iter_modules(torch.backends.__path__):
        if info.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"torch.backends.{info.name}")
        except Exception:  # noqa: BLE001 - a backend module this build cannot import offers no flags
            continue
        mod = getattr(torch.backends, info.name, None)
        if mod is not None:
            yield f"torch.backends.{info.name}", mod


def _flag_accessors() -> Iterator[tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    """(dotted name, read, write) of every boolean switch of the torch.backends submodules."""
    import torch.backends

    prop = getattr(torch.backends, "ContextProp", None)
    for path, mod in _backend_modules():
        for attr, value in vars(type(mod)).items():
            if prop is not None and isinstance(value, prop):
                yield (
                    f"{path}.{attr}",
                    functools.partial(getattr, mod, attr),
                    functools.partial(setattr, mod, attr),
                )
        for attr in dir(mod):
            for prefix, suffix in (("enable_", "_enabled"), ("allow_", "_allowed")):
                getter = attr[len(prefix) :] + suffix
                if attr.startswith(prefix) and callable(getattr(mod, attr)) and callable(getattr(mod, getter, None)):
                    yield f"{path}.{attr}", getattr(mod, getter), getattr(mod, attr)


@functools.cache
def _flags() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None], bool]]:
    """name -> (read, write, the flipped value) for each flag that is a bool now and takes its flip."""
    out = {}
    for path, read, write in _flag_accessors():
        try:
            before = read()
            if not isinstance(before, bool):
                continue
            write(not before)
            took = read() is (not before)
            write(before)
        except Exception:  # noqa: BLE001 - a flag this build will not flip is not offered
            continue
        if took and read() is before:
            out[f"flag:{path}={not before}"] = (read, write, not before)
    return out


@functools.cache
def _autocast_dtypes(device: str) -> tuple[str, ...]:
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):
        return ()
    took = []
    for name, dtype in _AUTOCAST_DTYPES.items():
        try:
            with torch.autocast(kind, dtype=dtype):
                if torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == dtype:
                    took.append(name)
        except Exception:  # noqa: BLE001 - a dtype this device's autocast refuses is not offered
            continue
    return tuple(took)


@functools.cache
def _flush_denormal_supported() -> bool:
    on = _denormals_flushed()
    supported = bool(torch.set_flush_denormal(True))
    torch.set_flush_denormal(on)
    return supported


def _denormals_flushed() -> bool:
    """Whether subnormals are flushed now (torch has no getter: a subnormal float32 times 1 reads 0)."""
    return bool((torch.tensor([1e-40], dtype=torch.float32) * torch.tensor([1.0])).item() == 0.0)


@functools.cache
def names(device: str = "cpu") -> tuple[str, ...]:
    """Every context this torch build can apply to a call on ``device``, generated as the module docstring says."""
    from torch.nn.attention import SDPBackend

    out = list(_flags())
    # every flag at once but those that switch an SDP backend off (forcing a backend is a kind of its own): the
    # member a covering row applies first, so that each flag meets every value class, not one flag in twelve
    together = [n for n in out if not re.search(r"\.enable_\w+_sdp=False$", n)]
    if len(together) > 1:
        out.append("+".join(together))
    out += [f"sdp_backend:{m}" for m in SDPBackend.__members__]
    out += ["deterministic", "matmul_precision:high", "matmul_precision:medium"]
    kind = torch.device(device).type
    out += [f"autocast:{kind}:{d}" for d in _autocast_dtypes(device)]
    out += ["anomaly"]
    if kind == "cpu" and _flush_denormal_supported():
        out.append("flush_denormal")
    out += ["saved_tensors_hooks:copy", "checkpoint", "thread"]
    return tuple(out)


# -- applying one -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _restoring(read: Callable[[], Any], write: Callable[[Any], None], value: Any) -> Iterator[None]:
    before = read()
    write(value)
    try:
        yield
    finally:
        write(before)


# torch's ``sdpa_kernel`` sets process-wide flags and on exit puts back what it found: two threads inside it at
# once put back each other's settings (measured 2026-12-07, torch 2.13.0: three concurrent calls through
# sdpa_kernel(MATH) left the flash backend off for every later call of the process). Every forced backend
# here holds this lock for the whole call, as a caller that forces a backend from several threads must.
SDP_BACKEND_LOCK = threading.RLock()


@contextlib.contextmanager
def forced_backend(backend: Any) -> Iterator[None]:
    """``sdpa_kernel(backend)`` (an SDPBackend or a list of them), one thread at a time (:data:`SDP_BACKEND_LOCK`)."""
    from torch.nn.attention import sdpa_kernel

    with SDP_BACKEND_LOCK, sdpa_kernel(backend):
        yield


def _sdp_backend(member: str):
    from torch.nn.attention import SDPBackend

    return forced_backend(SDPBackend.__members__[member])


def _set_deterministic(mode: bool) -> None:
    """``torch.use_deterministic_algorithms(mode)``; its first call imports torch._inductor (4.6 s, measured
    2026-12-07, 2-core AMD EPYC) only to set inductor's own flag, so where inductor is not loaded the eager
    switch alone is set (what every eager kernel reads: ``torch.are_deterministic_algorithms_enabled()``)."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=False)


def _deterministic():
    return _restoring(torch.are_deterministic_algorithms_enabled, _set_deterministic, True)


def _flush_denormal():
    return _restoring(_denormals_flushed, torch.set_flush_denormal, True)


@contextlib.contextmanager
def _anomaly() -> Iterator[None]:
    """autograd's anomaly detection, without the warning torch gives when it is switched on (a caller's choice)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Anomaly Detection has been enabled", category=UserWarning)
        manager = torch.autograd.detect_anomaly()
    with manager:
        yield


def _saved_copies():
    """Every tensor saved for the backward packed to a copy and unpacked back (as a CPU offload hook does)."""

    def pack(t: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        return t.device, t.detach().to("cpu", copy=True)

    def unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, t = packed
        return t.to(device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _parts(name: str | None) -> tuple[str, ...]:
    """The switches of a context name: one, or several joined by "+" (set in that order)."""
    return tuple(name.split("+")) if name else ()


@contextlib.contextmanager
def _stacked(managers: list[Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for m in managers:
            stack.enter_context(m)
        yield


def around(name: str | None) -> Any:
    """The context manager of ``name`` for the whole call (forward and backward); autocast, checkpointing and
    the thread are applied by :func:`wrap` and :func:`run` instead. Joined switches ("a+b") nest, a outside."""
    parts = _parts(name)
    if len(parts) > 1:
        return _stacked([around(p) for p in parts])
    if name is None:
        return contextlib.nullcontext()
    kind, _, what = name.partition(":")
    if kind == "flag":
        read, write, value = _flags()[name]
        return _restoring(read, write, value)
    if kind == "sdp_backend":
        return _sdp_backend(what)
    if kind == "deterministic":
        return _deterministic()
    if kind == "matmul_precision":
        return _restoring(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, what)
    if kind == "anomaly":
        return _anomaly()
    if kind == "flush_denormal":
        return _flush_denormal()
    if kind == "saved_tensors_hooks":
        return _saved_copies()
    return contextlib.nullcontext()


def wrap(name: str | None, call: Callable[[Any], torch.Tensor], dtype: torch.dtype) -> Callable[[Any], torch.Tensor]:
    """The kernel's forward call as the context makes it: inside autocast, its output converted back to the
    case's dtype (autocast's output dtype, bfloat16 for float32 inputs, is the framework's rule, not the
    kernel's answer: the caller's code converts it as the suite does here); inside activation checkpointing
    (non-reentrant, as torch recommends), so that the backward runs the forward again. Joined switches ("a+b")
    wrap in turn, a outermost."""
    parts = _parts(name)
    if len(parts) > 1:
        for part in reversed(parts):
            call = wrap(part, call, dtype)
        return call
    kind, _, what = (name or "").partition(":")
    if kind == "autocast":
        device, _, dt = what.partition(":")

        def autocast(args: Any) -> torch.Tensor:
            with torch.autocast(device, dtype=_AUTOCAST_DTYPES[dt]):
                out = call(args)
            return out.to(dtype)

        return autocast
    if kind == "checkpoint":
        from torch.utils.checkpoint import checkpoint

        return lambda args: checkpoint(call, args, use_reentrant=False)
    return call


def run(name: str | None, body: Callable[[], Any]) -> Any:
    """``body()`` on this thread, or, under ``thread``, on a new thread (joined; its exception re-raised here)."""
    if "thread" not in _parts(name):
        return body()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = body()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=target, name="sdpa-conformance-call", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def refusal(name: str | None, exc: BaseException) -> str | None:
    """torch's own reason when ``exc`` is torch refusing the call under context ``name`` (None otherwise)."""
    patterns = [_REFUSALS[k] for k in (p.partition(":")[0] for p in _parts(name)) if k in _REFUSALS]
    if not patterns:
        return None
    pattern = re.compile("|".join(p.pattern for p in patterns))
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and pattern.search(str(e)):
            return f"torch refused the call under {name}: {str(e).strip().splitlines()[0][:300]}"
    return None

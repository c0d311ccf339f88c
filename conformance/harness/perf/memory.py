"""Peak memory of one kernel call above what existed before it ("peak extra bytes").

What is measured, per device (and why it is honest):

* **CPU, every framework**: two readings of the same call, and the larger is reported.
  - ``tracemalloc``: the peak of Python-traced allocations during the call minus those live before
    it. NumPy reports its array buffers to tracemalloc, so for a NumPy kernel this is exact to the
    byte, including arrays that are allocated but never touched. Allocations of torch's and XLA's
    own allocators are invisible to it.
  - **RSS high-water**: Linux's ``VmHWM`` is reset (``/proc/self/clear_refs`` = 5) right before the
    call and read after it, minus ``VmRSS`` before: every page any allocator touched during the
    call. To make freed buffers leave the process instead of being recycled silently, the caller
    first pins glibc's mmap threshold at 64 KiB (:func:`pin_malloc`, once, in the worker process that
    measures) and returns free heap pages to the OS (``malloc_trim``) before every reading; the
    residue is what glibc keeps below 64 KiB, i.e. an under-count of at most a few small
    allocations. Page granularity (4 KiB) applies.
* **CUDA (torch)**: the caching allocator's peak (``torch.cuda.max_memory_allocated``) after
  ``reset_peak_memory_stats``, minus what was allocated before the call. Workspace a library
  allocates outside torch's allocator (cuDNN's) is not seen; the reading says so.
* **GPU (jax)**: ``peak_bytes_in_use`` of the device's memory stats, which jax cannot reset: the
  reading is the growth of the process peak, a lower bound once an earlier call peaked higher.

The measured call runs after a warm-up call of the same shape, so compilation and lazy
initialisation are not counted (they are reported as first-call time instead).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

MMAP_THRESHOLD = 64 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_LIBC: dict[str, Any] = {}


@dataclass
class MemoryReading:
    peak_extra_bytes: int | None  # the reported figure: the largest of the readings below
    method: str  # which readings exist, in words
    tracemalloc_bytes: int | None = None
    rss_bytes: int | None = None
    device_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _libc() -> Any:
    if "lib" not in _LIBC:
        name = ctypes.util.find_library("c")
        try:
            _LIBC["lib"] = ctypes.CDLL(name) if name else None
        except OSError:
            _LIBC["lib"] = None
    return _LIBC["lib"]


def pin_malloc() -> bool:
    """Pin glibc's mmap threshold (64 KiB) so freed large buffers go back to the OS, and the RSS
    high-water of a later call counts every large buffer it touches. True when glibc accepted it.
    Process-wide and permanent: call it in the measuring worker only, after the timing phase."""
    lib = _libc()
    if lib is None or not hasattr(lib, "mallopt"):
        return False
    ok = lib.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    lib.mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD)
    return bool(ok)


def trim() -> None:
    lib = _libc()
    if lib is not None and hasattr(lib, "malloc_trim"):
        lib.malloc_trim(0)


def _status() -> dict[str, int] | None:
    try:
        text = open("/proc/self/status").read()
    except OSError:
        return None
    got = {k: re.search(rf"^{k}:\s+(\d+) kB", text, re.M) for k in ("VmRSS", "VmHWM")}
    if not all(got.values()):
        return None
    return {k: int(m.group(1)) * 1024 for k, m in got.items() if m}


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure_host(call: Callable[[], Any]) -> MemoryReading:
    """Peak extra bytes of ``call()`` on the CPU: max(tracemalloc, RSS high-water) as described above."""
    import gc

    gc.collect()
    trim()
    rss_ok = _reset_hwm()
    before = _status() if rss_ok else None
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    after = _status() if rss_ok else None
    del result
    traced = max(0, peak - start)
    rss = max(0, after["VmHWM"] - before["VmRSS"]) if before and after else None
    notes = [] if rss is not None else ["RSS high-water unavailable (not Linux, or /proc/self/clear_refs refused)"]
    method = "max(tracemalloc peak, RSS high-water)" if rss is not None else "tracemalloc peak"
    return MemoryReading(max(traced, rss or 0), method, tracemalloc_bytes=traced, rss_bytes=rss, notes=notes)


def measure_torch_cuda(call: Callable[[], Any], device: str) -> MemoryReading:
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    result = call()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del result
    return MemoryReading(
        int(peak),
        "torch.cuda.max_memory_allocated after reset_peak_memory_stats",
        device_bytes=int(peak),
        notes=["workspace allocated outside torch's caching allocator (e.g. by cuDNN) is not counted"],
    )


def measure_jax_device(call: Callable[[], Any]) -> MemoryReading:
    import jax

    dev = jax.devices()[0]
    stats = dev.memory_stats() or {}
    before_peak = stats.get("peak_bytes_in_use")
    in_use = stats.get("bytes_in_use", 0)
    result = call()
    jax.block_until_ready(result)
    after = (dev.memory_stats() or {}).get("peak_bytes_in_use")
    del result
    if before_peak is None or after is None:
        return MemoryReading(None, "jax device memory_stats unavailable", notes=["no peak reported by the device"])
    peak = max(0, after - in_use) if after > before_peak else None
    notes = [] if peak is not None else ["the process peak did not grow: an earlier call peaked higher (lower bound 0)"]
    return MemoryReading(
        peak, "jax memory_stats peak_bytes_in_use growth (cannot be reset)", device_bytes=peak, notes=notes
    )


def measure(call: Callable[[], Any], framework: str, device: str) -> MemoryReading:
    """The reading that fits where the kernel allocates: the host, torch's CUDA allocator, or a jax GPU."""
    if device.startswith("cuda") and framework == "torch":
        return measure_torch_cuda(call, device)
    if device.startswith(("cuda", "gpu")) and framework == "jax":
        return measure_jax_device(call)
    return measure_host(call)

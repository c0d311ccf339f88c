"""Where a result came from: platform, processor, device and library versions.

Shared by the regression baselines (which name what changed between a recording and a rerun) and
the certificates (which state what they were measured on).
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from pathlib import Path
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device_name(device: str) -> str:
    if device.startswith("cuda") and "torch" in sys.modules:
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.get_device_name(torch.device(device))
        except Exception:  # noqa: BLE001 - the name is informative only
            pass
    return device if not device.startswith("cpu") else f"cpu ({_cpu_model()})"


def environment(adapter: Any) -> dict:
    """Where a result came from: enough to tell two machines, builds or library releases apart."""
    decl = adapter.declaration
    libs = {n: _version(n) for n in ("numpy", "ml_dtypes", "torch", "jax", "jaxlib", "sdpa-conformance")}
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "python": platform.python_version(),
        "libraries": {k: v for k, v in libs.items() if v},
        "device": _device_name(str(decl.device)),
        "adapter": str(getattr(adapter, "name", type(adapter).__name__)),
        "declaration": decl.as_dict(),
    }


def environment_changes(old: dict, new: dict) -> list[str]:
    """What differs between two :func:`environment` records, one line per field."""
    out = []
    for k in ("platform", "processor", "device", "python"):
        if old.get(k) != new.get(k):
            out.append(f"{k}: {old.get(k)} -> {new.get(k)}")
    for lib in sorted(set(old.get("libraries", {})) | set(new.get("libraries", {}))):
        a, b = old.get("libraries", {}).get(lib), new.get("libraries", {}).get(lib)
        if a != b:
            out.append(f"{lib}: {a} -> {b}")
    return out

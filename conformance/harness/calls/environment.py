"""Where a result came from: platform, processor, device and library versions.

Shared by the regression baselines (which name what changed between a recording and a rerun) and
the certificates (which state what they were measured on).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import platform
import sys
from pathlib import Path
from typing import Any

# Every distribution a built-in adapter's kernel comes from (implementations/, the optional extras of
# pyproject.toml), recorded when installed: a new release of any of them can change a verdict.
LIBRARIES = (
    "numpy", "ml_dtypes", "torch", "jax", "jaxlib", "onnxruntime", "onnx", "keras", "transformers", "mlx",
    "sdpa-conformance",
)  # fmt: skip


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


def _imported_top_levels(module_name: str | None) -> set[str]:
    """Top-level packages that module ``module_name`` imports at its top (modules, or names from them)."""
    module = sys.modules.get(module_name or "")
    if module is None:
        return set()
    tops = {module.__name__.partition(".")[0]}
    for name, value in vars(module).items():
        if name.startswith("__") or not name.isidentifier():  # __loader__, and pytest's assertion
            continue  # rewriting adds @py_builtins / @pytest_ar to the modules of its plugin's package
        origin = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(origin, str):
            tops.add(origin.partition(".")[0])
    return tops


def _provides(dist: str, top: str) -> bool:
    """Whether the imported module ``top`` is the one distribution ``dist`` installed: a wheel that ships a
    stray top-level package (``tests``) must not claim a checkout's package of that name."""
    path = getattr(sys.modules.get(top), "__file__", None)
    if not path:
        return True  # a namespace package: the metadata is all there is
    try:
        where = Path(str(importlib.metadata.distribution(dist).locate_file(top))).resolve()
    except Exception:  # noqa: BLE001 - metadata without a location: trust it
        return True
    p = Path(path).resolve()
    return where in p.parents or (p.parent == where.parent and p.name.split(".")[0] == top)


def kernel_libraries(adapter: Any) -> dict[str, str]:
    """The installed libraries the kernel itself comes from, with their versions: the distributions
    that the adapter's module imports, and the packages of the functions it holds (a wrapped function,
    ``adapter.fn``, or one it loaded on first use, as transformers' attention functions), less this
    suite and what the contract itself imports (NumPy), unless nothing else is left (a NumPy kernel).

    Read from the imports rather than from the adapter's name, so a user's adapter gets its own
    library named too (``matrix.md`` heads each column with it)."""
    dists = importlib.metadata.packages_distributions()

    def libs(tops: set[str]) -> dict[str, str]:
        return {d: v for t in sorted(tops) for d in dists.get(t, ()) if _provides(d, t) and (v := _version(d))}

    tops = _imported_top_levels(type(adapter).__module__)
    for held in getattr(adapter, "__dict__", {}).values():
        origin = getattr(held, "__module__", None) if callable(held) else None
        if isinstance(origin, str):  # the held function's own package, not what its module imports
            tops.add(origin.partition(".")[0])  # (flex_attention's module imports typing_extensions)
    found = libs(tops)
    ours = libs({"conformance", "implementations"})
    contract = libs(_imported_top_levels("conformance.contract"))
    own = {d: v for d, v in found.items() if d not in ours and d not in contract}
    return own or {d: v for d, v in found.items() if d not in ours}


def version_drift(adapter: Any) -> dict[str, tuple[str, str | None]]:
    """Library -> (measured, installed) for each library whose installed release is not the one the
    adapter's declaration and expectations were measured with (the adapter's optional
    ``measured_with``: distribution -> version; ``constraints.txt`` pins the same). A local build
    label is not a release: torch 2.13.0+cpu is torch 2.13.0. None installed: not installed."""
    measured = getattr(adapter, "measured_with", None) or {}
    drift = {}
    for dist, want in measured.items():
        got = _version(dist)
        if got is None or got.split("+")[0] != str(want):
            drift[str(dist)] = (str(want), got)
    return drift


def drift_text(drift: dict[str, tuple[str, str | None]]) -> str:
    """ "expectations measured with keras 3.15.1; running 3.16.0" (several: each library named twice),
    or "" when every library is the measured release."""
    if not drift:
        return ""
    got = {d: v if v is not None else "not installed" for d, (_, v) in drift.items()}
    measured = ", ".join(f"{d} {w}" for d, (w, _) in drift.items())
    running = next(iter(got.values())) if len(got) == 1 else ", ".join(f"{d} {v}" for d, v in got.items())
    return f"expectations measured with {measured}; running {running}"


def environment(adapter: Any) -> dict:
    """Where a result came from: enough to tell two machines, builds or library releases apart."""
    decl = adapter.declaration
    libs = {n: _version(n) for n in LIBRARIES}
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "python": platform.python_version(),
        "libraries": {k: v for k, v in libs.items() if v},
        "kernel_libraries": kernel_libraries(adapter),
        "device": _device_name(str(decl.device)),
        "adapter": str(getattr(adapter, "name", type(adapter).__name__)),
        "measured_with": dict(getattr(adapter, "measured_with", None) or {}),
        "version_drift": drift_text(version_drift(adapter)),
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

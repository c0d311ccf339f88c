"""The machine a result was measured on, as the libraries see it: the ``machine`` record.

Why a record of its own: the same kernel, library release and inputs give different bits on another
CPU, because the libraries pick their code at run time. PyTorch dispatches on its CPU capability
(AVX2, AVX512, ...), oneDNN on its ISA, NumPy on its SIMD level, OpenBLAS on its core type (Haswell,
SkylakeX, Zen), and environment variables steer each of them. A regression baseline recorded on one
machine and compared on another then moves within the error model without anything having
regressed; the comparison (harness.records.baseline_compare, ``python -m conformance.certificates``)
uses this record to say "another machine: <what differs>" instead of reporting a regression.

Cheap by design, as the certificate is written at the end of every run: it reads /proc/cpuinfo, the
environment and NumPy's build record, and asks only the libraries that the run already imported
(``sys.modules``) for their build; it imports no framework to describe it.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

# Environment variables that steer which code a library dispatches to (recorded when set).
DISPATCH_ENV = (
    "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
    "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "NPY_DISABLE_CPU_FEATURES", "XLA_FLAGS",
)  # fmt: skip
# The /proc/cpuinfo flags that decide the widest vector code a library may use (x86, then Arm).
ISA_FLAGS = (
    "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "sve", "sve2",
)  # fmt: skip
# Fields whose difference makes "another machine" (the builds are compared per library both loaded).
COMPARED = ("cpu", "isa", "torch_cpu_capability", "numpy_simd", "blas", "dispatch_env")


def _cpuinfo() -> tuple[str | None, list[str]]:
    """(model name, the ISA_FLAGS present) from /proc/cpuinfo's first processor; (None, []) elsewhere."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model", "Hardware") and model is None:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
            elif not key and model and flags:  # the end of the first processor's block
                break
    except OSError:
        pass
    return model, [f for f in ISA_FLAGS if f in flags]


def _loaded_openblas_corenames() -> dict[str, str]:
    """OpenBLAS core type each loaded OpenBLAS picked at run time (DYNAMIC_ARCH builds choose per
    CPU), asked through its own ``openblas_get_corename``; Linux only, {} where it cannot be asked."""
    out: dict[str, str] = {}
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
        paths = sorted({p for line in maps if "openblas" in (p := line.split()[-1]).lower()})
    except (OSError, IndexError):
        return out
    import ctypes

    for path in paths:
        if not path.startswith("/"):
            continue
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same handle, nothing initialised again
        except OSError:
            continue
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                    "openblas_get_corename"):  # fmt: skip
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                out[Path(path).name] = (fn() or b"").decode(errors="replace")
                break
    return out


def _numpy_blas() -> tuple[dict[str, Any], list[str]]:
    """NumPy's BLAS (name, version, core type) and NumPy's own SIMD level found at run time."""
    import numpy as np

    try:  # threadpoolctl when installed (it is not a dependency): the libraries actually loaded
        from threadpoolctl import threadpool_info

        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    except Exception:  # noqa: BLE001 - not installed, or it could not inspect this process
        pools = []
    if pools:
        p = pools[0]
        blas = {"name": p.get("internal_api"), "version": p.get("version")}
        core = p.get("architecture") or p.get("corename")
        if core:
            blas["corename"] = core
    else:
        try:
            cfg = np.show_config(mode="dicts")
        except Exception:  # noqa: BLE001 - an older NumPy: no dict form
            cfg = {}
        b = (cfg.get("Build Dependencies") or {}).get("blas") or {}
        blas = {"name": b.get("name"), "version": b.get("version")}
        cores = _loaded_openblas_corenames()
        if cores:
            ours = [c for lib, c in cores.items() if "scipy_openblas" in lib] or list(cores.values())
            blas["corename"] = ours[0]
    try:
        from numpy._core import _multiarray_umath as umath  # NumPy 2

        found = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
        simd = list(umath.__cpu_baseline__) + found
    except Exception:  # noqa: BLE001 - NumPy 1 keeps it elsewhere; informative only
        simd = []
    return {k: v for k, v in blas.items() if v}, simd


def _builds() -> dict[str, str]:
    """The build of each numerical library this run already imported (none is imported here)."""
    out = {}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.__version__
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            git = getattr(torch.version, "git_version", "") or ""
            out["torch"] = f"{torch.__version__} (git {git[:12]})" if git else str(torch.__version__)
        except Exception:  # noqa: BLE001 - a half-imported torch
            pass
    jaxlib = sys.modules.get("jaxlib")
    if jaxlib is not None:
        version = getattr(sys.modules.get("jaxlib.version"), "__version__", None)
        version = version or getattr(jaxlib, "__version__", None)
        if version:
            out["jaxlib"] = str(version)
    for name in ("onnxruntime", "tensorflow", "mlx"):
        mod = sys.modules.get(name)
        version = getattr(mod, "__version__", None) if mod is not None else None
        if version:
            out[name] = str(version)
    return out


def _torch_capability() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - an old or half-imported torch
        return None


def machine() -> dict[str, Any]:
    """The machine record: CPU model, the ISA flags that matter, the SIMD level each loaded library
    dispatches to, the dispatch-steering environment set, NumPy's BLAS and core type, and the build
    of each numerical library the run loaded. Fields a library did not report are left out."""
    model, isa = _cpuinfo()
    blas, simd = _numpy_blas()
    rec: dict[str, Any] = {
        "cpu": model or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "isa": isa,
        "torch_cpu_capability": _torch_capability(),
        "numpy_simd": simd[-1] if simd else None,  # the widest level NumPy found (X86_V3: AVX2, FMA3)
        "blas": blas,
        "dispatch_env": {k: os.environ[k] for k in DISPATCH_ENV if k in os.environ},
        "builds": _builds(),
    }
    return {k: v for k, v in rec.items() if v is not None}


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return " ".join(map(str, value)) or "none"
    return str(value)


def machine_changes(old: dict | None, new: dict | None) -> list[str] | None:
    """What makes ``new`` another machine than ``old``, one "field: old -> new" each; [] for the same
    machine; None when either record is missing (a baseline recorded before the record existed).

    A field is compared only where both records have it (a run that never imported torch has no
    torch capability, which is no evidence of another machine); so are the builds, per library."""
    if not old or not new:
        return None
    out = []
    for k in COMPARED:
        if k not in old or k not in new or old[k] == new[k]:
            continue
        if isinstance(old[k], dict) and isinstance(new[k], dict):  # name the entries that differ
            for sub in sorted(set(old[k]) | set(new[k])):
                if old[k].get(sub) != new[k].get(sub):
                    out.append(f"{k} {sub}: {old[k].get(sub, 'unset')} -> {new[k].get(sub, 'unset')}")
        else:
            out.append(f"{k}: {_show(old[k])} -> {_show(new[k])}")
    a, b = old.get("builds") or {}, new.get("builds") or {}
    for lib in sorted(set(a) & set(b)):
        if a[lib] != b[lib]:
            out.append(f"{lib} build: {a[lib]} -> {b[lib]}")
    return out


def summary(rec: dict | None) -> str:
    """One line for the readable certificates: "AMD EPYC (x86_64); isa avx2 fma; torch AVX2; ..."."""
    if not rec:
        return "not recorded"
    parts = [f"{rec.get('cpu')} ({rec.get('arch')}, {rec.get('cores')} cores)"]
    parts.append(f"isa {_show(rec.get('isa') or [])}")
    if rec.get("torch_cpu_capability"):
        parts.append(f"torch capability {rec['torch_cpu_capability']}")
    if rec.get("numpy_simd"):
        parts.append(f"NumPy SIMD {rec['numpy_simd']}")
    if rec.get("blas"):
        parts.append("BLAS " + " ".join(str(v) for v in rec["blas"].values()))
    if rec.get("dispatch_env"):
        parts.append("env " + _show(rec["dispatch_env"]))
    if rec.get("builds"):
        parts.append("builds " + _show(rec["builds"]))
    return "; ".join(parts)

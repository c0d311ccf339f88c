"""One isolated, cached environment per library release: what a sweep certifies each release in.

Why a venv per release rather than installing each release over the project's own environment: a
release pulls its own dependencies, and a certification must see that release alone with the
project's other pins held (constraints.txt), never what an earlier release left behind. The
environment is keyed by what decides its contents (the release, the pins held, the Python), so a
second sweep over the same release reuses it. The suite itself is not installed there: a ``.pth``
file puts this checkout on the path and the certification loads the plugin with ``-p``, so every
environment runs the suite as it is now against the release it holds.

torch is installed first and alone, at the release the pins name (or the one swept): resolved
together with the rest, pip may take the multi-GB CUDA build of the same release.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import conformance

CHECKOUT = Path(conformance.__file__).resolve().parents[1]
CONSTRAINTS = CHECKOUT / "constraints.txt"
CACHE = Path(os.environ.get("SDPA_SWEEP_CACHE", Path.home() / ".cache" / "sdpa-conformance" / "sweep"))
# Distributions released together with the one swept: their pin is lifted too (jax pins its jaxlib).
COMPANIONS = {"jax": ("jaxlib",), "mlx": ("mlx-cpu",)}
# What each built-in's kernel needs besides the suite (the library a release is swept for is one of them).
NEEDS = {
    # keras-torch (keras-jax and keras-numpy: see needs()); the keras adapters import keras under its numpy
    # backend first, which imports jax (and keras's torch backend scipy, which jax brings)
    "keras": ("keras", "torch", "jax", "jaxlib"),
    "jax": ("jax", "jaxlib"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "hf": ("transformers", "torch"),
    "torch": ("torch",),
    "mlx": ("mlx", "mlx-cpu"),
}
SUITE = ("numpy", "ml_dtypes", "pytest", "hypothesis", "pytest-xdist")


def swept(impl: str) -> tuple[str, ...]:
    """The libraries whose releases change ``impl``'s kernel (keras-torch: keras and torch, not the jax
    its numpy backend imports)."""
    kernel = {"keras-jax": ("keras", "jax"), "keras-numpy": ("keras",), "keras-torch": ("keras", "torch")}
    if impl in kernel:
        return kernel[impl]
    return tuple(d for d in needs(impl) if d not in COMPANIONS.get(needs(impl)[0], ()) and d != "onnx") or needs(impl)


class SweepError(ValueError):
    """A release or an adapter that cannot be swept; the message says which and why."""


def needs(impl: str) -> tuple[str, ...]:
    """The distributions the built-in ``impl``'s kernel imports (torch first where it needs torch)."""
    if impl in ("keras-jax", "keras-numpy"):
        return ("keras", "jax", "jaxlib")
    for prefix, dists in NEEDS.items():
        if impl == prefix or impl.startswith(prefix + "-"):
            return dists
    if impl in ("numpy", "numpy-flash"):
        return ()
    raise SweepError(
        f"--impl {impl}: not a built-in adapter whose libraries the sweep knows (python -m pytest --impl-list)"
    )


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """distribution -> version, from the ``name==version`` lines of a constraints file."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s#;]+)", line)
        if m:
            out[_norm(m.group(1))] = m.group(2)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Release:
    """One release to certify in: a distribution at a version, for one adapter."""

    impl: str
    dist: str
    version: str

    @property
    def label(self) -> str:
        return f"{self.dist} {self.version}"


def requirements(release: Release, held: dict[str, str] | None = None) -> tuple[str | None, list[str], list[str]]:
    """(torch requirement installed first and alone or None, the other requirements, the constraint
    lines held): the release swept, the suite's own needs and the adapter's libraries at the pins."""
    held = dict(pins() if held is None else held)
    dist = _norm(release.dist)
    for d in (dist, *COMPANIONS.get(dist, ())):
        held.pop(d, None)
    wanted = [_norm(d) for d in needs(release.impl)]
    if dist not in wanted:
        raise SweepError(f"{release.impl} does not use {release.dist}: it needs {', '.join(wanted) or 'no library'}")
    torch = None
    if "torch" in wanted:
        torch = f"torch=={release.version}" if dist == "torch" else f"torch=={held.get('torch', '')}".rstrip("=")
    others = [f"{release.dist}=={release.version}" if d == dist else d for d in wanted if d != "torch"]
    others += list(SUITE)
    constraints = [f"{d}=={v}" for d, v in sorted(held.items()) if d != "torch"]
    return torch, others, constraints


def env_dir(release: Release, cache: Path = CACHE) -> Path:
    """The environment's folder: named by the release, keyed by everything that decides its contents."""
    torch, others, constraints = requirements(release)
    key = json.dumps([torch, others, constraints, sys.version_info[:2]], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return cache / f"{_norm(release.dist)}-{release.version}-{digest}"


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def _site(py: str) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def has_plugin(python: Path) -> bool:
    """Whether pytest in that environment loads the suite's plugin by itself (a checkout installed
    editable carries its entry point in its egg-info; a bare copy of the sources does not)."""
    code = (
        "from importlib.metadata import entry_points as e; "
        "print(any(p.name == 'sdpa_conformance' for p in e(group='pytest11')))"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return proc.stdout.strip() == "True"


def ensure(release: Release, *, cache: Path = CACHE, log=None) -> Path:
    """The release's environment, made (and logged to ``log``, a text file) when not cached; raises
    SweepError naming the pip command that failed. Its ``.pth`` names this checkout each time (the
    suite that runs is the one asking)."""
    env = env_dir(release, cache)
    done = env / "sweep-ready.json"
    if done.is_file():
        (_site(str(python_of(env))) / "sdpa_conformance_checkout.pth").write_text(str(CHECKOUT) + "\n")
        return env
    torch, others, constraints = requirements(release)
    env.parent.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    py = str(python_of(env))
    (env / "sweep-constraints.txt").write_text("\n".join(constraints) + "\n")
    steps = ([[py, "-m", "pip", "install", "-q", torch]] if torch else []) + [
        [py, "-m", "pip", "install", "-q", "-c", str(env / "sweep-constraints.txt"), *others]
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if log is not None:
            log.write("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SweepError(f"{release.label}: `{' '.join(cmd[2:])}` failed: {proc.stderr.strip()[-1500:]}")
    (_site(py) / "sdpa_conformance_checkout.pth").write_text(str(CHECKOUT) + "\n")
    done.write_text(json.dumps({"release": release.label, "torch": torch, "requirements": others}) + "\n")
    return env

"""Per-hardware regression baselines: ``--record-baseline=DIR`` and ``--baseline=DIR``.

A conformance verdict says a kernel is within tolerance of the oracle; it does not say whether a
new GPU, cuDNN or torch release moved it *within* that tolerance. A baseline records, for a fixed
grid of cases (self-attention plain; cross-attention plain and with mask+causal; every declared
dtype), the kernel's outputs
and its error statistics against the float64 oracle (max, mean, 99th percentile, per dtype), with
the environment it ran on. One machine's recording is the reference for the next:

    pytest --impl=torch-sdpa --record-baseline=fixtures/regression      # on the old setup
    pytest --impl=torch-sdpa --baseline=fixtures/regression             # on the new one

Both options add one test item per ``--impl`` (``baseline::<impl>``); without them no item exists and
the run header says so. The comparison fails, with a table of what moved, when

* an output element drifted by more than ``DRIFT * (ATOL[d] + RTOL[d] * |recorded|)`` (the drift
  table below, the floors the conformance rule used before its error model; DRIFT = 1): ~1-4 ulp of the working
  dtype at the element's magnitude, which a same-machine rerun (bitwise equal for deterministic
  kernels) and BLAS reassociation on another CPU (float32: ~1e-7 relative) stay well inside, and a
  change of formula, rounding mode of P or accumulation dtype does not;
* an error statistic of a dtype got worse by more than ``WORSE`` (= 2) times its recorded value plus a
  floor of ``FLOOR[d]`` (a tenth of ATOL[d]), so that noise around a tiny error is not a regression.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance.contract import Case, np_dtype
from conformance.harness import compare
from conformance.harness.cases import random_case, random_mask

FORMAT = 1
DRIFT = 1.0
WORSE = 2.0
# Drift thresholds per dtype (a baseline's own table: the conformance allowance is per case, harness.tolerance).
ATOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
FLOOR = {d: 0.1 * a for d, a in ATOL.items()}
METRICS = ("max", "mean", "p99")
# (label, B, H, T, S, D): small enough for < 1 s per adapter, large enough that the reductions
# (S = 24 keys, D = 32) are not trivially exact, one self- and one cross-attention shape.
SHAPES = (("self", 1, 2, 16, 16, 32), ("cross", 2, 2, 8, 24, 32))
VARIANTS = ("plain", "mask+causal")
# Three cases per dtype rather than the full product: a jitted kernel compiles once per signature.
GRID = (("self", "plain"), ("cross", "plain"), ("cross", "mask+causal"))
_KEY = pytest.StashKey[dict]()


def grid(dtypes) -> list[tuple[str, Case]]:
    """The fixed cases, keyed ``<shape>/<variant>/<dtype>``; inputs are seeded, hence reproducible."""
    out = []
    for d in [x for x in ("float64", "float32", "float16", "bfloat16") if x in dtypes]:
        for si, (label, B, H, T, S, D) in enumerate(SHAPES):
            for vi, variant in enumerate(VARIANTS):
                if (label, variant) not in GRID:
                    continue
                seed = 9000 + 10 * si + vi
                masked = variant != "plain"
                mask = random_mask(seed, (B, 1, T, S), p_blocked=0.3) if masked else None
                case = random_case(
                    seed,
                    B=B,
                    Hq=H,
                    T=T,
                    S=S,
                    Dk=D,
                    Dv=D,
                    dtype=d,
                    mask=mask,
                    is_causal=masked,
                    label=f"baseline {label}/{variant}",
                )
                out.append((f"{label}/{variant}/{d}", case))
    return out


def error_stats(err: np.ndarray) -> dict[str, float]:
    e = err[np.isfinite(err)]
    if not e.size:
        return {m: 0.0 for m in METRICS}
    return {"max": float(e.max()), "mean": float(e.mean()), "p99": float(np.percentile(e, 99))}


@dataclass
class Run:
    """One pass over the grid: outputs, per-case and per-dtype error against the oracle, skips."""

    outputs: dict[str, np.ndarray]
    inputs: dict[str, str]  # case key -> hash of its inputs (to notice a changed case builder)
    per_case: dict[str, dict[str, float]]
    per_dtype: dict[str, dict[str, float]]
    skipped: dict[str, str]


def run_grid(impl) -> Run:
    """Run the kernel (through the guarded ``Impl``) on the grid; refusals are recorded, not raised."""
    decl = impl.declaration
    outputs, inputs, per_case, skipped = {}, {}, {}, {}
    errs: dict[str, list[np.ndarray]] = {}
    for key, case in grid(decl.dtypes):
        reasons = decl.not_supported_reasons(case)
        if reasons:
            skipped[key] = "; ".join(reasons)
            continue
        try:
            out = impl.forward(case)
        except pytest.skip.Exception as exc:
            skipped[key] = str(exc).removeprefix("Skipped: ")
            continue
        want = compare.expected(case, decl).out
        with np.errstate(invalid="ignore"):
            err = np.abs(np.asarray(out, dtype=np.float64) - want)
        outputs[key] = out
        inputs[key] = compare.case_key(case)
        per_case[key] = error_stats(err)
        errs.setdefault(case.dtype, []).append(err.ravel())
    per_dtype = {d: error_stats(np.concatenate(v)) for d, v in errs.items()}
    return Run(outputs, inputs, per_case, per_dtype, skipped)


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


def _dirname(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec)


def record(directory: Path, spec: str, impl) -> Path:
    """Run the grid and write ``directory/<spec>/{baseline.json, outputs.npz}``."""
    from conformance.fixtures.golden import npz_bytes

    run = run_grid(impl)
    d = Path(directory) / _dirname(spec)
    d.mkdir(parents=True, exist_ok=True)
    (d / "outputs.npz").write_bytes(npz_bytes({k.replace("/", "__"): v for k, v in run.outputs.items()}))
    meta = {
        "format": FORMAT,
        "impl": spec,
        "environment": environment(impl.adapter),
        "thresholds": thresholds(),
        "inputs": run.inputs,
        "output_dtypes": {k: str(np.asarray(v).dtype) for k, v in run.outputs.items()},
        "per_case": run.per_case,
        "per_dtype": run.per_dtype,
        "skipped": run.skipped,
    }
    (d / "baseline.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return d


def thresholds() -> dict:
    return {
        "output_drift": f"|now - recorded| <= {DRIFT:g} * (ATOL[d] + RTOL[d] * |recorded|)",
        "ATOL": ATOL,
        "RTOL": RTOL,
        "error_statistics": f"now <= {WORSE:g} * recorded + FLOOR[d] for max, mean, p99 per dtype",
        "FLOOR": FLOOR,
    }


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "  ".join(c.ljust(w) for c, w in zip(r, widths))

    return "\n".join([line(cells[0]), line(tuple("-" * w for w in widths))] + [line(r) for r in cells[1:]])


def load(directory: Path, spec: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    d = Path(directory) / _dirname(spec)
    if not (d / "baseline.json").is_file():
        return None
    meta = json.loads((d / "baseline.json").read_text())
    with np.load(d / "outputs.npz", allow_pickle=False) as z:
        outs = {}
        for k in z.files:
            key = k.replace("__", "/")
            a = z[k]
            if meta["output_dtypes"].get(key) == "bfloat16":
                a = a.view(np_dtype("bfloat16"))
            outs[key] = a
    return meta, outs


def compare_run(meta: dict, recorded: dict[str, np.ndarray], run: Run) -> list[str]:
    """Readable tables of what moved; empty when the run is within the thresholds of the recording."""
    drift_rows, stat_rows, notes = [], [], []
    for key, old in sorted(recorded.items()):
        if key not in run.outputs:
            notes.append(f"{key}: recorded, but not run now ({run.skipped.get(key, 'not in the grid')})")
            continue
        if meta["inputs"].get(key) != run.inputs[key]:
            notes.append(f"{key}: the grid's inputs differ from the recorded ones (case builder changed); re-record")
            continue
        d = key.rsplit("/", 1)[1]
        o = np.asarray(old, dtype=np.float64)
        n = np.asarray(run.outputs[key], dtype=np.float64)
        allowed = DRIFT * (ATOL[d] + RTOL[d] * np.abs(np.nan_to_num(o)))
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isnan(o) & np.isnan(n), 0.0, np.abs(n - o))
        diff = np.where(np.isnan(diff), np.inf, diff)
        moved = diff > allowed
        if moved.any():
            i = np.unravel_index(int(np.argmax(diff / allowed)), o.shape)
            drift_rows.append(
                (
                    key,
                    f"{int(moved.sum())}/{o.size}",
                    f"{diff.max():.3g}",
                    f"{diff[i]:.3g} > {allowed[i]:.3g}",
                    f"{o[i]:.6g} -> {n[i]:.6g}",
                )
            )
    for key in sorted(set(run.outputs) - set(recorded)):
        notes.append(f"{key}: run now, but not in the recording (declaration changed?)")
    for d, old in sorted(meta["per_dtype"].items()):
        now = run.per_dtype.get(d)
        if now is None:
            continue
        for m in METRICS:
            limit = WORSE * old[m] + FLOOR[d]
            if now[m] > limit:
                ratio = now[m] / old[m] if old[m] else float("inf")
                stat_rows.append((d, m, f"{old[m]:.3g}", f"{now[m]:.3g}", f"{ratio:.3g}x", f"{limit:.3g}"))
    parts = []
    if drift_rows:
        parts.append(
            "outputs that drifted beyond |now - recorded| <= ATOL[d] + RTOL[d]*|recorded|:\n"
            + _table(("case", "moved", "max |diff|", "worst (diff > allowed)", "value there"), drift_rows)
        )
    if stat_rows:
        parts.append(
            f"error statistics vs the float64 oracle that got worse than {WORSE:g}x + floor:\n"
            + _table(("dtype", "metric", "recorded", "now", "ratio", "limit"), stat_rows)
        )
    if parts and notes:
        parts.append("notes:\n  " + "\n  ".join(notes))
    if not parts and any("inputs differ" in x for x in notes):
        parts.append("notes:\n  " + "\n  ".join(notes))
    return parts


def environment_changes(old: dict, new: dict) -> list[str]:
    out = []
    for k in ("platform", "processor", "device", "python"):
        if old.get(k) != new.get(k):
            out.append(f"{k}: {old.get(k)} -> {new.get(k)}")
    for lib in sorted(set(old.get("libraries", {})) | set(new.get("libraries", {}))):
        a, b = old.get("libraries", {}).get(lib), new.get("libraries", {}).get(lib)
        if a != b:
            out.append(f"{lib}: {a} -> {b}")
    return out


# -- pytest integration -----------------------------------------------------------------------
class BaselineFailure(Exception):
    pass


class BaselineItem(pytest.Item):
    """``baseline::<impl>`` (compare) or ``record-baseline::<impl>`` (record)."""

    def __init__(self, *, spec: str, directory: Path, recording: bool, **kw):
        super().__init__(**kw)
        self.spec, self.directory, self.recording = spec, directory, recording

    def _impl(self):
        from conformance.harness.runstate import get_state

        state = get_state(self.config)
        res = state.resolved[self.spec]
        if not res.usable:
            pytest.skip(f"baseline for {self.spec} skipped: the adapter is unavailable here ({res.reason})")
        return state.guarded(self.spec)

    def runtest(self) -> None:
        impl = self._impl()
        store = self.config.stash.setdefault(_KEY, {})
        if self.recording:
            path = record(self.directory, self.spec, impl)
            store[self.spec] = {"recorded": str(path)}
            return
        loaded = load(self.directory, self.spec)
        if loaded is None:
            pytest.skip(
                f"baseline comparison for {self.spec} skipped: no baseline in "
                f"{self.directory / _dirname(self.spec)} (record one with "
                f"pytest --impl={self.spec} --record-baseline={self.directory})"
            )
        meta, recorded = loaded
        run = run_grid(impl)
        problems = compare_run(meta, recorded, run)
        env = environment_changes(meta["environment"], environment(impl.adapter))
        store[self.spec] = {
            "directory": str(self.directory),
            "passed": not problems,
            "problems": problems,
            "environment_changes": env,
            "per_dtype": run.per_dtype,
        }
        if problems:
            head = f"{self.spec} moved against its baseline in {self.directory / _dirname(self.spec)}"
            if env:
                head += "\nenvironment changes since the recording: " + "; ".join(env)
            raise BaselineFailure(head + "\n\n" + "\n\n".join(problems))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (BaselineFailure, AssertionError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{'record-baseline' if self.recording else 'baseline'}::{self.spec}"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sdpa-conformance")
    group.addoption(
        "--record-baseline",
        metavar="DIR",
        default=None,
        help="record each --impl's outputs and error statistics on a fixed grid under DIR/<impl>/",
    )
    group.addoption(
        "--baseline",
        metavar="DIR",
        default=None,
        help="compare each --impl against the baseline recorded under DIR/<impl>/ (fails on drift)",
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    rec, base = config.getoption("record_baseline"), config.getoption("baseline")
    if rec:
        return [f"regression baseline: recording to {rec}"]
    if base:
        return [f"regression baseline: comparing against {base} (drift <= ATOL+RTOL*|x|, stats <= {WORSE:g}x + floor)"]
    return ["regression baseline: not compared (pass --baseline=DIR; record with --record-baseline=DIR)"]


@pytest.hookimpl(trylast=True)  # after the plugin keeps "clauses only" in a certification run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    from conformance.harness.runstate import get_state

    rec, base = config.getoption("record_baseline"), config.getoption("baseline")
    state = get_state(config)
    if not (rec or base) or state is None:
        return
    for spec in state.specs:
        recording = bool(rec)
        kind = "record-baseline" if recording else "baseline"
        items.append(
            BaselineItem.from_parent(
                session,
                name=f"{kind}[{spec}]",
                nodeid=f"{kind}::{spec}",
                spec=spec,
                directory=Path(rec or base),
                recording=recording,
            )
        )


def results(config: pytest.Config) -> dict:
    """What the baseline items of this session found, per impl (for the certificate)."""
    return dict(config.stash.get(_KEY, {}))

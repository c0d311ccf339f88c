"""Baselines on disk: ``DIR/<impl>/baseline.json`` (environment, machine, thresholds, error statistics)
and ``outputs.npz`` (the grid's outputs, bfloat16 stored as its bits). The ``machine`` record
(harness.calls.machine) lets a later comparison tell another machine from a regression; baselines
recorded before it existed have none, and are compared as on the same machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from conformance.contract import np_dtype
from conformance.harness.calls.environment import environment
from conformance.harness.calls.machine import machine
from conformance.harness.records.baseline_compare import thresholds
from conformance.harness.records.baseline_grid import run_grid

FORMAT = 1


def dirname(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", spec)


def record(directory: Path, spec: str, impl) -> Path:
    """Run the grid and write ``directory/<spec>/{baseline.json, outputs.npz}``."""
    from conformance.fixtures.golden import npz_bytes

    run = run_grid(impl)
    d = Path(directory) / dirname(spec)
    d.mkdir(parents=True, exist_ok=True)
    (d / "outputs.npz").write_bytes(npz_bytes({k.replace("/", "__"): v for k, v in run.outputs.items()}))
    meta = {
        "format": FORMAT,
        "impl": spec,
        "environment": environment(impl.adapter),
        "machine": machine(),
        "thresholds": thresholds(),
        "inputs": run.inputs,
        "output_dtypes": {k: str(np.asarray(v).dtype) for k, v in run.outputs.items()},
        "per_case": run.per_case,
        "per_dtype": run.per_dtype,
        "skipped": run.skipped,
    }
    (d / "baseline.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return d


def load(directory: Path, spec: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    d = Path(directory) / dirname(spec)
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

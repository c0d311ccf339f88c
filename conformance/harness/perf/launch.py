"""Starting the measuring worker (harness.perf.worker) from the pytest process, and reading its answer.

The adapter travels pickled when it can be (self-test kernels, most user adapters); otherwise as its
``--impl`` spec plus the declaration in force (``--declare`` overrides included), and the worker
resolves the spec itself (torch's SDPBackend enum, for one, cannot be pickled). The worker inherits
this process's ``sys.path`` so that ``module:attr`` adapters import there as they did here.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from conformance.harness.perf.grid import Row


class WorkerError(RuntimeError):
    """The worker could not measure: it crashed, timed out, or could not load the adapter."""


def _adapter_payload(adapter: Any, spec: str | None) -> dict:
    try:
        return {"adapter": pickle.dumps(adapter), "spec": spec, "declaration": None}
    except Exception as exc:  # noqa: BLE001 - any pickling failure: fall back to the spec
        if not spec:
            raise WorkerError(f"the adapter cannot be pickled ({exc}) and has no --impl spec to resolve") from None
        return {"adapter": None, "spec": spec, "declaration": adapter.declaration}


def run_worker(
    adapter: Any,
    spec: str | None,
    task: str,
    rows: list[Row],
    *,
    timeout: float,
    budget: dict | None = None,
    max_call_s: float = 5.0,
    backward: bool = True,
    log: Path | None = None,
) -> dict:
    """Run ``task`` ("profile" or "scaling") over ``rows`` in a fresh process; its JSON answer."""
    job = {
        **_adapter_payload(adapter, spec),
        "sys_path": [p for p in sys.path if p],
        "task": task,
        "rows": [asdict(r) for r in rows],
        "budget": budget or {},
        "max_call_s": max_call_s,
        "backward": backward,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="sdpa-perf-") as tmp:
        job_path, out_path = Path(tmp) / "job.pkl", Path(tmp) / "out.json"
        job_path.write_bytes(pickle.dumps(job))
        cmd = [sys.executable, "-m", "conformance.harness.perf.worker", str(job_path), str(out_path)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=os.getcwd())
        except subprocess.TimeoutExpired as exc:
            raise WorkerError(f"the perf worker did not finish within {timeout:g} s ({task})") from exc
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stderr)
        if not out_path.exists():
            tail = "\n".join(proc.stderr.splitlines()[-15:])
            raise WorkerError(f"the perf worker exited with {proc.returncode} and no answer:\n{tail}")
        answer = json.loads(out_path.read_text())
    if "error" in answer:
        raise WorkerError(f"the perf worker failed: {answer['error']}\n{answer.get('traceback', '')}")
    return answer

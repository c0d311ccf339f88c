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

The recording carries the machine it ran on (harness.calls.machine). Compared on another machine
(another CPU model, capability level, BLAS core type or library build), the run says "another
machine: <what differs>" and reports what moved as "moved on another machine" without failing; it
fails only where a moved output lies beyond the error model. A recording without the record is
compared as above, and the run says "machine not recorded".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.harness.calls.environment import environment, environment_changes
from conformance.harness.calls.machine import machine, machine_changes
from conformance.harness.records.baseline_compare import WORSE, compare_on
from conformance.harness.records.baseline_grid import run_grid
from conformance.harness.records.baseline_store import dirname, load, record
from conformance.harness.run.runstate import get_state

_KEY = pytest.StashKey[dict]()


# -- pytest integration -----------------------------------------------------------------------
class BaselineFailure(Exception):
    pass


class BaselineItem(pytest.Item):
    """``baseline::<impl>`` (compare) or ``record-baseline::<impl>`` (record)."""

    def __init__(self, *, spec: str, directory: Path, recording: bool, **kw):
        super().__init__(**kw)
        self.spec, self.directory, self.recording = spec, directory, recording

    def _impl(self):
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
                f"{self.directory / dirname(self.spec)} (record one with "
                f"pytest --impl={self.spec} --record-baseline={self.directory})"
            )
        meta, recorded = loaded
        run = run_grid(impl)
        changes = machine_changes(meta.get("machine"), machine())
        result = compare_on(meta, recorded, run, impl.declaration, changes)
        problems = result.problems
        env = environment_changes(meta["environment"], environment(impl.adapter))
        store[self.spec] = {
            "directory": str(self.directory),
            "passed": not problems,
            "problems": problems,
            "machine": result.machine,  # "another machine: ...", "machine not recorded ...", or ""
            "moved_on_another_machine": result.moved,
            "environment_changes": env,
            "per_dtype": run.per_dtype,
        }
        if problems:
            head = f"{self.spec} moved against its baseline in {self.directory / dirname(self.spec)}"
            if result.machine:
                head = f"{result.machine}\n{head}"
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


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """A baseline from another machine passes where its figures moved within the error model: say so."""
    for spec, r in results(config).items():
        if r.get("machine"):
            terminalreporter.write_line(f"baseline {spec}: {r['machine']}")
        if r.get("moved_on_another_machine"):
            terminalreporter.write_line(
                f"baseline {spec}: figures moved on another machine, within the error model (not a regression):"
            )
            for part in r["moved_on_another_machine"]:
                terminalreporter.write_line("  " + part.replace("\n", "\n  "))


def results(config: pytest.Config) -> dict:
    """What the baseline items of this session found, per impl (for the certificate)."""
    return dict(config.stash.get(_KEY, {}))

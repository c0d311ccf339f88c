"""Sub-plugin: the performance profile, ``pytest --impl=X --conformance-perf [--perf-report=DIR]``.

The seed's engineering checks (003_648455d5abd16778.txt, 工程实现 and 边界与失败方式): at fixed
(B, h, T_q, T_k, d, dtype, is_causal) check "输出容差、反向梯度、峰值显存和延迟", warm up before taking
quantiles, keep decode apart from prefill, and do not take the API's name for the kernel that ran.
With ``--conformance-perf`` this plugin

* adds one item per ``--impl``, ``perf::<impl>``, which runs the grid (harness.perf.grid:
  ``--perf-grid`` tiny / quick / full) in a fresh worker process (harness.perf.worker) on the
  kernel's declared device, and fails when a row's output check fails or the worker cannot run;
* enables the performance clauses (conformance/clauses/test_perf.py: MEM-SCALING-01, BACKEND-01),
  otherwise reported as *not in this profile*;
* writes ``DIR/perf.json``, ``latency.svg``, ``memory.svg`` (and ``errors.svg`` when clauses ran)
  with ``--perf-report=DIR``, and prints what each adapter's profile found.

It also keeps, for the certificate (harness.records.certificate_html), the clauses' measurements and the
worst error / allowance ratio of every clause test (harness.perf.errors), whenever
``--certificate`` or ``--perf-report`` is given. Data travel on each test report's
``user_properties``, so they reach the controller under pytest-xdist too. Imports nothing heavy at
module level: the plugin loads for every pytest run. Longer than most modules because it is one
sub-plugin, whose hooks (options, items, measurements, report) share its stash keys and must be one
registered object; the grid, worker, timing, memory, charts and report live in the other perf_* modules.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.run import runstate
from conformance.harness.run.runstate import get_state, getoption

OPT_PERF = "conformance_perf"
OPT_REPORT = "perf_report"
OPT_GRID = "perf_grid"
OPT_DTYPES = "perf_dtypes"
PROP = "sdpa_perf"
GRID_SETTINGS: dict[str, dict[str, Any]] = {
    "tiny": {"budget": {"seconds": 0.15, "min_reps": 3, "max_reps": 50}, "max_call_s": 2.0, "timeout": 300.0},
    "quick": {"budget": {"seconds": 0.5, "min_reps": 3, "max_reps": 200}, "max_call_s": 3.0, "timeout": 900.0},
    "full": {"budget": {"seconds": 3.0, "min_reps": 10, "max_reps": 1000}, "max_call_s": 30.0, "timeout": 3600.0},
}
_DATA = pytest.StashKey[dict]()
_STACK = pytest.StashKey[contextlib.ExitStack]()
_CONFIG: dict = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    # pytest's option API, the same calls as every sub-plugin's (selfdefense.py, certificate.py)
    group = parser.getgroup("sdpa-conformance")
    group.addoption(
        "--conformance-perf",
        action="store_true",
        default=False,
        help="also run the performance profile of each --impl (latency quantiles, peak memory, floor ratio, "
        "the kernel that ran) and the performance clauses MEM-SCALING-01 and BACKEND-01",
    )
    group.addoption(
        "--perf-report", metavar="DIR", default=None, help="write perf.json, latency.svg and memory.svg under DIR"
    )
    group.addoption(
        "--perf-grid",
        choices=tuple(GRID_SETTINGS),
        default="quick",
        help="rows of the performance profile: tiny (a self-test), quick (CI-sized, default), full (T = S to "
        "16384, decode S to 32768; cut by the per-row time budget and by memory)",
    )
    group.addoption(
        "--perf-dtypes",
        metavar="LIST",
        default=None,
        help="dtypes to profile, comma-separated (default: float32 on a CPU, float16,bfloat16 on CUDA; always "
        "intersected with the declaration)",
    )


def data(config: pytest.Config) -> dict:
    """spec -> {"profile": answer|None, "error": str|None, "notes": [...], "ratios": {clause: {dtype: r}}}."""
    return config.stash.setdefault(_DATA, {})


def _slot(config: pytest.Config, spec: str) -> dict:
    return data(config).setdefault(spec, {"profile": None, "error": None, "notes": [], "ratios": {}})


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG["config"] = config
    if getoption(config, OPT_PERF) or getoption(config, OPT_REPORT):
        state = get_state(config)
        if getoption(config, OPT_PERF) and state is not None and not state.explicit:
            raise pytest.UsageError("--conformance-perf needs --impl: it profiles the kernel under test")
    if getoption(config, OPT_REPORT) or getoption(config, runstate.OPT_CERTIFICATE):
        from conformance.harness.judge import compare
        from conformance.harness.perf import errors as perf_errors

        stack = contextlib.ExitStack()
        stack.enter_context(compare.observing(perf_errors.observer))
        config.stash[_STACK] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_STACK, None)
    if stack is not None:
        stack.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not getoption(config, OPT_PERF):
        return []
    return [
        f"performance profile: grid {getoption(config, OPT_GRID)}, report "
        f"{getoption(config, OPT_REPORT) or 'not written (--perf-report=DIR)'}; "
        "figures on a shared machine are upper bounds"
    ]


# -- the perf items ----------------------------------------------------------------------------
class PerfFailure(Exception):
    pass


def dtypes_for(decl: Any, wanted: str | None) -> list[str]:
    from conformance.contract import DTYPES, LOW_PRECISION

    if wanted:
        names = [d.strip() for d in wanted.split(",") if d.strip()]
    elif decl.device.startswith("cuda"):
        names = [d for d in DTYPES if d in LOW_PRECISION]
    else:
        names = ["float32"]
    chosen = [d for d in names if d in decl.dtypes]
    return chosen or [next(d for d in DTYPES if d in decl.dtypes)]


class PerfItem(pytest.Item):
    """``perf::<impl>``: the profile of one adapter, measured in a worker process."""

    def __init__(self, *, spec: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.spec = spec

    def runtest(self) -> None:
        from conformance.harness.perf import grid as perf_grid
        from conformance.harness.perf import launch as perf_run

        state = get_state(self.config)
        res = state.resolved[self.spec]
        if not res.usable:
            pytest.skip(f"perf profile of {self.spec} skipped: the adapter is unavailable here ({res.reason})")
        adapter = state.guarded(self.spec).adapter
        decl = adapter.declaration
        grid = getoption(self.config, OPT_GRID)
        settings = GRID_SETTINGS[grid]
        rows = perf_grid.rows(grid, dtypes_for(decl, getoption(self.config, OPT_DTYPES)), gqa=decl.gqa)
        report_dir = getoption(self.config, OPT_REPORT)
        log = Path(report_dir) / "logs" / f"{self.spec.replace(':', '_').replace('/', '_')}.log" if report_dir else None
        try:
            answer = perf_run.run_worker(
                adapter,
                self.spec,
                "profile",
                rows,
                timeout=settings["timeout"],
                budget=settings["budget"],
                max_call_s=settings["max_call_s"],
                log=log,
            )
        except perf_run.WorkerError as exc:
            self.user_properties.append((PROP, {"kind": "profile", "spec": self.spec, "error": str(exc)}))
            raise PerfFailure(f"perf profile of {self.spec}: {exc}") from None
        self.user_properties.append((PROP, {"kind": "profile", "spec": self.spec, "answer": answer}))
        bad = [r for r in answer["rows"] if r.get("pass") is False]
        if bad:
            lines = [f"{r['key']}: {r.get('reason') or r.get('check', '')}" for r in bad]
            raise PerfFailure(f"perf profile of {self.spec}: {len(bad)} rows failed\n" + "\n\n".join(lines))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, PerfFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple:
        return self.path, None, f"perf::{self.spec}"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    state = get_state(config)
    if not getoption(config, OPT_PERF) or state is None:
        return
    for spec in state.specs:
        items.append(PerfItem.from_parent(session, name=f"perf[{spec}]", nodeid=f"perf::{spec}", spec=spec))


# -- measurements of the clauses, and error ratios ---------------------------------------------
def _clause_key(item: pytest.Item) -> tuple[str, str, str | None] | None:
    from conformance.harness.spec.clause import info_of

    info = info_of(getattr(item, "function", None)) if hasattr(item, "function") else None
    callspec = getattr(item, "callspec", None)
    if info is None or callspec is None or "impl" not in callspec.params:
        return None
    return str(callspec.params["impl"]), info.id, callspec.params.get("dtype")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    watching = _STACK in item.config.stash
    if watching:
        from conformance.harness.perf import errors as perf_errors

        perf_errors.begin(_clause_key(item))
    try:
        return (yield)
    finally:
        if watching:
            got = perf_errors.end()
            if got is not None:
                (spec, cid, dtype), worst = got
                item.user_properties.append(
                    (PROP, {"kind": "ratio", "spec": spec, "clause": cid, "dtype": str(dtype), "ratio": worst})
                )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        from conformance.harness.perf import notes as perf_notes

        key = _clause_key(item)
        notes = perf_notes.drain()  # notes of clause functions called directly (self-tests) are dropped
        for n in notes if key is not None else ():
            n["impl"] = key[0]  # the --impl spec, as the other records name the adapter
            rep.user_properties.append((PROP, {"kind": "note", "spec": n["impl"], "note": n}))
    return rep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG.get("config")
    if config is None:
        return
    for k, v in getattr(report, "user_properties", ()):
        if k != PROP or not isinstance(v, dict):
            continue
        slot = _slot(config, v["spec"])
        if v["kind"] == "profile":
            slot["profile"], slot["error"] = v.get("answer"), v.get("error")
        elif v["kind"] == "note":
            if v["note"] not in slot["notes"]:
                slot["notes"].append(v["note"])
        elif v["kind"] == "ratio":
            by = slot["ratios"].setdefault(v["clause"], {})
            by[v["dtype"]] = max(v["ratio"], by.get(v["dtype"], 0.0))


# -- the report --------------------------------------------------------------------------------
def build_report(config: pytest.Config) -> dict:
    from conformance.harness.perf import report as perf_report

    state = get_state(config)
    adapters = {}
    for spec, slot in data(config).items():
        if state is None or spec not in state.resolved or not state.resolved[spec].usable:
            continue
        if slot["profile"] is None and slot["error"] is None and not slot["notes"]:
            continue
        decl = state.guarded(spec).adapter.declaration
        adapters[spec] = perf_report.adapter_entry(spec, slot["profile"], slot["error"], decl, slot["notes"])
    ratios = {spec: slot["ratios"] for spec, slot in data(config).items() if slot["ratios"]}
    command = "pytest " + " ".join(config.invocation_params.args)
    return perf_report.build(str(getoption(config, OPT_GRID)), command, adapters, ratios)


def certificate_section(config: pytest.Config, spec: str) -> dict | None:
    """What the certificate shows of this run's performance data for ``spec`` (None: nothing)."""
    from conformance.harness.perf import report as perf_report

    slot = data(config).get(spec)
    if not slot:
        return None
    state = get_state(config)
    decl = state.guarded(spec).adapter.declaration
    entry = perf_report.adapter_entry(spec, slot["profile"], slot["error"], decl, slot["notes"])
    entry["error_ratios"] = slot["ratios"]
    entry["profiled"] = slot["profile"] is not None or slot["error"] is not None
    entry["grid"] = getoption(config, OPT_GRID)
    return entry


_WRITTEN = pytest.StashKey[list]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    target = getoption(config, OPT_REPORT)
    if runstate.is_xdist_worker(config) or config.getoption("collectonly"):
        return
    if target and data(config):
        from conformance.harness.perf import report as perf_report

        config.stash[_WRITTEN] = perf_report.write(build_report(config), Path(target))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not getoption(config, OPT_PERF) or runstate.is_xdist_worker(config):
        return
    from conformance.harness.perf import report as perf_report

    report = build_report(config)
    if not report["adapters"]:
        return
    tr = terminalreporter
    tr.section("sdpa-conformance performance profile")
    tr.write_line(report["caveat"])
    for entry in report["adapters"].values():
        for line in perf_report.summary_lines(entry):
            tr.write_line(line)
    written = config.stash.get(_WRITTEN, None)
    if written:
        tr.write_line("perf report written: " + ", ".join(str(p) for p in written))

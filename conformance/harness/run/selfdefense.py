"""Sub-plugin: the suite defending itself against bad invocations and against its own runners.

Registered by ``conformance.harness.plugin``. It adds:

* usage checks the core plugin does not make (``--baseline`` together with ``--record-baseline``, a
  negative ``--call-timeout``): each is one line and exit code 4, like pytest's own usage errors;
* ``--conformance-random-seeds``: the ci example counts with hypothesis *not* derandomized, so that
  ``scripts/stability.py`` can measure how often a correct kernel is wrongly failed (pair it with
  ``--hypothesis-seed=N`` to reproduce one run);
* pytest-xdist support: the per-clause results live in each worker's process, so workers attach
  them to their reports and the controller collects them, and the ``sdpa-conformance summary``
  (and every sub-plugin reading the results) sees the whole run under ``-n auto`` as it would in
  a serial run.
"""

from __future__ import annotations

import pytest

from conformance.harness.run import runstate
from conformance.harness.run.runstate import get_state, getoption

RESULT_KEY = "sdpa_conformance_result"
RANDOM_PROFILE = "ci-random"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sdpa-conformance")
    group.addoption(
        "--conformance-random-seeds",
        action="store_true",
        default=False,
        help="ci example counts with random (not derandomized) hypothesis seeds; used to measure "
        "false-positive rates (scripts/stability.py). Reproduce a run with --hypothesis-seed=N.",
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if getoption(config, runstate.OPT_BASELINE) and getoption(config, runstate.OPT_RECORD_BASELINE):
        raise pytest.UsageError(
            "--baseline and --record-baseline conflict: record a baseline in one run, compare with it in another"
        )
    timeout = getoption(config, runstate.OPT_CALL_TIMEOUT)
    if timeout is not None and timeout < 0:
        raise pytest.UsageError(f"--call-timeout={timeout:g}: expected seconds >= 0 (0 disables the guard)")
    if getoption(config, runstate.OPT_RANDOM_SEEDS):
        from hypothesis import settings

        from conformance.harness.cases import strategies

        if getoption(config, runstate.OPT_PROFILE) == "thorough":
            raise pytest.UsageError("--conformance-random-seeds is for the ci profile; thorough is already random")
        strategies.register_profiles()
        settings.register_profile(
            strategies.PREFIX + RANDOM_PROFILE,
            parent=settings.get_profile(strategies.PREFIX + "ci"),
            derandomize=False,
            database=None,
        )
        strategies.load_profile(RANDOM_PROFILE)


def _is_xdist_controller(config: pytest.Config) -> bool:
    return not runstate.is_xdist_worker(config) and config.pluginmanager.has_plugin("dsession")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    state = get_state(item.config) if runstate.is_xdist_worker(item.config) else None
    before = len(state.results) if state is not None else 0
    rep = yield
    if state is not None:
        for result in state.results[before:]:
            rep.user_properties.append((RESULT_KEY, dict(result)))
    return rep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = [v for k, v in getattr(report, "user_properties", ()) if k == RESULT_KEY]
    if not props:
        return
    config = _CONFIG.get("config")
    if config is None or not _is_xdist_controller(config):
        return
    state = get_state(config)
    if state is not None:
        state.results.extend(props)


_CONFIG: dict = {}  # pytest_runtest_logreport gets no config; the session's is kept here


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config

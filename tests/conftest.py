"""Session set-up of the project's self-tests."""

import os
import sys

import pytest

from tests.clause_runner import load_clauses
from tests.skip_summary import pytest_terminal_summary  # noqa: F401 - the by-design skips counted, not listed

load_clauses()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Dozens of self-tests start a Python child (a certification, the matrix command, a perf
    worker), and each child compiled the package and the rewritten test modules afresh when the
    environment says PYTHONDONTWRITEBYTECODE (this machine's does): 1.4 s of every child's start.
    The self-test session lets its children, and itself, keep bytecode caches (in the git-ignored
    __pycache__ folders), so the first child compiles and the others reuse. A certification run
    (`pytest --impl=X`) leaves the user's setting alone, and its search for the worst failing case on."""
    from conformance.harness.run.runstate import OPT_IMPL
    from conformance.harness.run.worst_case import ENV as WORST_CASE_ENV

    def worst_case_env() -> str:
        return WORST_CASE_ENV

    if session.config.getoption(OPT_IMPL):
        return
    # The self-tests check that a mutant fails, not which of its failing cases is the worst: the search
    # for it (harness.run.worst_case, up to six more runs of each failing clause test) is left to the
    # tests about it (tests/test_trust.py, tests/test_causes*.py turn it back on).
    os.environ.setdefault(worst_case_env(), "0")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# The self-tests' tiers. The default run (`python -m pytest -n auto`) is the whole suite at the ci
# profile: every self-test file runs, and where a self-test repeats one check over many kernels or
# clauses (the zoo's correct kernels, the correct bases of tests/test_clauses_bite.py, whole
# certifications in a child process) it runs a dealt share, or a narrower run, that still exercises
# every path it checks. The rest is marked ``thorough`` and runs with `-m thorough` (or the thorough
# profile); .ci/run runs both, so CI checks the union on every change.
THOROUGH = "thorough"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{THOROUGH}: the rest of a dealt self-test; runs with `pytest tests -m {THOROUGH}` or "
        "--conformance-profile=thorough (.ci/run runs it after the default run)",
    )


def thorough_selftests(config: pytest.Config) -> bool:
    """True where the ``thorough`` self-tests run: their marker selected (``-m thorough``) or the
    thorough profile."""
    from conformance.harness.run.runstate import OPT_PROFILE, getoption

    return THOROUGH in (config.getoption("markexpr", "") or "") or getoption(config, OPT_PROFILE) == "thorough"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if thorough_selftests(config):
        return
    skip = pytest.mark.skip(reason=f"thorough tier: runs with `pytest tests -m {THOROUGH}` (.ci/run runs it)")
    for item in items:
        if item.get_closest_marker(THOROUGH):
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`-n N` without `--dist`: work stealing instead of xdist's default ``load``.

    With ``load``, the tests a worker has been handed stay its own; in the default run one worker
    finished 18 s before the other, which still held a queue of zoo tests. ``worksteal`` hands the
    idle worker half of the busy one's queue (measured: both workers end within a second). An
    explicit ``--dist`` is kept."""
    if config.getoption("numprocesses", None) and config.getoption("dist", "no") == "no":
        config.option.dist = "worksteal"


@pytest.fixture
def restore_hypothesis_profile():
    """In-process pytester runs load hypothesis profiles globally; give the outer session its own back."""
    from conformance.harness.cases import strategies

    saved = strategies.profile_name()
    yield
    strategies.load_profile(saved)


# Frameworks whose native extensions initialise process-wide state once (jaxlib's absl logging aborts
# the process with "SetTimeZone() has already been called" when jax is imported a second time).
NATIVE_ONCE = ("jax", "jaxlib", "keras", "torch", "mlx", "onnxruntime", "transformers")


@pytest.fixture
def _keep_native_frameworks(monkeypatch):
    """Make pytester's ``sys.modules`` snapshots (taken when the fixture is made and around each
    in-process run) keep the frameworks of :data:`NATIVE_ONCE`; set up before ``pytester`` itself."""
    from _pytest import pytester as pytester_module

    original = pytester_module.SysModulesSnapshot

    class KeepFrameworks(original):
        def __init__(self, preserve=None) -> None:
            super().__init__(
                preserve=lambda name: name.partition(".")[0] in NATIVE_ONCE or (preserve is not None and preserve(name))
            )

    monkeypatch.setattr(pytester_module, "SysModulesSnapshot", KeepFrameworks)


@pytest.fixture
def pytester(_keep_native_frameworks, pytester):
    """pytester whose in-process runs keep the frameworks they import.

    Why: ``runpytest_inprocess`` restores ``sys.modules`` after each run (and the fixture once more at
    its end), dropping every module imported meanwhile; a framework first imported there (a
    certification of jax or keras in process) is then imported again by the next test of the same
    worker, and jaxlib aborts the whole worker. Keeping those modules loaded is what a real process
    does anyway; it goes through the ``preserve`` hook of pytester's own ``SysModulesSnapshot``."""
    return pytester


@pytest.fixture
def worst_case_search(monkeypatch):
    """The search for each failing clause test's worst case (harness.run.worst_case), which the self-test
    session turns off, back on: for the tests that read causes, which it shapes."""
    from conformance.harness.run.worst_case import ENV

    monkeypatch.setenv(ENV, "1")

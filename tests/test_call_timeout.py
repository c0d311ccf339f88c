"""The per-call timeout runs the kernel on the caller's own thread (harness.calls.call_timeout).

A library with thread-bound state (tests/thread_bound.py: a SQLite connection made at import on the
main thread) certifies under the harness as in a user's script, and a hang is still cut off, both on
the main thread (SIGALRM) and on another thread (an asynchronous exception).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from conformance.harness.calls.call_timeout import CallTimedOut, call_with_timeout
from tests.narrow_plan import narrow_plan

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")
ROOT = Path(__file__).resolve().parents[1]


def _spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "returned"


def test_the_kernel_runs_on_the_calling_thread():
    assert call_with_timeout(threading.get_ident, 5.0, "k.forward") == threading.get_ident()
    assert call_with_timeout(threading.get_ident, 0, "k.forward") == threading.get_ident()


@pytest.mark.parametrize("hang", [lambda: time.sleep(30), lambda: _spin(30)], ids=["sleeps", "spins"])
def test_a_hang_on_the_main_thread_is_cut_off(hang):
    assert threading.current_thread() is threading.main_thread()
    start = time.monotonic()
    with pytest.raises(CallTimedOut, match=r"k.forward did not return within 0.2 s \(--call-timeout\)"):
        call_with_timeout(hang, 0.2, "k.forward")
    assert time.monotonic() - start < 5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left behind


def test_a_hang_on_another_thread_is_cut_off_there():
    box = {}

    def worker():
        try:
            call_with_timeout(lambda: _spin(30), 0.2, "k.forward")
        except CallTimedOut as exc:
            box["error"] = exc
        box["thread"] = threading.get_ident()
        _spin(0.5)  # no interruption surfaces after the call
        box["after"] = "clean"

    t = threading.Thread(target=worker)
    start = time.monotonic()
    t.start()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - start < 5
    assert "did not return within 0.2 s" in str(box["error"]) and box["after"] == "clean"


def test_a_call_that_returns_in_time_leaves_no_interruption_behind():
    for _ in range(50):
        assert call_with_timeout(lambda: _spin(0.001), 0.05, "k.forward") == "returned"
    _spin(0.2)  # an alarm or an asynchronous exception left armed would fire here


_STUCK = """
import sys, threading, time
from conformance.harness.calls import call_timeout as ct
ct._grace = lambda timeout: 0.3  # the real grace is max(30 s, timeout)
for _ in range(200):  # calls that return leave nothing armed behind
    ct.call_with_timeout(lambda: None, 0.2, "quick.forward")
t = threading.Thread(target=ct.call_with_timeout, args=(lambda: time.sleep(60), 0.2, "stuck.forward"), daemon=True)
t.start()  # time.sleep on another thread: the asynchronous exception cannot reach it
t.join(30)
print("the watchdog did not fire")
"""


def test_a_call_stuck_in_native_code_ends_the_process_with_every_stack():
    """The last resort: one watchdog thread per process sees a deadline pass and exits with code 3."""
    import subprocess
    import sys

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _STUCK], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "stuck.forward did not return within 0.2 s" in proc.stderr and "stuck in native code" in proc.stderr
    assert "quick.forward" not in proc.stderr and "the watchdog did not fire" not in proc.stdout
    assert "Thread 0x" in proc.stderr  # faulthandler's dump of every thread
    assert time.monotonic() - start < 20


def test_another_plugins_timer_is_restored():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        assert call_with_timeout(lambda: _spin(0.05), 5.0, "k.forward") == "returned"
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining < 0.6
        time.sleep(1.0)
        assert fired == [True]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_thread_bound_kernel_refuses_other_threads():
    """Control: the self-test kernel really is thread-bound, so the certification below means something."""
    import sqlite3

    from tests.thread_bound import ThreadBound

    errors = []
    t = threading.Thread(target=lambda: _record(errors, ThreadBound()._read_state))
    t.start()
    t.join()
    assert errors and isinstance(errors[0], sqlite3.ProgrammingError), errors


def _record(errors: list, fn) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


def _certifies(pytester, *paths: str) -> None:
    result = pytester.runpytest_inprocess(
        *paths, "--impl=tests.thread_bound:ThreadBound", "-p", "no:cacheprovider", "-q"
    )
    text = result.stdout.str()
    assert "ProgrammingError" not in text, text[-3000:]
    assert "tests.thread_bound:ThreadBound: CONFORMS" in text, text[-3000:]
    assert result.ret == 0


def test_a_thread_bound_kernel_certifies(pytester, monkeypatch):
    """Both of the kernel's entry points (forward in the worked example and the gradient clauses, vjp in
    the gradient clauses, drawn cases through hypothesis included) go through the per-call timeout on
    the caller's thread. The run's plan is cut to those files' clauses (tests/narrow_plan.py) so that
    the verdict is a whole one; every clause of the suite is the thorough twin below."""
    _certifies(pytester, *narrow_plan(monkeypatch, "test_worked_example", "test_gradients"))


@pytest.mark.thorough
def test_a_thread_bound_kernel_certifies_on_every_clause(pytester):
    """The whole certification: no clause calls the kernel another way."""
    _certifies(pytester, str(ROOT / "conformance" / "clauses"))

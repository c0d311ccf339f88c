"""The per-call timeout, enforced on the caller's own thread.

Why not a helper thread (as before): a library whose state belongs to the thread that made it
(SQLite connections, CUDA contexts bound to a thread, some BLAS builds, GUI/GL-backed libraries)
fails when its kernel is called from another thread, so the harness broke those libraries instead
of testing them. The kernel now runs exactly where a user's script would run it, and the timeout is
an interruption delivered to that thread:

* on the main thread (a plain ``pytest`` run and every pytest-xdist worker), a ``SIGALRM`` from
  ``signal.setitimer``: it also interrupts blocking system calls (a kernel sleeping or waiting on a
  lock); the previous handler and any running timer (another plugin's) are restored afterwards;
* on any other thread, an asynchronous exception raised in that thread by a timer
  (``PyThreadState_SetAsyncExc``), delivered at its next bytecode.

Both reach Python code only: a kernel stuck inside one native call that never returns to the
interpreter cannot be interrupted on its own thread. Such a call is cut off by a last-resort
watchdog ``grace`` seconds after the deadline, which writes what was stuck, dumps every thread's
stack and ends the process (pytest-xdist then reports the crashed worker and goes on) instead of
hanging CI.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_CALL_TIMEOUT = 120.0  # seconds; --call-timeout (harness.run.options) defaults to it
HARD_EXIT_CODE = 3  # pytest's "internal error": the run could not go on
POLL = 1.0  # seconds between the watchdog's looks at the armed deadlines


class _Expired(BaseException):
    """Raised into the kernel at its deadline; a BaseException so that ``except Exception`` in a
    kernel cannot swallow it."""


class CallTimedOut(Exception):
    """A call did not return within its timeout; the caller turns it into a clause failure."""


def _grace(timeout: float) -> float:
    return max(30.0, timeout)


class _Watchdog:
    """The last resort for a call stuck in native code, where no interruption can reach it.

    One daemon thread per process, started on the first call, watching every armed call's deadline
    (``timeout + grace``): a thread (and its start-up) per call cost more than many kernels' calls
    themselves (a ``threading.Timer`` per call was ~10 % of a NumPy certification's time). Arming
    and disarming is a dictionary write under a lock, never a wake-up: the thread looks at the
    deadlines once every :data:`POLL` seconds (a notify per call handed the GIL to it and back, 1 to
    1.5 ms a call on a busy 2-core machine), late by at most that against a grace of 30 s or more.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, str, float]] = {}  # token -> (deadline, what, timeout)
        self._next = 0
        self._thread: threading.Thread | None = None

    def arm(self, what: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout + _grace(timeout)
        with self._cond:
            self._next += 1
            token = self._next
            self._armed[token] = (deadline, what, timeout)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="sdpa-conformance-watchdog", daemon=True)
                self._thread.start()
        return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                late = [v for v in self._armed.values() if v[0] <= now]
                if late:
                    _stuck(*late[0][1:])
                self._cond.wait(POLL)


def _stuck(what: str, timeout: float) -> None:
    sys.stderr.write(
        f"\nsdpa-conformance: {what} did not return within {timeout:g} s (--call-timeout) and could not be "
        f"interrupted for another {_grace(timeout):g} s (stuck in native code); ending the process\n"
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(HARD_EXIT_CODE)


_WATCHDOG = _Watchdog()


def _on_main_thread(fn: Callable[[], Any], timeout: float) -> Any:
    def expire(signum: int, frame: Any) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    outer_delay, _ = signal.setitimer(signal.ITIMER_REAL, timeout)
    start = time.monotonic()
    try:
        try:
            return fn()
        finally:  # an alarm that fires before this line still raises _Expired, caught by the caller
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:  # another plugin's timer was running: give it back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer_delay - (time.monotonic() - start), 1e-3))


def _on_other_thread(fn: Callable[[], Any], timeout: float) -> Any:
    tid = threading.get_ident()
    lock = threading.Lock()
    armed = [True]

    def expire() -> None:
        with lock:
            if armed[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(_Expired))

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        return fn()
    finally:
        timer.cancel()
        with lock:
            armed[0] = False
            # A delivery still pending (the timer fired as fn returned) is withdrawn, so that it
            # cannot surface later in the suite's own code.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)


def call_with_timeout(fn: Callable[[], Any], timeout: float | None, what: str) -> Any:
    """``fn()`` on this thread; :class:`CallTimedOut` if it runs past ``timeout`` seconds (None or
    <= 0: no limit)."""
    if not timeout or timeout <= 0:
        return fn()
    main = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    token = _WATCHDOG.arm(what, timeout)
    try:
        return (_on_main_thread if main else _on_other_thread)(fn, timeout)
    except _Expired:
        raise CallTimedOut(
            f"{what} did not return within {timeout:g} s (--call-timeout); the call was interrupted"
        ) from None
    finally:
        _WATCHDOG.disarm(token)

"""A kernel with thread-bound state, as real libraries have: created at import on the main thread,
refusing use from any other (tests/test_call_timeout.py).

Its state is a real SQLite connection (``check_same_thread`` on, SQLite's default): the kernel
reads its softmax scale factor from it on every call, as a library that compiles kernels and caches
them in SQLite reads its cache. Called from another thread, it raises SQLite's own
``ProgrammingError``; the harness must run it exactly as a user's script does. The arithmetic is the
self-tests' correct base kernel, so under the harness it certifies.
"""

from __future__ import annotations

import sqlite3
import threading

from conformance.contract import Case
from tests.mutants import BaseKernel

_DB = sqlite3.connect(":memory:")  # bound to the importing thread
_DB.execute("create table settings (name text primary key, value real)")
_DB.execute("insert into settings values ('scale_factor', 1.0)")
OWNER = threading.get_ident()


class ThreadBound(BaseKernel):
    def __init__(self):
        super().__init__("thread-bound")

    @staticmethod
    def _read_state() -> None:
        (factor,) = _DB.execute("select value from settings where name = 'scale_factor'").fetchone()
        assert factor == 1.0

    def forward(self, case: Case):
        self._read_state()
        return super().forward(case)

    def vjp(self, case: Case, grad_out):
        self._read_state()
        return super().vjp(case, grad_out)

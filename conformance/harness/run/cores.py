"""pytest-xdist workers share the machine's cores: their OpenMP threads wait asleep, not spinning.

torch (OpenMP, and MKL on OpenMP) sizes its thread pool to every core of the machine, and an
OpenMP thread with no work spins on its core for a while before it sleeps. With one xdist worker
per core, each worker's pool spins on the cores the other workers are computing on: on a 2-core
machine the size sweeps took 71 s under ``-n auto`` and 45 s with the waiting threads asleep
(``OMP_WAIT_POLICY=PASSIVE``). A worker sets that policy before a kernel's library loads, unless the
caller chose one. The thread count itself is left as it is: a kernel that pins the count and leaves
it so must still be seen (PRESENT-CONTEXT-04), whatever the count its caller runs under.
"""

from __future__ import annotations

import os

#: OpenMP reads it when its runtime loads (torch's import)
WAIT_POLICY = "OMP_WAIT_POLICY"


def sharing(environ: dict[str, str] | None = None) -> bool:
    """True in a pytest-xdist worker of a run with more than one, where the caller set no wait policy."""
    env = os.environ if environ is None else environ
    return int(env.get("PYTEST_XDIST_WORKER_COUNT") or 0) > 1 and WAIT_POLICY not in env


def share() -> None:
    """Waiting OpenMP threads sleep in this worker: set before torch loads, read by it then."""
    if sharing():
        os.environ[WAIT_POLICY] = "PASSIVE"

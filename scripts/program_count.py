"""Count the programs a certification makes a compiling kernel build, per clause test (exact on a busy machine).

Why: a compiling kernel's cold certification cost is (number of distinct programs) x (time to compile
one); the second factor is the machine's, the first is the suite's, and it is what shape buckets
(``conformance/harness/cases/buckets.py``) reduce. This runs pytest in-process (one process, so that
every structure is compiled once) and prints, per clause test function, most first:

* the structures new to the process (``harness.calls.programs``: what a compiler that specializes on
  shapes, strides, dtypes and scalar arguments keys a program on), for any kernel, compiling or not,
  so a kernel that compiles nothing can be counted in seconds with ``--declare compiles_per_shape=true``;
* the programs the frameworks say they built: jax's ``backend_compile`` events (jax's persistent cache
  off, ``SDPA_CONFORMANCE_JAX_CACHE=0``) and torch.compile's graphs (``torch._dynamo`` counters
  ``unique_graphs``), when that framework is loaded.

::

    python scripts/program_count.py --impl=jax                       # conformance/clauses
    python scripts/program_count.py --impl=torch-sdpa --declare compiles_per_shape=true
    python scripts/program_count.py --json out.json conformance/clauses/test_shapes.py --impl=torch-compile

Every argument but ``--json FILE`` and ``--top N`` goes to pytest; ``--impl`` is required (a count is of
one kernel). Work at import or collection time is charged to ``<collection>``. Summed seconds are
printed too, but on a shared machine only the counts are to be trusted.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

# This checkout's package, not whichever one is installed (a copy of the tree measured side by side).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["SDPA_CONFORMANCE_JAX_CACHE"] = "0"  # before any import of the jax adapter
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

JAX_EVENT = "/jax/core/compile/backend_compile_duration"
CHANNEL_KEY = "sdpa_conformance_programs"  # harness.run.programs.CHANNEL's report key


class ProgramCounter:
    """A pytest plugin: per test node id, the new structures and the frameworks' compiled programs."""

    def __init__(self) -> None:
        self.current = "<collection>"
        self.structures: collections.Counter[str] = collections.Counter()
        self.first_s: collections.Counter[str] = collections.Counter()
        self.keys: list[str] = []
        self.keys_by_test: dict[str, list[str]] = collections.defaultdict(list)
        self.jax: collections.Counter[str] = collections.Counter()
        self.jax_by_program: collections.Counter[str] = collections.Counter()
        self.torch: collections.Counter[str] = collections.Counter()
        self._graphs = 0
        self.outcomes: dict[str, str] = {}

    def listen(self, event: str, duration: float, fun_name: str = "?", **_: object) -> None:
        if event == JAX_EVENT:
            self.jax[self.current] += 1
            self.jax_by_program[fun_name] += 1

    def _torch_graphs(self) -> int:
        dynamo = sys.modules.get("torch._dynamo.utils")
        return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0

    def _charge_torch(self) -> None:
        now = self._torch_graphs()
        if now > self._graphs:
            self.torch[self.current] += now - self._graphs
        self._graphs = now

    def pytest_configure(self, config) -> None:
        if "jax" in sys.modules or any("jax" in a for a in sys.argv):
            try:
                import jax.monitoring

                jax.monitoring.register_event_duration_secs_listener(self.listen)
            except ImportError:
                pass

    def pytest_runtest_setup(self, item) -> None:
        self._charge_torch()
        self.current = item.nodeid

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome
        for key, value in getattr(report, "user_properties", ()):
            if key == CHANNEL_KEY:
                payload = value["payload"]
                self.structures[report.nodeid] += len(payload["new"])
                self.first_s[report.nodeid] += payload["first_s"]
                self.keys += payload["new"]
                self.keys_by_test[report.nodeid] += payload["new"]

    def pytest_runtest_teardown(self, item) -> None:
        self._charge_torch()
        self.current = "<between tests>"


def _function(nodeid: str) -> str:
    """``path::test_fn[param]`` -> ``path::test_fn``: one clause test, all its parameters."""
    return nodeid.split("[", 1)[0]


def main(argv: list[str]) -> int:
    json_path, top = None, 40
    args: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--json":
            json_path = next(it)
        elif a == "--top":
            top = int(next(it))
        else:
            args.append(a)
    if not any(a.startswith("--impl") for a in args):
        print("program_count.py: name the kernel with --impl=SPEC", file=sys.stderr)
        return 2
    if not any(os.path.exists(a.split("::")[0]) for a in args if not a.startswith("-")):
        args.append("conformance/clauses")
    args += ["-p", "no:cacheprovider", "-p", "no:xdist"]

    import pytest

    counter = ProgramCounter()
    t0 = time.perf_counter()
    try:
        rc = pytest.main(args, plugins=[counter])
    except Exception as exc:  # noqa: BLE001 - e.g. a clause module half-written by someone else: keep the counts
        print(f"pytest raised {type(exc).__name__}: {exc}", file=sys.stderr)
        rc = 3
    wall = time.perf_counter() - t0

    per_fn: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for what, counts in (("structures", counter.structures), ("jax", counter.jax), ("torch", counter.torch)):
        for nodeid, n in counts.items():
            per_fn[_function(nodeid)][what] += n
    first_s = collections.Counter()
    for nodeid, s in counter.first_s.items():
        first_s[_function(nodeid)] += s
    totals = {w: sum(c[w] for c in per_fn.values()) for w in ("structures", "jax", "torch")}
    fwd = sum(1 for k in counter.keys if not k.startswith("vjp "))
    print(
        f"\nstructures new to the process: {totals['structures']} ({fwd} forward, {totals['structures'] - fwd} "
        f"backward); programs built: jax {totals['jax']}, torch.compile graphs {totals['torch']}"
    )
    print("struct   jax  torch  first-call s  clause test")
    ranked = sorted(per_fn.items(), key=lambda kv: -max(kv[1].values()))
    for fn, c in ranked[:top]:
        print(f"{c['structures']:6d} {c['jax']:5d} {c['torch']:6d} {first_s[fn]:13.1f}  {fn}")
    if counter.jax_by_program:
        print("jax by program: " + ", ".join(f"{n} {k}" for n, k in counter.jax_by_program.most_common()))
    print(f"wall {wall:.1f} s (only indicative on a shared machine)")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(
                {
                    "args": args,
                    "totals": totals,
                    "per_function": {fn: dict(c) for fn, c in per_fn.items()},
                    "structures": counter.keys,
                    "structures_by_test": counter.keys_by_test,
                    "jax_by_program": dict(counter.jax_by_program),
                    "outcomes": counter.outcomes,
                },
                fh,
                indent=1,
                sort_keys=True,
            )
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

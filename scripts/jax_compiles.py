"""Count XLA compilations per clause test, cold: a count, unlike a time, is exact on a busy machine.

Why: a compiling adapter's cold certification cost is (number of distinct programs) x (compile time
of one); the second factor is the machine's, the first is the suite's, and it is what shape buckets
reduce. This runs pytest in-process with jax's persistent compilation cache off
(``SDPA_CONFORMANCE_JAX_CACHE=0``), listens for jax's ``backend_compile`` duration events (one per
executable XLA really builds; a jit cache hit sends none) and prints the compilations charged to each
test, grouped by clause test function, most first::

    python scripts/jax_compiles.py                       # conformance/clauses --impl=jax
    python scripts/jax_compiles.py --json out.json conformance/clauses/test_shapes.py --impl=jax

Every argument but ``--json FILE`` and ``--top N`` goes to pytest. Compilations at import or
collection time are charged to ``<collection>``. The summed compile seconds are printed too, but on
a shared machine only the counts are to be trusted.
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

EVENT = "/jax/core/compile/backend_compile_duration"
# ``jnp.asarray(numpy array)`` compiles a tiny copy program ("stage") per input shape and dtype
# (~0.01 s each); counted apart from the kernel's own programs (~0.2 s each), which is what buckets cut.
STAGING = "jit(stage)"


class CompileCounter:
    """A pytest plugin: compilations (and their summed seconds) per test node id."""

    def __init__(self) -> None:
        self.current = "<collection>"
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.programs: collections.Counter[str] = collections.Counter()  # jax's fun_name, e.g. jit(_attention)
        self.kernel: collections.Counter[str] = collections.Counter()  # all but the input staging
        self.outcomes: dict[str, str] = {}

    def listen(self, event: str, duration: float, fun_name: str = "?", **_: object) -> None:
        if event == EVENT:
            self.counts[self.current] += 1
            self.seconds[self.current] += duration
            self.programs[fun_name] += 1
            if fun_name != STAGING:
                self.kernel[self.current] += 1

    def pytest_configure(self, config) -> None:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self.listen)

    def pytest_runtest_setup(self, item) -> None:
        self.current = item.nodeid

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome

    def pytest_runtest_teardown(self, item) -> None:
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
    if not any(not a.startswith("-") for a in args):
        args.append("conformance/clauses")
    if not any(a.startswith("--impl") for a in args):
        args.append("--impl=jax")
    args += ["-p", "no:cacheprovider", "-p", "no:xdist"]

    import pytest

    counter = CompileCounter()
    t0 = time.perf_counter()
    try:
        rc = pytest.main(args, plugins=[counter])
    except Exception as exc:  # noqa: BLE001 - e.g. a clause module half-written by someone else: keep the counts
        print(f"pytest raised {type(exc).__name__}: {exc}", file=sys.stderr)
        rc = 3
    wall = time.perf_counter() - t0

    per_fn: collections.Counter[str] = collections.Counter()
    per_fn_k: collections.Counter[str] = collections.Counter()
    per_fn_s: collections.Counter[str] = collections.Counter()
    for nodeid, n in counter.counts.items():
        per_fn[_function(nodeid)] += n
        per_fn_k[_function(nodeid)] += counter.kernel[nodeid]
        per_fn_s[_function(nodeid)] += counter.seconds[nodeid]
    total, kernel = sum(counter.counts.values()), sum(counter.kernel.values())
    print(f"\nXLA compilations, cold (persistent cache off): {total} in all, {kernel} not {STAGING}")
    print(" all  kernel  compile s  clause test")
    for fn, n in per_fn_k.most_common(top):
        print(f"{per_fn[fn]:4d}  {n:6d}  {per_fn_s[fn]:9.1f}  {fn}")
    print("by program: " + ", ".join(f"{name} {n}" for name, n in counter.programs.most_common()))
    print(
        f"compile seconds summed {sum(counter.seconds.values()):.1f}, wall {wall:.1f} s "
        "(times: only indicative on a shared machine)"
    )
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(
                {
                    "args": args,
                    "total": total,
                    "kernel": kernel,
                    "per_test_kernel": dict(counter.kernel),
                    "per_test": dict(counter.counts),
                    "per_function": dict(per_fn),
                    "programs": dict(counter.programs),
                    "outcomes": counter.outcomes,
                },
                fh,
                indent=1,
                sort_keys=True,
            )
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

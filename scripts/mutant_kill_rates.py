"""Certify a seeded sample of generated mutants and print the kill rate per arity and per perturbation.

    python scripts/mutant_kill_rates.py --arity 2 --n 300                     # arity 1 and 2, ci profile
    python scripts/mutant_kill_rates.py --arity 3 --n 300 --profile thorough  # arity 3, thorough profile
    python scripts/mutant_kill_rates.py --arity 2 --n 300 --jobs 2 --json rates.json

The mutants are ``tests/generated_mutants.py``'s: the correct NumPy kernel, wrong by one perturbation
wherever a trigger of 1 to 3 predicates over the value-class table holds (or "called before with the
same shapes"). Why a script over a tests/ module and not ``python -m conformance.mutants``: the mutants
are kernels written to be wrong, for measuring the suite; the installed package ships only what
certifies a user's kernel, and this tool runs from a checkout, beside the self-tests.

Each mutant is certified in this process (``--jobs N``: N processes; use it only on a quiet machine)
and stops at its first failing clause, in this order: the run's cheap broad clauses
(``harness.run.ordering.FIRST``), then the covering clauses (row by row, stopping at the first failing
row, not shrunk), then every other clause of the ci (or thorough) profile in run order; the
performance clauses are left out (they measure in a worker process that loads a kernel by name), and
the long-sequence clauses run in the thorough profile only, as in a certification. A mutant
that passes everything is a survivor; for each the script looks for a row of the value classes that
holds its trigger and a class its perturbation needs, built as a case, on which it differs from the
oracle: found, the survivor is a coverage gap (named with that row); not found, it is reported as
not shown to differ on the rows tried.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CALL_FAMILIES = ("contexts", "arguments", "transforms", "memory", "limits")  # tests/generated_call_mutants.FAMILIES


def _setup(profile: str) -> None:
    from conformance.harness.cases.profiles import load_profile

    load_profile(profile)


def _clauses(profile: str):
    from conformance.harness.run.ordering import FIRST, rank
    from tests.clause_runner import NOT_IN_CI, PERF, load_clauses

    clauses = load_clauses()
    cover = ("COVER-PAIRS-01", "COVER-PAIRS-GRAD-02")
    rest = sorted((c for c in clauses if c not in FIRST and c not in cover), key=rank)
    order = [c for c in FIRST if c in clauses] + list(cover) + rest
    # the performance clauses measure in a worker process that loads the kernel by its --impl name, which a
    # generated mutant has none of; the long-sequence clauses are the thorough profile's
    return [
        (c, clauses[c])
        for c in order
        if clauses[c].func.__module__ != PERF and (clauses[c].func.__module__ not in NOT_IN_CI or profile == "thorough")
    ]


def _covering_fails(impl, cid: str) -> str | None:
    """The first failing row of a covering clause (no shrinking), or None."""
    from conformance.clauses import test_covering as tc
    from conformance.harness.covering import array as covering

    direction = "forward" if cid == "COVER-PAIRS-01" else "backward"
    if direction == "backward" and not impl.declaration.grad:
        return None
    plan = covering.plan(impl.declaration, tc._t())
    for i in tc._rows(impl, direction):
        exc = tc._fails(impl, i, plan.rows[i], direction)
        if exc is not None:
            return f"row {i}: {str(exc).splitlines()[0][:160]}"
    return None


def certify(spec, profile: str) -> dict:
    """The first clause the mutant ``spec`` fails (or none), and for a survivor, a witness row."""
    _setup(profile)
    from conformance.harness.calls.guarded import GuardedAdapter
    from tests import generated_call_mutants
    from tests.clause_runner import dtypes_for, run_clause
    from tests.generated_mutants import Generated

    calls = isinstance(spec, generated_call_mutants.CallSpec)
    kernel = generated_call_mutants.make(spec) if calls else Generated(spec)
    t0 = time.process_time()
    for cid, info in _clauses(profile):
        if cid.startswith("COVER-PAIRS"):
            why = _covering_fails(GuardedAdapter(kernel, spec.name, timeout=0), cid)
            if why:
                return {"killed_by": cid, "why": why, "cpu_s": time.process_time() - t0}
            continue
        for dtype in dtypes_for(info):
            verdict = run_clause(info, kernel, dtype, shrink=False)
            if verdict.startswith("failed"):
                return {"killed_by": f"{cid}[{dtype}]", "why": verdict[:160], "cpu_s": time.process_time() - t0}
    found = "not killed (the calls family has no witness search: read its trigger)" if calls else witness(spec, profile)
    return {"killed_by": None, "witness": found, "cpu_s": time.process_time() - t0}


def witness(spec, profile: str) -> str:
    """A row holding the trigger and a needed class on which the mutant differs from the oracle."""
    from conformance.clauses.test_covering import _judge
    from conformance.harness.calls.guarded import GuardedAdapter
    from conformance.harness.covering import admission
    from conformance.harness.covering import array as covering
    from conformance.harness.covering.build import build_planned
    from conformance.harness.spec.report import ClauseViolation
    from tests.generated_mutants import AGAIN, BY_NAME, Generated, inert_reason

    pert = BY_NAME[spec.perturbation]
    decl = Generated(spec).declaration
    defaults = covering.defaults_for(decl)
    plain = {p: v for p, v in spec.trigger if (p, v) != AGAIN}
    needs = [plain] if not pert.needs else [{**alt, **plain} for alt in pert.needs]
    tried = 0
    for need in needs:
        if pert.direction == "backward":
            need = {**need, "direction": "backward"}
        row = admission.complete(decl, need, 2, defaults)[0]
        if row is None:
            continue
        for seed in range(3):
            tried += 1
            impl = GuardedAdapter(Generated(spec), spec.name, timeout=0)
            case, grad_out = build_planned(row, decl, 9000 + seed)
            calls = 2 if AGAIN in spec.trigger else 1
            try:
                for _ in range(calls):
                    _judge(impl, case, grad_out, pert.direction)
            except ClauseViolation:
                shown = "; ".join(f"{p}: {v}" for p, v in row.items() if v != defaults[p])
                return f"differs from the oracle on the row {shown} (seed {9000 + seed}): a coverage gap"
    why = inert_reason(spec, decl, defaults)
    return f"did not differ from the oracle on the {tried} rows tried" + (f": {why}" if why else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arity", type=int, choices=(1, 2, 3), default=2, help="2: arity 1 and 2 (1:2); 3: arity 3 only")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--profile", choices=("ci", "thorough"), default="ci")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", help="write every mutant's result here")
    ap.add_argument("--start", type=int, default=1, help="certify the sample from its N-th mutant (resume a run)")
    ap.add_argument("--end", type=int, default=0, help="... up to its N-th mutant (split a sample across processes)")
    ap.add_argument(
        "--family",
        choices=("values", "calls", *CALL_FAMILIES),
        default="values",
        help="values: NumPy kernels wrong where value classes meet (tests/generated_mutants.py); calls: torch "
        "functions wrong in how a call is made, around it or in what they accept (tests/generated_call_mutants.py); "
        f"{', '.join(CALL_FAMILIES)}: the calls family with one predicate of that family in every trigger "
        "(the context a caller sets, scalar argument types, transforms, memory alignment and row pitch, sizes past "
        "a kernel's limits)",
    )
    args = ap.parse_args(argv)
    _setup(args.profile)
    if args.family != "values":
        from tests.generated_call_mutants import sample as call_sample

        family = None if args.family == "calls" else args.family
        if args.arity == 3:
            specs = call_sample(args.n, 3, args.seed, family)
        else:
            n1 = args.n // 3 if args.arity == 2 else args.n
            specs = call_sample(n1, 1, args.seed, family) + (
                call_sample(args.n - n1, 2, args.seed + 1, family) if args.arity == 2 else []
            )
        return _run(specs[args.start - 1 : args.end or None], args)

    from conformance.harness.covering import admission
    from conformance.harness.covering import array as covering
    from tests.generated_mutants import Generated, Spec, inert_reason, sample

    decl = Generated(Spec((), "scale off by 10 %")).declaration
    plan = covering.plan(decl, 2)
    values = collections.defaultdict(list)
    for p, v in {item for tup in plan.admitted for item in tup}:
        values[p].append(v)
    values = {p: sorted(vs) for p, vs in values.items()}

    def admits(row: dict) -> bool:
        return admission.admit(decl, row, 2, plan.defaults) is None

    def equivalent(spec) -> str:
        return inert_reason(spec, decl, plan.defaults)

    if args.arity == 3:
        specs = sample(args.n, 3, args.seed, values, admits, equivalent)
    else:
        n1 = args.n // 3 if args.arity == 2 else args.n
        specs = sample(n1, 1, args.seed, values, admits, equivalent)
        if args.arity == 2:
            specs += sample(args.n - n1, 2, args.seed + 1, values, admits, equivalent)
    return _run(specs[args.start - 1 : args.end or None], args)


def _run(specs, args) -> int:
    t0 = time.time()
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.starmap(certify, [(s, args.profile) for s in specs])
    else:
        results = []
        for i, s in enumerate(specs, 1):
            results.append(certify(s, args.profile))
            r = results[-1]
            how = f"by {r['killed_by']}" if r["killed_by"] else f"SURVIVED ({r['witness']})"
            at = f"{i + args.start - 1}/{len(specs) + args.start - 1}"
            print(f"  {at} arity {s.arity} {s.perturbation}: {how}: {s.name}", flush=True)
    _report(specs, results, args, time.time() - t0)
    if args.json:
        with open(args.json, "w") as fh:
            rows = [
                {"mutant": s.name, "arity": s.arity, "perturbation": s.perturbation, **r}
                for s, r in zip(specs, results)
            ]
            json.dump({"args": vars(args), "results": rows}, fh, indent=1)
    return 0


def _report(specs, results, args, wall: float) -> None:
    by_arity = collections.defaultdict(lambda: [0, 0])
    by_pert = collections.defaultdict(lambda: [0, 0])
    by_clause = collections.Counter()
    for s, r in zip(specs, results):
        killed = r["killed_by"] is not None
        for table, key in ((by_arity, s.arity), (by_pert, s.perturbation or "an invalid call answered")):
            table[key][0] += killed
            table[key][1] += 1
        by_clause[(r["killed_by"] or "survived").split("[")[0]] += 1
    print(f"\n{len(specs)} generated mutants, profile {args.profile}, seed {args.seed}, {wall:.0f} s wall")
    print("\n| arity | killed | of | rate |\n|---:|---:|---:|---:|")
    for a, (k, n) in sorted(by_arity.items()):
        print(f"| {a} | {k} | {n} | {100 * k / n:.1f} % |")
    print("\n| perturbation | killed | of |\n|---|---:|---:|")
    for p, (k, n) in sorted(by_pert.items()):
        print(f"| {p} | {k} | {n} |")
    print("\nfirst failing clause: " + ", ".join(f"{c} {n}" for c, n in by_clause.most_common()))
    survivors = [(s, r) for s, r in zip(specs, results) if r["killed_by"] is None]
    inert = sum("equivalent:" in r["witness"] for _, r in survivors)
    for a in sorted(by_arity):
        k, n = by_arity[a]
        m = n - sum("equivalent:" in r["witness"] for s, r in survivors if s.arity == a)
        print(f"arity {a}: {k} of {m} mutants that can differ from the kernel killed ({100 * k / max(m, 1):.1f} %)")
    print(f"\n{len(survivors)} survivors ({inert} equivalent by construction)" + (":" if survivors else ""))
    for s, r in survivors:
        print(f"- {s.name}: {r['witness']}")


if __name__ == "__main__":
    raise SystemExit(main())

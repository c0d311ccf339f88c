#!/usr/bin/env python3
"""How close do correct kernels come to their allowance? The largest |err| / allowed, per kernel,
clause (or random case), dtype and quantity, over many random seeds.

The error model (conformance/harness/judge/tolerance.py) must never cry wolf: every correct formulation
passes on any seed. A share of the allowance near 1 is either an error the model under-predicts (a
missing term) or an honest worst case it covers; this script finds the candidates, with the case
that produced them, so that each can be investigated (docs/tolerance.md, "Margins").

Two sources of comparisons, both observed through ``compare.observing`` (the clauses' own rule):

* ``--clauses``: every numeric clause (performance clauses left out) once on every kernel, then
  the hypothesis-driven clauses ``--seeds`` more times with fresh random seeds (the ci example
  counts, not derandomized: what ``--conformance-random-seeds`` does); ``--profile thorough`` runs
  the thorough profile instead.
* ``--cases N``: N random cases per kernel (1-11 queries, 1-39 keys, Dk 1-32, magnitudes 0.5-4,
  half with V >= 0 so that |o| = sum w |v|, masks, causal, GQA, biases; every tenth up to 69
  queries, 399 keys, Dk 128), output, observed weights and (kernels with a VJP) dQ, dK, dV.

Usage: python scripts/margins.py [--kernels zoo,builtin] [--clauses] [--seeds 3] [--cases 200]
       [--profile ci|thorough] [--top 25] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.calls.probes import observe_weights
from conformance.harness.calls.registry import resolve
from conformance.harness.cases import strategies
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge import compare
from tests.clause_runner import dtypes_for, load_clauses, run_clause

BUILTIN = ("numpy", "torch-eager", "torch-sdpa", "torch-sdpa-math", "torch-sdpa-flash", "jax")


def zoo_kernels() -> dict:
    from tests.zoo_kernels import ZOO
    from tests.zoo_more import MORE

    kernels = {**ZOO, **MORE}
    try:
        from tests.zoo_more2 import MORE2

        kernels.update(MORE2)
    except ImportError:
        pass
    return kernels


def named_kernels() -> dict:
    """Every kernel --only may name: the zoo plus those the suite refuses (open or not admitted)."""
    from tests.zoo_more import NOT_ADMITTED
    from tests.zoo_more2 import NOT_ADMITTED2, OPEN

    return {**zoo_kernels(), **NOT_ADMITTED, **OPEN, **NOT_ADMITTED2}


def _builtin(spec: str):
    return resolve(spec).adapter


def kernels_for(which: str, only: str | None) -> dict:
    out: dict = {}
    if "zoo" in which:
        out.update(zoo_kernels())
    if "builtin" in which:
        for name in BUILTIN:
            if resolve(name).usable:
                out[name] = partial(_builtin, name)
    if only:
        named = {**named_kernels(), **out}
        out = {k: named[k] for k in only.split(",")}
    return out


class Worst:
    """The largest share per (kernel, source, dtype, quantity), with the element and case behind it."""

    def __init__(self) -> None:
        self.rows: dict[tuple, tuple] = {}
        self.cases: dict[tuple, object] = {}  # the case behind each row (for a closer look, see --dump)
        self.count = 0

    def add(self, kernel: str, source: str, what: str, case, actual, want, allowed) -> None:
        actual, want = np.asarray(actual, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if actual.shape != want.shape:
            return
        ok = np.isfinite(want) & np.isfinite(actual) & np.isfinite(allowed) & (allowed > 0)
        if not ok.any():
            return
        self.count += 1
        ratio = np.where(ok, np.abs(actual - want) / np.where(ok, allowed, 1.0), 0.0)
        at = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        r = float(ratio[at])
        key = (kernel, source, case.dtype, what)
        if key not in self.rows or r > self.rows[key][0]:
            detail = f"|exp|={abs(want[at]):.3g} err={abs(actual[at] - want[at]):.3g} allowed={allowed[at]:.3g}"
            self.rows[key] = (r, case.describe(), detail)
            self.cases[key] = (case, at)

    def table(self, top: int) -> str:
        items = sorted(self.rows.items(), key=lambda kv: -kv[1][0])[:top]
        lines = [
            "| share | kernel | clause / source | dtype | quantity | element | case |",
            "|---:|---|---|---|---|---|---|",
        ]
        for (kernel, source, dtype, what), (r, case, detail) in items:
            lines.append(f"| {r:.3f} | {kernel} | {source} | {dtype} | {what} | {detail} | {case} |")
        return "\n".join(lines)


def _numeric(what: str) -> bool:
    return what in ("dq", "dk", "dv") or "weights" in what or (what.startswith("output") and "(" not in what)


def _load_profile_before_clauses(profile: str) -> None:
    """Load the hypothesis profile *before* the clause modules are imported: each clause's settings
    take their parent profile (and so derandomize) when its module is imported, as under pytest,
    where the plugin loads the profile at configure time. ``ci`` with ``--seeds`` loads the ci counts
    not derandomized (what --conformance-random-seeds does): every run of a hypothesis clause then
    draws fresh examples."""
    from hypothesis import settings

    loaded = [m for m in sys.modules if m.startswith("conformance.clauses.test_")]
    if loaded:
        raise RuntimeError(f"clause modules imported before the profile was chosen: {loaded[:3]}")
    strategies.register_profiles()
    if profile == "ci-random":
        parent = settings.get_profile(strategies.PREFIX + "ci")
        settings.register_profile(strategies.PREFIX + "ci-random", parent=parent, derandomize=False)
    strategies.load_profile(profile)


def run_clauses(kernels: dict, worst: Worst, seeds: int, profile: str) -> None:
    """Every numeric clause once; with ``seeds`` > 0 (ci only) the ci counts with random seeds, and the
    hypothesis clauses ``seeds`` more times."""
    _load_profile_before_clauses("ci-random" if seeds and profile == "ci" else profile)
    catalog = load_clauses()
    current = {"kernel": "", "clause": ""}

    def observe(what, case, actual, want, allowed):
        if _numeric(what):
            worst.add(current["kernel"], current["clause"], what, case, actual, want, allowed)

    hypo = [c for c, i in catalog.items() if getattr(i.func, "is_hypothesis_test", False)]
    with compare.observing(observe):
        for rep in range(seeds + 1):
            ids = sorted(catalog) if rep == 0 else hypo
            for name, make in kernels.items():
                current["kernel"] = name
                start, failed = time.monotonic(), []
                for cid in ids:
                    info = catalog[cid]
                    if info.module.endswith(".test_perf"):
                        continue
                    current["clause"] = cid
                    for d in dtypes_for(info):
                        try:
                            verdict = run_clause(info, make(), d)
                        except Exception as exc:  # noqa: BLE001 - reported, the measurement goes on
                            verdict = f"failed: {type(exc).__name__}: {exc}"
                        if verdict.startswith("failed"):
                            failed.append(f"{cid}[{d}]: {verdict.splitlines()[0][:200]}")
                took = time.monotonic() - start
                print(f"  rep {rep} {name}: {took:.0f} s, failed: {failed or 'none'}", file=sys.stderr, flush=True)


def draw_case(rng: np.random.Generator, i: int, dtype: str, decl):
    big = i % 10 == 9
    T = int(rng.integers(1, 70 if big else 12))
    S = int(rng.integers(1, 400 if big else 40))
    Dk = 128 if big else int(rng.choice([1, 4, 8, 16, 32]))
    Dv = Dk if decl.requires_dk_eq_dv or rng.random() < 0.5 else int(rng.choice([4, 8, 16]))
    Hkv = int(rng.integers(1, 3))
    g = int(rng.choice([1, 2, 4])) if decl.gqa else 1
    B = int(rng.integers(1, 3))
    mag = float(rng.choice([0.5, 1.0, 2.0, 4.0]))
    causal = bool(decl.causal and rng.random() < 0.3)
    mask = random_mask(i, (B, 1, T, S)) if decl.bool_mask and rng.random() < 0.3 else None
    bias = 2.0 * rng.standard_normal((T, S)) if decl.float_mask and mask is None and rng.random() < 0.2 else None
    case = random_case(
        int(rng.integers(2**31)), B=B, Hq=Hkv * g, Hkv=Hkv, T=T, S=S, Dk=Dk, Dv=Dv, dtype=dtype,
        mask=mask, bias=bias, is_causal=causal, magnitude=mag,
    )  # fmt: skip
    if rng.random() < 0.5:
        case = case.replace(value=np.abs(case.value))
    if bias is not None:
        case = case.replace(bias=bias.astype(case.query.dtype))
    return case


def run_cases(kernels: dict, worst: Worst, n: int, seed: int, dtypes: list[str] | None = None) -> None:
    for name, make in kernels.items():
        adapter = make()
        decl = adapter.declaration
        impl = GuardedAdapter(adapter, spec=name, timeout=0)
        rng = np.random.default_rng([seed, sum(map(ord, name))])
        dts = sorted(d for d in decl.dtypes if not dtypes or d in dtypes)
        start = time.monotonic()
        for i in range(n):
            case = draw_case(rng, i, dts[i % len(dts)], decl)
            src = "random cases"
            want = compare.expected(case, decl)
            out = impl.forward(case)
            worst.add(name, src, "output", case, out, want.out, compare.output_allowance(case, decl))
            if not decl.requires_dk_eq_dv:
                w = observe_weights(impl, case)
                worst.add(name, src, "weights", case, w, want.weights, compare.weights_allowance(case, decl))
            if decl.grad:
                do = rng.standard_normal(case.out_shape).astype(case.query.dtype)
                got = impl.vjp(case, do)
                exp = compare.expected_vjp(case, do, decl)
                for what, g_, e_, a_ in zip(("dq", "dk", "dv"), got, exp, compare.grad_allowance(case, do, decl)):
                    worst.add(name, src, what, case, g_, e_, a_)
        print(f"  cases {name}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="zoo,builtin")
    ap.add_argument("--only", help="comma-separated kernel names")
    ap.add_argument("--clauses", action="store_true", help="run the clauses (see the module docstring)")
    ap.add_argument("--seeds", type=int, default=3, help="random-seed repetitions of the hypothesis clauses")
    ap.add_argument("--profile", default="ci", choices=("ci", "thorough"))
    ap.add_argument("--cases", type=int, default=0, help="random cases per kernel")
    ap.add_argument("--seed", type=int, default=int(time.time()), help="seed of the random cases (printed)")
    ap.add_argument("--dtypes", help="random cases only in these dtypes (comma-separated)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    kernels = kernels_for(args.kernels, args.only)
    worst = Worst()
    if args.clauses:
        run_clauses(kernels, worst, args.seeds, args.profile)
    if args.cases:
        print(f"random cases: --seed {args.seed}", file=sys.stderr)
        run_cases(kernels, worst, args.cases, args.seed, args.dtypes.split(",") if args.dtypes else None)
    print(f"{worst.count} comparisons, {len(kernels)} kernels")
    print(worst.table(args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

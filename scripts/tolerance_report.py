#!/usr/bin/env python3
"""Measure the error model against honest kernels and uniform deviations; print (or write) the tables
of docs/tolerance.md.

Every numeric clause (ci profile; the performance clauses are left out) is run on every zoo
kernel (tests/zoo_kernels.py) and every built-in CPU adapter importable here, with an observer on
the comparisons (``compare.observing``). Per dtype and quantity (outputs, observed weights,
gradients) it reports:

* ``used``: per comparison, max over elements of |err| / allowed: the share of the allowance an
  honest kernel used (must stay <= 1; the max and the median over comparisons);
* ``honest`` and ``allowed``: the largest error and the median allowance, each relative to the
  median |expected| of the comparison (medians over comparisons): what the issue measured as "13-67 %
  of the median |out|" for the rule before the model;
* ``old rule``: the same median allowance under the rule the model replaced,
  ``4 max(ref_err, ATOL) + RTOL |expected|`` (outputs only; ref_err from the max-subtract member,
  which is what ``oracle.emulate`` computed).

Then the sensitivity ladder: the smallest softmax temperature and gradient scale that ORACLE-AGREE-01
and GRAD-VJP-01 see, per dtype, on two zoo kernels.

Usage: python scripts/tolerance_report.py [--kernels zoo,builtin] [--write docs/tolerance.md]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.contract import DTYPES
from conformance.harness.calls.registry import resolve
from conformance.harness.cases import strategies
from conformance.harness.judge import compare, ensemble
from tests.clause_runner import dtypes_for, load_clauses, run_clause
from tests.test_sensitivity import GradientScaled, Temperature
from tests.zoo_kernels import ZOO

BUILTIN = ("numpy", "torch-eager", "torch-sdpa", "torch-sdpa-math", "torch-sdpa-flash", "jax")
OLD_ATOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
OLD_RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
LADDER = {
    "temperature": {
        "bfloat16": [1.05, 1.02, 1.01, 1.005, 1.002],
        "float16": [1.005, 1.002, 1.001, 1.0005, 1.0002],
        "float32": [1.0001, 1.00001, 1.000002],
        "float64": [1.0001, 1 + 1e-8, 1 + 1e-10],
    },
    "gradients": {
        "bfloat16": [0.9, 0.95, 0.98, 0.99, 0.995],
        "float16": [0.99, 0.995, 0.998, 0.999],
        "float32": [0.9999, 0.99999, 0.999999],
        "float64": [0.9999, 1 - 1e-8, 1 - 1e-10],
    },
}
TARGET = {
    "temperature": {"bfloat16": 1.02, "float16": 1.002, "float32": 1.0001, "float64": 1.0001},
    "gradients": {"bfloat16": 0.95, "float16": 0.99, "float32": 0.9999, "float64": 0.9999},
}
BEGIN, END = "<!-- measured: begin (scripts/tolerance_report.py) -->", "<!-- measured: end -->"


def _kind(what: str) -> str | None:
    if what in ("dq", "dk", "dv"):
        return "gradients"
    if "weights" in what:
        return "weights"
    if what.startswith("output") and "(" not in what:  # "(why)": two kernel outputs, not the oracle
        return "outputs"
    return None


def _old_allowance(case, want: np.ndarray, rule: str) -> np.ndarray:
    work = "float32" if rule == "float32" else None
    ref = ensemble.forward_members(case, work_dtype=work)["max-subtract"]
    with np.errstate(invalid="ignore"):
        d = np.abs(ref - want)
    d = d[np.isfinite(d)]
    ref_err = float(d.max()) if d.size else 0.0
    return 4 * max(ref_err, OLD_ATOL[rule]) + OLD_RTOL[rule] * np.abs(np.nan_to_num(want))


def _builtin(spec: str):
    return resolve(spec).adapter


def measure(kernels: dict) -> dict:
    catalog = load_clauses()
    rows: dict = defaultdict(lambda: defaultdict(list))
    current = {}

    def observe(what, case, actual, want, allowed):
        kind = _kind(what)
        if kind is None or actual.shape != want.shape:
            return
        ok = np.isfinite(want) & np.isfinite(actual) & np.isfinite(allowed)
        if not ok.any():
            return
        err = np.abs(actual - want)[ok]
        scale = float(np.median(np.abs(want[ok]))) or 1.0
        key = (current["kernel"], case.dtype, kind)
        rows[key]["used"].append(float(np.max(err / np.maximum(allowed[ok], 1e-300))))
        rows[key]["honest"].append(float(err.max()) / scale)
        rows[key]["allowed"].append(float(np.median(allowed[ok])) / scale)
        if kind == "outputs" and want.shape == case.out_shape:
            rule = current["decl"].tolerance_dtype(case)
            rows[key]["old"].append(float(np.median(_old_allowance(case, want, rule)[ok])) / scale)

    with compare.observing(observe):
        for name, make in kernels.items():
            current["kernel"] = name
            current["decl"] = make().declaration
            start = time.monotonic()
            failed = []
            for cid, info in sorted(catalog.items()):
                if info.module.endswith(".test_perf"):  # memory and backend, not numbers
                    continue
                for d in dtypes_for(info):
                    try:
                        verdict = run_clause(info, make(), d)
                    except Exception as exc:  # noqa: BLE001 - a crash is reported, the measurement goes on
                        verdict = f"failed: {type(exc).__name__}: {exc}"
                    if verdict.startswith("failed"):
                        failed.append(f"{cid}[{d}]")
            print(f"  {name}: {time.monotonic() - start:.0f} s, failed: {failed or 'none'}", file=sys.stderr)
    return rows


def ladder() -> dict:
    catalog = load_clauses()
    out = {}
    for kind, per in LADDER.items():
        cid, wrap = ("ORACLE-AGREE-01", Temperature) if kind == "temperature" else ("GRAD-VJP-01", GradientScaled)
        for d, factors in per.items():
            seen = [
                f
                for f in factors
                if all(
                    run_clause(catalog[cid], wrap(b, f, d), d).startswith("failed")
                    for b in ("zoo-maxsub-p-rounded", "zoo-fa2-exp2")
                )
            ]
            out[(kind, d)] = (seen, [f for f in factors if f not in seen])
    return out


def _pct(x: list[float]) -> str:
    return f"{100 * float(np.median(x)):.3g} %" if x else "-"


def render(rows: dict, steps: dict | None) -> str:
    lines = ["Measured with `python scripts/tolerance_report.py` (ci profile, every clause, every dtype).", ""]
    for kind in ("outputs", "weights", "gradients"):
        lines += [
            f"**{kind}**",
            "",
            "| dtype | kernel | comparisons | used (max) | used (median) | honest error | allowance"
            + (" | old rule |" if kind == "outputs" else " |"),
            "|---|---|---:|---:|---:|---:|---:" + ("|---:|" if kind == "outputs" else "|"),
        ]
        for d in DTYPES:
            for (name, dt, k), r in sorted(rows.items()):
                if dt != d or k != kind or not r["used"]:
                    continue
                line = (
                    f"| {d} | {name} | {len(r['used'])} | {max(r['used']):.3g} | {np.median(r['used']):.3g} | "
                    f"{_pct(r['honest'])} | {_pct(r['allowed'])} |"
                )
                if kind == "outputs":
                    line += f" {_pct(r['old'])} |"
                lines.append(line)
        lines.append("")
    if steps:
        lines += [
            (
                "**sensitivity** (seen = the clause fails on both zoo-maxsub-p-rounded and zoo-fa2-exp2 wrapped "
                "with the deviation)"
            ),
            "",
            "| deviation | dtype | issue's target | seen | not seen |",
            "|---|---|---|---|---|",
        ]
        for (kind, d), (seen, unseen) in steps.items():
            what = "softmax temperature x" if kind == "temperature" else "every gradient x"
            lines.append(
                f"| {what} | {d} | {TARGET[kind][d]:.12g} | {', '.join(f'{f:.12g}' for f in seen) or '-'} | "
                f"{', '.join(f'{f:.12g}' for f in unseen) or '-'} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="zoo,builtin", help="zoo, builtin, or both (comma-separated)")
    ap.add_argument("--no-ladder", action="store_true", help="skip the sensitivity ladder")
    ap.add_argument("--write", type=Path, help="replace the measured section of this markdown file")
    args = ap.parse_args(argv)
    strategies.load_profile("ci")
    kernels: dict = {}
    if "zoo" in args.kernels:
        kernels.update(ZOO)
    if "builtin" in args.kernels:
        for name in BUILTIN:
            res = resolve(name)
            if res.usable:
                kernels[name] = partial(_builtin, name)
            else:
                print(f"  {name}: unavailable ({res.reason})", file=sys.stderr)
    text = render(measure(kernels), None if args.no_ladder else ladder())
    if args.write:
        doc = args.write.read_text()
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
        if not pattern.search(doc):
            raise SystemExit(f"{args.write} has no measured section ({BEGIN} ... {END})")
        args.write.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

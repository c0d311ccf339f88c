"""Print the benchmark table: time, achieved GFLOP/s and distance from the two-GEMM floor.

    python benchmarks/report.py                 # runs `pytest benchmarks --benchmark-only` first
    python benchmarks/report.py --json FILE     # tabulates a saved --benchmark-json file
    SDPA_BENCH_QUICK=1 python benchmarks/report.py   # the short grid

The floor is measured in the same run (benchmarks/conftest.py): float32 NumPy matmuls for the adapters,
float64 for the oracle. ``x floor`` is the adapter's best time over the floor's: 1.0 would be a kernel
that costs nothing beyond its two GEMMs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmarks(json_path: Path, extra: list[str]) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "benchmarks"),
        "--benchmark-only",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--benchmark-json={json_path}",
        "--benchmark-disable-gc",
        *extra,
    ]
    print("$", " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd, cwd=ROOT)


def rows(data: dict) -> list[dict]:
    out = []
    for bench in data.get("benchmarks", []):
        info = dict(bench.get("extra_info", {}))
        if "impl" not in info:
            continue
        info["best_ms"] = bench["stats"]["min"] * 1e3
        out.append(info)
    # One floor per shape: the least disturbed of all its measurements in this run.
    factor = {"backward": 2.0}
    fwd_floor: dict = {}
    for r in out:
        key = (str(r["impl"]).startswith("oracle"), r["T"], r["S"], r["D"])
        fwd_floor[key] = min(fwd_floor.get(key, float("inf")), r["floor_s"] / factor.get(r["pass_"], 1.0))
    for r in out:
        f = fwd_floor[(str(r["impl"]).startswith("oracle"), r["T"], r["S"], r["D"])] * factor.get(r["pass_"], 1.0)
        r["floor_s"], r["floor_gflops"], r["x_floor"] = f, r["flops"] / f / 1e9, r["best_ms"] / 1e3 / f
    order = {"forward": 0, "backward": 1}
    out.sort(key=lambda r: (str(r["impl"]).startswith("oracle"), order.get(r["pass_"], 2), r["D"], r["T"], r["impl"]))
    return out


def table(rs: list[dict]) -> str:
    head = "| adapter | pass | T = S | D | best ms | GFLOP/s | floor GFLOP/s | x floor |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        lines.append(
            f"| {r['impl']} | {r['pass_']} | {r['T']} | {r['D']} | {r['best_ms']:.1f} | {r['gflops']:.1f} | "
            f"{r['floor_gflops']:.1f} | {r['x_floor']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="a --benchmark-json file to tabulate instead of running")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments, e.g. -k numpy")
    args = ap.parse_args(argv)
    path = args.json
    if path is None:
        path = Path(tempfile.mkdtemp()) / "bench.json"
        rc = run_benchmarks(path, args.pytest_args)
        if not path.exists():
            return rc or 1
    data = json.loads(path.read_text())
    machine = data.get("machine_info", {})
    print(
        f"# {machine.get('cpu', {}).get('brand_raw', machine.get('processor', '?'))}, "
        f"{os.cpu_count()} CPUs, {data.get('datetime', '')}; B=1, H=2, float32 (oracle: float64)"
    )
    print(table(rows(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

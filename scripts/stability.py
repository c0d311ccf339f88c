#!/usr/bin/env python3
"""Run the clause set over every correct built-in CPU adapter N times with random seeds; count clean runs.

A conformance suite must never cry wolf: a correct kernel fails only when a clause's stated
false-positive rate says it may. The ci profile is derandomized, so repeating it proves nothing;
this script repeats the ci example counts with *random* hypothesis seeds
(``--conformance-random-seeds``, see conformance/harness/run/selfdefense.py), one fresh seed per run,
printed so that any failing run can be replayed:

    pytest conformance/clauses --impl=... --conformance-random-seeds --hypothesis-seed=SEED

Usage: python scripts/stability.py [--runs 20] [--impl numpy,torch-eager,...] [--workers 2] [--setting NAME]
                                  [-- extra pytest args]
``--setting`` runs every run under one of scripts/hosts.py's dispatch settings (the kernels another CPU
would get; refused when this machine does not honour it). Exit status 0 when every run was clean.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_ADAPTERS = "numpy,torch-eager,torch-sdpa,torch-sdpa-math,torch-sdpa-flash,jax"


def _hosts():
    spec = importlib.util.spec_from_file_location("hosts", ROOT / "scripts" / "hosts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hosts"] = module
    spec.loader.exec_module(module)
    return module


def one_run(
    impls: str, seed: int, workers: int, extra: list[str], env: dict[str, str] | None = None
) -> tuple[int, list[str], str, float]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "conformance/clauses",
        f"--impl={impls}",
        "-q",
        "-p",
        "no:cacheprovider",
        "--conformance-random-seeds",
        f"--hypothesis-seed={seed}",
        *extra,
    ]
    if workers > 1:
        cmd += ["-n", str(workers)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - start
    failed = []
    for line in proc.stdout.splitlines():
        if line.startswith("failed clauses: "):
            failed = [c.strip() for c in line[len("failed clauses: ") :].split(", ")]
    summary = next((ln for ln in reversed(proc.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", ln)), "")
    return proc.returncode, failed, summary.strip("= "), elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--impl", default=CPU_ADAPTERS, help=f"comma-separated adapters (default {CPU_ADAPTERS})")
    ap.add_argument("--workers", type=int, default=1, help="pytest-xdist workers per run (1: serial)")
    ap.add_argument("--setting", help="a dispatch setting of scripts/hosts.py (python scripts/hosts.py list)")
    ap.add_argument("extra", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    env = None
    if args.setting:
        hosts = _hosts()
        if args.setting not in hosts.SETTINGS:
            sys.exit(f"stability.py: no setting {args.setting} (python scripts/hosts.py list)")
        ok, why, _ = hosts.check(hosts.SETTINGS[args.setting])
        if not ok:
            print(f"setting {args.setting}: not accepted on this machine: {why}", flush=True)
            return 2
        env = hosts.child_env(hosts.SETTINGS[args.setting], dict(os.environ))
        print(f"setting {args.setting}: {why}", flush=True)
    clean = 0
    rng = random.SystemRandom()
    for i in range(1, args.runs + 1):
        seed = rng.randrange(2**32)
        rc, failed, summary, elapsed = one_run(args.impl, seed, args.workers, args.extra, env)
        ok = rc == 0
        clean += ok
        status = "clean" if ok else f"NOT CLEAN (exit {rc})"
        print(f"run {i:2d}/{args.runs} seed={seed:<10d} {elapsed:6.1f}s {status}: {summary}", flush=True)
        for f in failed:
            print(f"    failed: {f}", flush=True)
    under = f"; setting {args.setting}" if args.setting else ""
    print(f"clean runs: {clean}/{args.runs} (adapters: {args.impl}{under})", flush=True)
    return 0 if clean == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())

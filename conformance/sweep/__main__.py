"""``python -m conformance.sweep``: certify adapters on several releases of their libraries, and report.

    python -m conformance.sweep --impl keras-torch --versions keras==3.13.0,3.14.1,3.15.1 --out sweep/
    python -m conformance.sweep --impl jax --impl keras-jax --versions jax==0.10.0,0.10.2 --out sweep/
    python -m conformance.sweep report a.json b.json ... --out sweep/

Each release gets its own cached environment (``conformance.sweep.envs``: the release, the project's
other pins held from constraints.txt, torch installed first and alone) and each certification is its own
process whose only output is its certificate (``pytest conformance/clauses --impl=X --certificate=F``),
so the jobs can run anywhere and be merged: the report (``harness.records.sweep_report``) is built from
certificates alone. Writes ``DIR/certs/<impl>@<dist>-<version>.json`` (with the pytest log beside it)
and ``DIR/sweep.md``. Exit code 0 when every certification wrote its certificate, whatever the verdicts
(the report tells them), 1 when one did not, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from conformance.sweep import envs


def _versions(values: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for value in values:
        dist, eq, rest = value.partition("==")
        versions = [v.strip() for v in rest.split(",") if v.strip()]
        if not eq or not dist.strip() or not versions:
            raise envs.SweepError(f"--versions {value!r}: write DIST==V1,V2,... (e.g. keras==3.13.0,3.14.1,3.15.1)")
        out.append((dist.strip(), versions))
    return out


def plan(impls: list[str], versions: list[tuple[str, list[str]]]) -> list[envs.Release]:
    """Every (adapter, release) to certify: each --impl on each release of a library it uses."""
    out = []
    for impl in impls:
        used = {envs._norm(d) for d in envs.swept(impl)}
        mine = [(d, vs) for d, vs in versions if envs._norm(d) in used]
        if not mine:
            names = ", ".join(d for d, _ in versions)
            raise envs.SweepError(f"--impl {impl} uses none of {names} (it needs {', '.join(sorted(used)) or 'none'})")
        out += [envs.Release(impl, d, v) for d, vs in mine for v in vs]
    return out


def certificate_path(out: Path, release: envs.Release) -> Path:
    return out / "certs" / f"{release.impl}@{envs._norm(release.dist)}-{release.version}.json"


def certify_command(python: Path, impl: str, cert: Path, *, workers: int, profile: str | None) -> list[str]:
    """The one job of a release: pytest on the clauses, writing the certificate and nothing else."""
    cmd = [str(python), "-m", "pytest", "conformance/clauses", f"--impl={impl}", f"--certificate={cert}"]
    cmd += ["-q", "-p", "no:cacheprovider"]
    if not envs.has_plugin(python):
        cmd += ["-p", "conformance.harness.plugin"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if profile:
        cmd.append(f"--conformance-profile={profile}")
    return cmd


def certify(release: envs.Release, out: Path, *, workers: int, profile: str | None) -> tuple[Path, str]:
    cert = certificate_path(out, release).resolve()
    cert.parent.mkdir(parents=True, exist_ok=True)
    cert.unlink(missing_ok=True)
    log_path = cert.with_suffix(".log")
    with log_path.open("w") as log:
        try:
            env = envs.ensure(release, log=log)
        except envs.SweepError as exc:
            return cert, f"{release.impl} on {release.label}: no environment: {exc}"
        cmd = certify_command(envs.python_of(env), release.impl, cert, workers=workers, profile=profile)
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=envs.CHECKOUT, stdout=log, stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - start
    if not cert.is_file():
        return (
            cert,
            f"{release.impl} on {release.label}: no certificate (pytest exit {proc.returncode}; see {log_path})",
        )
    word = json.loads(cert.read_text()).get("adapters", {}).get(release.impl, {}).get("verdict", "?")
    return cert, f"{release.impl} on {release.label}: {word} ({took:.0f} s) -> {cert}"


def write_report(paths: list[Path], out: Path, command: str, *, every_clause: bool = False) -> Path:
    from conformance.harness.records import sweep_report

    docs = []
    for p in paths:
        try:
            docs.append((str(p), json.loads(Path(p).read_text())))
        except (OSError, ValueError) as exc:
            raise envs.SweepError(f"cannot read certificate {p}: {exc}") from None
    out.mkdir(parents=True, exist_ok=True)
    target = out / "sweep.md"
    target.write_text(sweep_report.markdown(docs, command=command, every_clause=every_clause), encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "python -m conformance.sweep " + " ".join(shlex.quote(a) for a in argv)
    if argv[:1] == ["report"]:
        parser = argparse.ArgumentParser(prog="python -m conformance.sweep report", description="the report alone")
        parser.add_argument("certificates", nargs="+", type=Path)
        parser.add_argument("--out", type=Path, default=Path("sweep"))
        parser.add_argument("--every-clause", action="store_true", help="every clause, not only those that differ")
        args = parser.parse_args(argv[1:])
        try:
            print(write_report(args.certificates, args.out, command, every_clause=args.every_clause))
        except envs.SweepError as exc:
            parser.error(str(exc))
        return 0
    parser = argparse.ArgumentParser(prog="python -m conformance.sweep", description=__doc__.split("\n")[0])
    parser.add_argument("--impl", action="append", required=True, help="a built-in adapter (repeatable)")
    parser.add_argument("--versions", action="append", required=True, metavar="DIST==V1,V2,...")
    parser.add_argument("--out", type=Path, default=Path("sweep"))
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers per certification")
    parser.add_argument("--conformance-profile", dest="profile", default=None)
    parser.add_argument("--every-clause", action="store_true", help="the report's table lists every clause")
    args = parser.parse_args(argv)
    try:
        releases = plan(args.impl, _versions(args.versions))
    except envs.SweepError as exc:
        parser.error(str(exc))
    certs, ok = [], True
    for release in releases:
        cert, line = certify(release, args.out, workers=args.workers, profile=args.profile)
        print(line, flush=True)
        if cert.is_file():
            certs.append(cert)
        else:
            ok = False
    if certs:
        print(write_report(certs, args.out, command, every_clause=args.every_clause))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

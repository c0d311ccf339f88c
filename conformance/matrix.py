"""The conformance matrix: ``python -m conformance.matrix --out DIR [--impl SPEC ...] [--certificates A.json ...]``.

Certifies each adapter (by default every built-in available here) in its own pytest process, as a
user would (``python -m pytest conformance/clauses --impl=SPEC --certificate=DIR/certs/SPEC.json`` from
a checkout, ``--pyargs conformance`` instead of the path for an installed suite), or reads
certificates written elsewhere, and writes ``DIR/matrix.md`` and one self-contained
``DIR/matrix.html``: a row per clause grouped by spec section, a column per adapter and its library
versions, each cell's outcome with its reason and the command that reruns it, and each adapter's
verdict and likely causes on top. One process per adapter keeps one library's state (threads,
caches, a crash) from reaching another's verdict, and is exactly the command the cells reproduce.
Exit code 0 when every certification wrote its certificate, whatever the verdicts (the matrix
reports them; a gate uses each adapter's own pytest run), 1 when one wrote none (listed in the
matrix with its log, ``DIR/certs/<spec>.log``).

This module is only the command; the table is ``harness.records.matrix_build``, its renderings
``harness.records.matrix_markdown`` and ``harness.records.matrix_html``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import conformance

SUITE_ROOT = Path(conformance.__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The source checkout this suite runs from (pytest from its root runs the clauses by path), or
    None for an installed suite (the clauses are then collected with ``--pyargs conformance``)."""
    root = SUITE_ROOT
    return root if (root / "pyproject.toml").is_file() and (root / "conformance" / "clauses").is_dir() else None


def available_builtins() -> tuple[list[str], list[tuple[str, str]]]:
    """(every built-in adapter that can run here, (name, reason) for each that cannot)."""
    from conformance.harness.calls import registry

    usable, unavailable = [], []
    for name in registry.builtin_names():
        try:
            res = registry.resolve(name)
        except registry.ImplSpecError as exc:
            unavailable.append((name, str(exc)))
            continue
        (usable.append(name) if res.usable else unavailable.append((name, str(res.reason))))
    return usable, unavailable


def probe_builtins() -> tuple[list[str], list[tuple[str, str]]]:
    """:func:`available_builtins`, asked in a child process: resolving imports every framework (and some
    set process-wide state, such as keras's backend), which the certifications must not inherit."""
    code = "import json, conformance.matrix as m; print(json.dumps(m.available_builtins()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"cannot list the built-in adapters: {proc.stderr.strip()[-2000:]}")
    usable, unavailable = json.loads(proc.stdout.strip().splitlines()[-1])
    return usable, [tuple(u) for u in unavailable]


def certificate_path(out: Path, spec: str) -> Path:
    """Where SPEC's certificate goes: ``DIR/certs/<spec>.json``, the spec made a file name."""
    return out / "certs" / (re.sub(r"[^A-Za-z0-9._-]+", "_", spec).strip("._") + ".json")


def certify_command(spec: str, cert: Path, profile: str | None, extra: list[str], root: Path | None) -> list[str]:
    """The pytest command that certifies SPEC and writes its certificate to ``cert``."""
    # From a checkout, the clause directory by path (collecting the self-tests too only to deselect them
    # costs seconds per adapter); an installed suite's clauses by package.
    cmd = [sys.executable, "-m", "pytest", *(["conformance/clauses"] if root else ["--pyargs", "conformance"])]
    cmd += [f"--impl={spec}", f"--certificate={cert}", "-q", "-p", "no:cacheprovider"]
    if profile:
        cmd.append(f"--conformance-profile={profile}")
    return cmd + list(extra)


def certify(spec: str, out: Path, profile: str | None, extra: list[str], root: Path | None) -> tuple[Path, str]:
    """Run one certification; (certificate path, one line saying how it went). Its output goes to
    ``DIR/certs/<spec>.log``."""
    cert = certificate_path(out, spec).resolve()
    cert.parent.mkdir(parents=True, exist_ok=True)
    cert.unlink(missing_ok=True)
    cmd = certify_command(spec, cert, profile, extra, root)
    start = time.monotonic()
    with cert.with_suffix(".log").open("w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, cwd=root or out, stdout=log, stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - start
    if not cert.is_file():
        return cert, f"{spec}: no certificate written (pytest exit {proc.returncode}; see {cert.with_suffix('.log')})"
    word = json.loads(cert.read_text()).get("adapters", {}).get(spec, {}).get("verdict", "?")
    return cert, f"{spec}: {word} ({took:.0f} s, exit {proc.returncode}) -> {cert}"


def load(paths: list[Path]) -> list[tuple[str, dict]]:
    """(file name, certificate document) for each certificate file."""
    docs = []
    for p in paths:
        try:
            docs.append((str(p), json.loads(Path(p).read_text())))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"cannot read certificate {p}: {exc}") from None
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for matrix.md, matrix.html and certs/")
    parser.add_argument(
        "--impl",
        action="append",
        default=None,
        metavar="SPEC",
        help="certify this adapter (repeatable; default: "
        "every built-in available here, unless --certificates is given)",
    )
    parser.add_argument(
        "--certificates",
        nargs="+",
        type=Path,
        default=[],
        metavar="JSON",
        help="certificates to include as they are (pytest --certificate=...)",
    )
    parser.add_argument("--conformance-profile", default=None, help="hypothesis profile of the certifications")
    parser.add_argument(
        "--pytest-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for every certification's pytest (repeatable)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="certifications run at once (default 1)")
    args = parser.parse_args(argv)
    shown = "python -m conformance.matrix " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))

    from conformance import catalog
    from conformance.harness.records import matrix_html, matrix_markdown
    from conformance.harness.records.matrix_build import build_matrix

    catalog.load()  # the clause registry names each clause's test, for the cells' commands
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    specs, unavailable = args.impl, []
    if specs is None:
        specs, unavailable = ([], []) if args.certificates else probe_builtins()
    root = checkout_root()
    if not specs and not args.certificates:
        parser.error("nothing to draw: no adapter is available here and no --certificates were given")
    paths, problems = [], []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = [(s, pool.submit(certify, s, out, args.conformance_profile, args.pytest_arg, root)) for s in specs]
        for spec, run in runs:
            cert, line = run.result()
            print(line, file=sys.stderr, flush=True)
            (paths.append(cert) if cert.is_file() else problems.append((spec, line.removeprefix(f"{spec}: "))))
    matrix = build_matrix(load(paths + list(args.certificates)), pyargs=root is None)
    matrix.unavailable += unavailable + problems
    (out / "matrix.md").write_text(matrix_markdown.render(matrix, shown), encoding="utf-8")
    shutil.rmtree(out / matrix_markdown.PICTURES, ignore_errors=True)  # no stale picture of a passing cell
    for rel, svg in matrix_markdown.pictures(matrix).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(svg, encoding="utf-8")
    (out / "matrix.html").write_text(matrix_html.render(matrix, shown), encoding="utf-8")
    print(f"matrix written: {out / 'matrix.md'}, {out / 'matrix.html'}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Known bugs of released versions as the suite's proof: reproduce them, certify them, render the table.

    python scripts/known_bugs.py reproduce [--only ID]   # each bug's few lines, in its affected and fixed release
    python scripts/known_bugs.py check --out DIR [-n 2]  # certify both releases; rank and hypothesis of the cause
    python scripts/known_bugs.py render [--results DIR/known-bugs-results.json]   # docs/known-bugs.md

The bugs live in docs/known-bugs.toml (see its header). Both commands make one environment per release
(conformance.sweep.envs: cached, the project's other pins held, torch installed first and alone), so they
download the releases once. ``check`` certifies the adapter on each bug's affected release and first fixed
release (``pytest conformance/clauses --impl=X --certificate=F``, one process each, certificates reused
when present in DIR; each with its expectations file less the causes scoped to that release, so that a
release's bugs are found without the suite being told them), then asks of the affected release's likely
causes: is one of the first two the bug (its features include the entry's ``cause`` and its hint matches
``mechanism``), and of the fixed release's: is none of them. Exit 1 when a bug is missed (a finding about
the suite, to fix there, not a row to drop).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "known-bugs.toml"
PAGE = ROOT / "docs" / "known-bugs.md"
sys.path.insert(0, str(ROOT))

from conformance.harness.cases.features import JOIN
from conformance.harness.causes.likely import features_of
from conformance.harness.causes.text import hint
from conformance.sweep import __main__ as sweep
from conformance.sweep import envs

TOP = 2  # the bug must be among the first TOP likely causes of its affected release


def bugs(path: Path = DATA) -> list[dict]:
    """The entries of docs/known-bugs.toml, checked for the fields the commands read."""
    entries = tomllib.loads(path.read_text(encoding="utf-8"))["bug"]
    need = ("id", "library", "adapter", "what", "affected", "affected_release", "fixed_release", "kind", "link",
            "cause", "mechanism", "reproduce", "affected_shows", "fixed_shows")  # fmt: skip
    for b in entries:
        missing = [k for k in need if k not in b]
        if missing:
            raise SystemExit(f"{path}: bug {b.get('id', '?')}: missing {missing}")
    return entries


def _release(b: dict, which: str) -> envs.Release:
    return envs.Release(b["adapter"], b["library"], b[f"{which}_release"])


def reproduce(entries: list[dict]) -> int:
    bad = 0
    for b in entries:
        for which in ("affected", "fixed"):
            env = envs.ensure(_release(b, which))
            proc = subprocess.run([str(envs.python_of(env)), "-c", b["reproduce"]], capture_output=True, text=True)
            line = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-300:]])[-1]
            ok = b[f"{which}_shows"] in line
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {b['id']} ({which} {b['library']} {b[f'{which}_release']}): {line}")
    return 1 if bad else 0


def _certificate(b: dict, which: str, out: Path, workers: int) -> Path:
    release = _release(b, which)
    tag = "+".join(d.replace("=", "-") for d in b.get("declare", ()))
    cert = sweep.certificate_path(out, release)
    cert = cert.with_name(cert.stem + (f"@{tag}" if tag else "") + ".json").resolve()
    if cert.is_file():
        return cert
    cert.parent.mkdir(parents=True, exist_ok=True)
    env = envs.ensure(release)
    cmd = sweep.certify_command(envs.python_of(env), b["adapter"], cert, workers=workers, profile=None)
    cmd += [f"--declare={d}" for d in b.get("declare", ())]
    blind = _blind_expectations(b["adapter"], b[f"{which}_release"], cert.with_suffix(".expectations.toml"))
    if blind is not None:
        cmd.append(f"--expectations={blind}")
    with cert.with_suffix(".log").open("w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        subprocess.run(cmd, cwd=envs.CHECKOUT, stdout=log, stderr=subprocess.STDOUT, check=False)
    return cert


def _blind_expectations(adapter: str, release: str, path: Path) -> Path | None:
    """The adapter's expectations file without the causes scoped to ``release`` by a ``versions`` range (its
    known bugs): the suite is judged on finding a release's bugs without being told them, knowing only
    the library's lasting behaviour. None when the file scopes nothing to that release (used as it is)."""
    from conformance import releases
    from conformance.harness.records.expectations import default_file

    source = default_file(adapter)
    if source is None:
        return None
    head, *blocks = re.split(r"(?m)^(?=\[\[cause\]\])", source.read_text())
    kept = []
    for block in blocks:
        scoped = re.search(r'(?m)^versions\s*=\s*"([^"]+)"', block)
        if scoped and releases.contains(scoped.group(1), release):
            continue
        kept.append(block)
    if len(kept) == len(blocks):
        return None
    path.write_text(head + "".join(kept))
    return path


def _causes(cert: Path, adapter: str) -> list[dict]:
    if not cert.is_file():
        return []
    a = json.loads(cert.read_text())["adapters"][adapter]
    return (a.get("likely_causes") or {}).get("causes") or []


def found_at(causes: list[dict], b: dict) -> int | None:
    """The 1-based rank of the first cause that is the bug (its features include ``cause``, or are it
    where the entry says ``exact``; its hint matches ``mechanism``), or None."""
    want = set(b["cause"])
    for n, c in enumerate(causes, 1):
        shown = list(c.get("features") or ())
        feats = set(shown) | set(features_of(JOIN.join(shown)))  # with their unions: any "row blocked entirely: ..."
        if (feats == want if b.get("exact") else want <= feats) and re.search(b["mechanism"], hint(c)):
            return n
    return None


def others_before(causes: list[dict], rank: int, b: dict, entries: list[dict], release: str) -> int:
    """How many of the causes ranked above ``rank`` are other listed bugs this release ships (a release
    with three known bugs names the third third: it is judged among the causes the others leave)."""
    from conformance import releases

    mates = [
        o for o in entries if o is not b and o["adapter"] == b["adapter"] and releases.contains(o["affected"], release)
    ]
    return sum(1 for c in causes[: rank - 1] if any(found_at([c], o) for o in mates))


def check(entries: list[dict], out: Path, workers: int, every: list[dict] | None = None) -> int:
    results, bad = [], 0
    for b in entries:
        got = {}
        for which in ("affected", "fixed"):
            cert = _certificate(b, which, out, workers)
            causes = _causes(cert, b["adapter"])
            rank = found_at(causes, b)
            first = causes[rank - 1] if rank else None
            got[which] = {
                "release": b[f"{which}_release"],
                "certificate": str(cert),
                "written": cert.is_file(),
                "rank": rank,
                "past_others": None if rank is None else rank - others_before(
                    causes, rank, b, every or entries, b[f"{which}_release"]),
                "causes": len(causes),
                "cause": None if first is None else " + ".join(first["features"]),
                "hint": None if first is None else hint(first),
            }  # fmt: skip
        ok = got["affected"]["written"] and got["fixed"]["written"]
        ok = ok and got["affected"]["rank"] is not None and got["affected"]["past_others"] <= TOP
        ok = ok and got["fixed"]["rank"] is None
        bad += not ok
        results.append({"id": b["id"], "ok": ok, **got})
        a, f = got["affected"], got["fixed"]
        print(
            f"{'ok ' if ok else 'MISSED'} {b['id']}: {b['library']} {a['release']}: cause "
            f"{a['rank'] or '-'} of {a['causes']}{_past(a)} ({a['cause']}: {a['hint']}); "
            f"{b['library']} {f['release']}: "
            f"{'absent' if f['rank'] is None else 'still cause ' + str(f['rank'])}"
        )
    (out / "known-bugs-results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 1 if bad else 0


def _past(a: dict) -> str:
    return (
        f", {a['past_others']} past the release's other known bugs"
        if a["rank"] and a["past_others"] != a["rank"]
        else ""
    )


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(entries: list[dict], results: dict[str, dict]) -> str:
    out = [
        "# Known bugs of released versions",
        "",
        "Bugs that a release of a built-in adapter's library shipped and a later release fixed, each",
        "reproduced with the library called directly and certified on an affected release and on the",
        "first fixed one. The data: [known-bugs.toml](known-bugs.toml); the commands:",
        "",
        "```bash",
        "python scripts/known_bugs.py reproduce            # each bug's few lines in both releases",
        "python scripts/known_bugs.py check --out out/bugs  # certify both releases, rank the bug's cause",
        "python scripts/known_bugs.py render --results out/bugs/known-bugs-results.json",
        "```",
        "",
        "A bug is *found* when one of the first two likely causes of its affected release has its features",
        "and a hypothesis that says its mechanism (in a release that ships several of the listed bugs, counted",
        "among the causes the others leave), and none of the fixed release's does. Each release is certified",
        "with its adapter's expectations file less the causes scoped to that release (the bugs below): the",
        "suite must find a release's bugs without being told them. Likely causes that no expectation names come",
        "first in every certificate, so a release's new bug is not ranked below a limitation already known.",
        "",
        "| library | what | releases | fixed in | link | certified: likely cause (rank) | fixed release |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in entries:
        r = results.get(b["id"])
        if r:
            a = r["affected"]
            cause = f"{a['rank']}{_past(a)}. {a['cause']}: {a['hint']}" if a["rank"] else "**not found**"
            fixed = "absent" if r["fixed"]["rank"] is None else f"**still cause {r['fixed']['rank']}**"
        else:
            cause, fixed = "not certified", ""
        kind = "" if b["kind"] == "bug" else f" ({b['kind']})"
        out.append(
            f"| {b['library']} ({b['adapter']}) | {_esc(b['what'])}{kind} | {b['affected']} (certified: "
            f"{b['affected_release']}) | {b['fixed_release']} | {b['link']} | {_esc(cause)} | {fixed} |"
        )
    out += ["", "## Reproductions", ""]
    for b in entries:
        out += [f"### {b['id']}", "", f"{b['library']} {b['affected_release']} prints `{b['affected_shows']}`; "
                f"{b['fixed_release']} prints `{b['fixed_shows']}`.", "", "```python", b["reproduce"].strip(), "```",
                ""]  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reproduce")
    r.add_argument("--only", action="append", default=[])
    c = sub.add_parser("check")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("-n", "--workers", type=int, default=1)
    c.add_argument("--only", action="append", default=[])
    p = sub.add_parser("render")
    p.add_argument("--results", type=Path, default=None)
    args = parser.parse_args(argv)
    entries = [b for b in bugs() if not getattr(args, "only", None) or b["id"] in args.only]
    if args.command == "reproduce":
        return reproduce(entries)
    if args.command == "check":
        args.out.mkdir(parents=True, exist_ok=True)
        return check(entries, args.out, args.workers, bugs())
    results = {}
    if args.results is not None:
        results = {r["id"]: r for r in json.loads(args.results.read_text())}
    PAGE.write_text(render(entries, results) + "\n", encoding="utf-8")
    print(PAGE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m conformance.discover --impl=SPEC``: measure a kernel's conventions and print the ``--declare`` line.

SPEC resolves exactly as ``pytest --impl`` does (a built-in name, ``module:attr``, or a plain function
with ``--signature``); ``--declare K=V`` pins fields that are then not probed. Prints one line per field
(field = value: evidence), one line beginning ``--declare`` to paste into ``pytest --impl=SPEC``, and
one ``finding:`` line per behaviour that no field's allowed value describes (harness.discovery.discover).
Exit status: 0 without findings, 1 with findings, 2 for a bad command line, 5 when SPEC cannot run here.
"""

from __future__ import annotations

import argparse
import sys

from conformance.harness.calls import registry, signatures
from conformance.harness.discovery import discover as discovery
from conformance.harness.discovery.witness import DEFAULT_TIMEOUT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.discover",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--impl", required=True, metavar="SPEC", help="the kernel, as for pytest --impl")
    parser.add_argument(
        "--signature", choices=list(signatures.SIGNATURES), default=signatures.DEFAULT, help="as for pytest"
    )
    parser.add_argument("--declare", action="append", default=[], metavar="KEY=VALUE", help="pin a field (not probed)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per probe call")
    args = parser.parse_args(argv)
    try:
        pinned = registry.parse_declare(args.declare)
        found, reason = discovery.discover_spec(args.impl, pinned, args.signature, args.timeout)
    except registry.ImplSpecError as exc:
        parser.error(str(exc))
    if found is None:
        print(f"{args.impl}: cannot run here: {reason}", file=sys.stderr)
        return 5
    for line in found.lines():
        print(line)
    return 1 if found.findings else 0


if __name__ == "__main__":
    sys.exit(main())

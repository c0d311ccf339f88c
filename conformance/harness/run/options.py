"""The suite's command-line options and the ``--impl-list`` listing.

Kept apart from the plugin's hooks so that the options a user types are read in one place; their
names are constants in :mod:`conformance.harness.run.runstate` (``OPT_*``), shared with the sub-plugins.
"""

from __future__ import annotations

import os

import pytest

from conformance.harness.run import runstate


def add_options(parser: pytest.Parser) -> None:
    """The ``sdpa-conformance`` option group (sub-plugins add theirs in their own ``pytest_addoption``)."""
    group = parser.getgroup("sdpa-conformance", "SDPA conformance suite")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        metavar="SPEC",
        help="kernel to certify: a built-in name (numpy, torch-eager, torch-sdpa, jax, ...), "
        "module:attr (adapter object or class), or module:function (torch SDPA signature). "
        "Repeatable or comma-separated. Default: every built-in adapter importable here.",
    )
    group.addoption(
        "--declare",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a declaration field of the kernel under test, e.g. grad=false, "
        "dtypes=float32,float64, all_blocked=nan, causal_alignment=bottom-right. Repeatable.",
    )
    group.addoption(
        "--impl-list", action="store_true", help="list available adapters and their declarations, then exit"
    )
    group.addoption(
        "--conformance-profile",
        choices=runstate.HYPOTHESIS_PROFILES,
        default=os.environ.get("SDPA_CONFORMANCE_PROFILE", "ci"),
        help="hypothesis profile: ci (fast, derandomized) or thorough (many more examples, random seeds)",
    )
    group.addoption(
        "--allow-partial",
        action="store_true",
        default=False,
        help="exit 0 when a run that selected only some clauses (-k, --deselect, a file subset) passed; "
        "the verdict still says PARTIAL, never CONFORMS",
    )
    group.addoption(
        "--call-timeout",
        type=float,
        default=runstate.DEFAULT_CALL_TIMEOUT,
        metavar="SECONDS",
        help="a single kernel call that takes longer fails its clause (0 disables the guard)",
    )
    group.addoption(
        "--discover",
        action="store_true",
        default=False,
        help="probe the --impl kernel's conventions first (python -m conformance.discover) and certify under "
        "what was measured; --declare values are pinned and win; findings are reported, never declared",
    )


def print_impl_list() -> None:
    """``--impl-list``: every adapter known here, whether it can run, and what it declares."""
    from conformance.harness.calls import registry

    for name, target in sorted(registry.known_names().items()):
        try:
            res = registry.resolve(name)
        except registry.ImplSpecError as exc:
            print(f"{name:28s} ERROR {exc}")
            continue
        status = "available" if res.usable else f"unavailable: {res.reason}"
        print(f"{name:28s} {target}  [{status}]")
        if res.adapter is not None:
            for key, value in res.adapter.declaration.as_dict().items():
                print(f"    {key:18s} {value}")

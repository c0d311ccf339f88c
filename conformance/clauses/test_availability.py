"""One line per adapter saying whether it can run here at all (not a clause).

A default run covers every built-in adapter; those that cannot run on this machine (no CUDA
device, framework not installed) are reported here once, with the reason, instead of once per
clause.
"""

from __future__ import annotations

import pytest

from conformance.harness.plugin import availability


def test_adapter_availability(impl_spec, request):
    reason = availability(request.config, impl_spec)
    if reason:
        pytest.skip(f"{impl_spec} is unavailable here: {reason}")


test_adapter_availability.sdpa_availability_check = True

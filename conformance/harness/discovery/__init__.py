"""discovery: measure a kernel's capabilities and conventions on small witnesses.

``discover`` runs the probes (capabilities and limits, conventions, rows blocked entirely,
precision) on witnesses whose candidate conventions differ by O(1) against the float64 oracle,
and says what to declare. ``python -m conformance.discover`` prints it; ``run.discovery_run`` is
``pytest --discover``.

May import: judge (rejections), calls, cases, spec, the oracle and the contract.
"""

"""``python -m conformance.sweep``: certify an adapter on each of several releases of its library, in one
isolated environment per release, and tell what changed between consecutive releases (``__main__``)."""

"""calls: reaching the kernel. Resolving ``--impl``, and every call made to it, guarded.

``registry`` resolves a spec (built-in name, ``module:attr``, entry point; ``signatures`` for
plain functions, ``declare`` for ``--declare``), ``guarded`` checks every call (types, shapes,
aliasing, in-place writes, refusals, under ``call_timeout``), ``probes`` reads attention weights
through the output alone, and ``environment`` says which libraries the kernel came from.

May import: cases (the guarded call counts coverage cells and records a case's features), spec,
the adapters (``implementations``, through the registry), the oracle and the contract.
"""

"""spec: what a clause is, the definitions it rests on, and what it raises when it fails.

``clause`` holds the clause metadata (id, the spec sentence it enforces, the mutants it kills) and
finds the clause modules; ``definitions`` and ``sink_definitions`` quote the documents a clause
cites where the seed does not speak; ``report`` is the one failure format (``ClauseViolation``,
the mismatch report).

May import: the contract only. The bottom floor of the harness: every other room may import it.
"""

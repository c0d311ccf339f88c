"""cases: the inputs a clause feeds a kernel, and the space they are drawn from.

Deterministic builders (``build``), the drawn space (``space``, ``strategies``,
``drawn_arrays``, hypothesis ``profiles``), shape ``buckets`` for kernels that compile per shape,
the coverage cells (``cells``), the features a case exercises (``features``) and the preconditions it
breaks (``preconditions``). The value classes and their covering arrays are ``harness.covering``.

May import: spec, the oracle and the contract. Nothing here calls a kernel or judges an answer.
"""

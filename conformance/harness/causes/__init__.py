"""causes: a failing run's likely causes, many failures told as one cause.

``likely`` groups one adapter's failures by the smallest feature sets that explain them (greedy
set cover against the passing cases), ``record`` is what each clause test records for it,
``conventions`` re-asks the oracle under an alternative convention to see whether a failure
matches it, and ``text`` words the causes. The vocabulary of features itself is
``cases.features``, because the guarded call records it.

May import: judge, calls, cases, spec, the oracle and the contract.
"""

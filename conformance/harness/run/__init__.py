"""run: the pytest run itself, the top floor of the harness.

Holds the plugin's sub-plugins and what they share: the command-line options, the run's state
(``runstate``), the order clause tests run in, how a failure reads and how to reproduce it, the
suite's defence against bad invocations, expectations files applied to outcomes, the coverage and
pair-coverage counters that travel in test reports, ``--discover``, and the assembly of a
certificate, a baseline and the performance profile from what the run saw.

May import: every other room (records, perf, discovery, causes, judge, calls, cases, spec), the
oracle and the contract. Nothing in the harness imports this room except ``harness/plugin.py``, the
pytest entry point, which registers its sub-plugins. The clause modules are found by name at run
time (``spec.clause.load_all``), as pytest collects them, never imported statically.
"""

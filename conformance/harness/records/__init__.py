"""records: what a run leaves behind, as data and as documents.

The verdict rule and the declared deviations it weighs, certificates in Markdown and HTML, the
conformance matrix, regression baselines (their grid, store and comparison), expectations files,
and the shared HTML pieces. Every function here turns records (dicts, dataclasses) into other
records or text; none of them talks to pytest.

May import: perf (its charts and summary lines), discovery, causes, judge, calls, cases, spec,
``conformance.fixtures``, the oracle and the contract. Never run.
"""

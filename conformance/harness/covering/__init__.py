"""covering: the value-class table and the covering arrays built over it, from a declaration alone.

The walk goes down: ``table`` (every parameter of a case, its value classes, the constraints between
them: what a case is, what reaches the kernel and how), ``ranges`` and ``draws`` (the members each class
takes, row by row), ``hiding`` (values that hide others, so a tuple counts only where it can show),
``admission`` (whether a row can be a case for the declaration; which tuples the declaration admits),
``build`` (a row as arrays and a presentation), ``tuples`` (the tuples a row makes and shows), ``array``
(the covering array itself, greedy and deterministic) and ``cache`` (plans kept on disk between runs).
docs/case-space.md is the table in words.

May import: cases, spec, the oracle and the contract. Nothing here calls a kernel or judges an answer.
"""

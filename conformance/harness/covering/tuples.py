"""The t-tuples of a row of value classes, the calls a row makes, and which tuples a case shows.

The vocabulary the generator (``harness.covering.array``) and the coverage tables
(``harness.records.coverage_tables``) share: a tuple is ((parameter, value), ...) in table order,
named ``"heads: 8:1 × mask form: [B,1,T,S]"``; a row makes a forward call and, when its direction is
backward, a backward one too; a tuple counts where no third value hides it (``hiding``).
"""

from __future__ import annotations

import itertools

from conformance.harness.covering import hiding
from conformance.harness.covering.admission import ORDER, Tuple
from conformance.harness.covering.table import DEFAULTS, Call

JOIN = " \u00d7 "  # " × " between the values of a tuple, each "parameter: value"


def name(tup: Tuple) -> str:
    """``"heads: 8:1 × mask form: [B,1,T,S]"``: the tuple as the summary and the certificate show it."""
    return JOIN.join(f"{p}: {v}" for p, v in tup)


def tuples_of(row: dict[str, str], t: int) -> list[Tuple]:
    items = sorted(row.items(), key=lambda kv: ORDER[kv[0]])
    return [tuple(c) for c in itertools.combinations(items, t)]


def records_of(row: dict[str, str]) -> list[tuple[Call, dict[str, str]]]:
    """The calls a row makes, each with its classes: every row forward, a backward row backward too."""
    call = row.get("call", DEFAULTS["call"])
    out = [(Call("forward", call), {**row, "direction": "forward"} if "direction" in row else dict(row))]
    if row.get("direction") == "backward":
        out.append((Call("backward", call, row.get("cotangent", DEFAULTS["cotangent"])), dict(row)))
    return out


def observable_tuples(records, t: int, hidden_of) -> set[Tuple]:
    """The t-tuples of ``records`` ((Call, classes) pairs) that no third value hides."""
    out: set[Tuple] = set()
    for how, classes in records:
        hidden = hidden_of(how, classes)
        out.update(tup for tup in tuples_of(classes, t) if hiding.observable(tup, hidden))
    return out


def observable_in(record: dict[str, str], hidden: hiding.Hidden, t: int) -> list[str]:
    """The names of the t-tuples a case with the value classes ``record`` shows (``hidden``: what is
    hidden in it, ``hiding.in_case``)."""
    return [name(tup) for tup in tuples_of(record, t) if hiding.observable(tup, hidden)]


def reached(record: dict[str, str], t: int) -> list[str]:
    """The names of the t-tuples a case in the value classes ``record`` reaches."""
    return [name(tup) for tup in tuples_of(record, t)]

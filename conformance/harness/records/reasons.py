"""Not-applicable reasons of one clause over its dtypes, said once each.

A clause test is skipped per dtype, each with the reasons of its own skip: "declares alibi=False" in
every dtype, plus "declares dtypes ['float32'], not float16" in each undeclared one. Joined as they
come, a clause's summary repeats the first reason four times and the second three; :func:`merged`
says each reason once and the undeclared dtypes together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_DTYPES_REASON = re.compile(r"^(declares dtypes \[.*\]), not (\w+)$")


def merged(reasons: Iterable[str]) -> str:
    """The distinct parts ("; "-separated) of ``reasons`` in first-seen order, the "declares dtypes
    [...], not X" parts as one ("declares dtypes ['float32'], not float64, float16")."""
    parts: list[str] = []
    missing: dict[str, list[str]] = {}
    for reason in reasons:
        for part in (p.strip() for p in reason.split("; ")):
            m = _DTYPES_REASON.match(part)
            if m:
                if m.group(1) not in missing:
                    parts.append(m.group(1))
                missing.setdefault(m.group(1), [])
                if m.group(2) not in missing[m.group(1)]:
                    missing[m.group(1)].append(m.group(2))
            elif part and part not in parts:
                parts.append(part)
    return "; ".join(f"{p}, not {', '.join(missing[p])}" if p in missing else p for p in parts)

"""Clause metadata: the link from an executable check back to the spec sentence it enforces.

A clause is a plain function ``check(impl, ...)`` decorated with :func:`clause`. The decorator only
records metadata (id, source sentence, what the clause requires of a kernel, and which mutant
kernels it kills) in a global catalog; the pytest plugin turns each clause into tests, the catalog
generator renders it for users, and the self-tests run every clause against every mutant it claims
to kill. Keeping the claims as data is what makes "a clause no mutant can fail" detectable.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

from conformance.contract import DTYPES, Declaration

# The clause modules' package, found by name: the harness never imports a clause module statically
# (clauses sit above the harness), it loads them as pytest collects them (tests/layers.py).
CLAUSE_PACKAGE = "conformance.clauses"

SEEDS = {
    "000": "000_f3dcd408372d9e02.txt",
    "003": "003_648455d5abd16778.txt",
}


SENTENCE_JOINER = " \u2026 "  # " … " between the sentences of a multi-sentence citation


class Quotation:
    """What a seed :class:`Source` and a variant's ``definitions.Definition`` share: ``sentence``, one
    verbatim quote or a tuple of them (a list is frozen into a tuple), shown joined by " … "."""

    sentence: str | tuple[str, ...]

    def _freeze_sentences(self, who: str) -> None:
        if not isinstance(self.sentence, str):
            object.__setattr__(self, "sentence", tuple(self.sentence))
        if not self.sentences or not all(isinstance(s, str) and s.strip() for s in self.sentences):
            raise ValueError(f"{who}: every quoted sentence must be a non-empty str")

    @property
    def sentences(self) -> tuple[str, ...]:
        """The quoted sentences, one or more, each verbatim from its document."""
        return (self.sentence,) if isinstance(self.sentence, str) else tuple(self.sentence)

    @property
    def text(self) -> str:
        """The quotation as shown to people: the sentences joined by " … "."""
        return SENTENCE_JOINER.join(self.sentences)


@dataclass(frozen=True)
class Source(Quotation):
    """Where a clause comes from: a seed article section and the sentence itself (verbatim).

    ``sentence`` is one verbatim quote, or a tuple of quotes from the same section when the clause
    rests on sentences that are not contiguous in the seed (rendered joined by " … "). Each quote
    must occur in the seed, whitespace-normalised, under ``section`` (a heading of the seed, "§N"
    for a numbered one, "§N sub-heading" for a heading inside section N); tests/test_citations.py
    checks that, so a paraphrase cannot pass for a citation.
    """

    seed: str  # "000" or "003", see SEEDS
    section: str
    sentence: str | tuple[str, ...]

    def __post_init__(self) -> None:
        self._freeze_sentences(f"Source({self.seed!r}, {self.section!r})")

    @property
    def file(self) -> str:
        return SEEDS.get(self.seed, self.seed)

    def cite(self) -> str:
        return f"{self.file} {self.section}: \u201c{self.text}\u201d"


@dataclass(frozen=True)
class ClauseInfo:
    id: str
    title: str
    source: Source
    requires: tuple[str, ...]  # Declaration fields that must be truthy for the clause to apply
    dtypes: tuple[str, ...] | None  # parametrise over these dtypes (None: the clause picks)
    kills: tuple[str, ...]  # mutant names, optionally "name@dtype"
    fpr: str | None  # stated false-positive rate for statistical clauses
    tolerance: str | None  # the tolerance rule, in words, when it is not the default one
    func: Callable = field(compare=False, repr=False)

    @property
    def module(self) -> str:
        return self.func.__module__

    def not_applicable_reasons(self, decl: Declaration, dtype: str | None = None) -> list[str]:
        """Why this clause does not apply to a kernel declaring ``decl`` (in ``dtype``); empty when it does.

        The one applicability test, as xformers' operators have ``not_supported_reasons``: the pytest
        fixture and the self-tests' clause runner both ask it, so a clause body need not repeat it.
        Cases a clause builds are checked one by one by ``Declaration.not_supported_reasons``.
        """
        reasons = []
        for req in self.requires:
            key, sep, want = req.partition("=")
            have = getattr(decl, key)
            if sep and str(have) != want:
                reasons.append(f"declares {key}={have}, this clause checks {key}={want}")
            elif not sep and not have:
                reasons.append(f"declares {key}={have}")
        if dtype is not None and dtype not in decl.dtypes:
            reasons.append(f"declares dtypes {sorted(decl.dtypes)}, not {dtype}")
        return reasons


CLAUSES: dict[str, ClauseInfo] = {}
_DECLARATION_FIELDS = frozenset(f.name for f in dataclasses.fields(Declaration))


def clause(
    id: str,
    title: str,
    source: Source,
    *,
    kills: tuple[str, ...] | list[str],
    requires: tuple[str, ...] | list[str] = (),
    dtypes: tuple[str, ...] | list[str] | None = None,
    fpr: str | None = None,
    tolerance: str | None = None,
) -> Callable[[Callable], Callable]:
    """Register ``func`` as clause ``id``. ``kills`` must name at least one mutant."""
    if not kills:
        raise ValueError(f"clause {id} names no mutant that it kills: a clause that cannot fail is a defect")

    unknown = [r for r in requires if r.partition("=")[0] not in _DECLARATION_FIELDS]
    if unknown:
        raise ValueError(
            f"clause {id} requires {unknown}: not Declaration fields ({', '.join(sorted(_DECLARATION_FIELDS))})"
        )

    def register(func: Callable) -> Callable:
        if id in CLAUSES and CLAUSES[id].func.__qualname__ != func.__qualname__:
            raise ValueError(f"duplicate clause id {id}")
        info = ClauseInfo(
            id=id,
            title=title,
            source=source,
            requires=tuple(requires),
            dtypes=None if dtypes is None else tuple(dtypes),
            kills=tuple(kills),
            fpr=fpr,
            tolerance=tolerance,
            func=func,
        )
        CLAUSES[id] = info
        func.clause_info = info  # type: ignore[attr-defined]
        return func

    return register


def info_of(func: Callable) -> ClauseInfo | None:
    func = getattr(func, "hypothesis_inner_test", func)
    while func is not None:
        info = getattr(func, "clause_info", None)
        if info is not None:
            return info
        func = getattr(func, "__wrapped__", None)
    return None


def load_all(package: str = CLAUSE_PACKAGE) -> dict[str, ClauseInfo]:
    """Every clause of the suite: each module of ``package`` imported by name, in name order."""
    pkg = importlib.import_module(package)
    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        importlib.import_module(f"{package}.{mod.name}")
    return CLAUSES


def planned_dtypes() -> dict[str, tuple[str | None, ...]]:
    """Every clause of the suite and the dtypes it runs with: what a full run covers.

    The whole clause package is imported (a run of one file has not imported the others), so that a
    run that selected a subset can say so instead of certifying on what it happened to collect.
    """
    plan = {}
    for cid, info in load_all().items():
        has_dtype = "dtype" in inspect.signature(info.func).parameters
        plan[cid] = tuple(info.dtypes or DTYPES) if has_dtype else (None,)
    return plan

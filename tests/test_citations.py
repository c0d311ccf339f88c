"""Every clause quotes its seed verbatim, under a real heading of that seed.

A clause's authority is the sentence it cites; a paraphrase that reads like the spec but is not in
it would let the suite enforce something the spec never said. The seeds are the two articles in
``shared/seeds`` beside the repository (``<repo>/../shared/seeds``; CI clones the repository next to
a copy of ``shared/``). Matching is whitespace-normalised (runs of whitespace, line breaks included,
count as one space), nothing else: LaTeX, ``$...$`` and full-width punctuation must be as written.

A seed's headings are its stand-alone lines (blank line before and after) of at most 40 characters
that do not end in sentence punctuation and contain no code or formula characters; in
000_f3dcd408372d9e02.txt the numbered ones ("3. 矩阵形式", "7.3 Mask 应加在 softmax 之前") nest by
their numbers, and a "§N" label names section N. A quote must lie inside the span of the section it
names: for a numbered section, up to the next numbered heading of the same or a higher level; for any
other heading, up to the next heading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance import catalog
from conformance.harness.spec.clause import SEEDS, SENTENCE_JOINER, Source

SEEDS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "seeds"
_END_PUNCT = tuple("。．.，,；;：:？?！!）)")
_NOT_HEADING = re.compile(r"[=\\$\[\]{}@#]")
_NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?\s+(\S.*)$")


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class Heading:
    line: int
    text: str  # as written, e.g. "3. 矩阵形式"
    number: str | None  # "3", "7.3", or None for an unnumbered heading
    title: str  # the text without its number


@dataclass(frozen=True)
class Seed:
    lines: tuple[str, ...]
    headings: tuple[Heading, ...]

    def end(self, h: Heading) -> int:
        """The line where section ``h`` ends (exclusive)."""
        for other in self.headings:
            if other.line <= h.line:
                continue
            if h.number is None or (other.number is not None and other.number.count(".") <= h.number.count(".")):
                return other.line
        return len(self.lines)

    def span(self, h: Heading) -> str:
        """The normalised text of section ``h``, its heading line included."""
        return normalise("\n".join(self.lines[h.line : self.end(h)]))


def parse_seed(text: str) -> Seed:
    lines = text.splitlines()
    heads = []
    for i, raw in enumerate(lines):
        line = raw.strip()
        alone = (i == 0 or not lines[i - 1].strip()) and (i == len(lines) - 1 or not lines[i + 1].strip())
        if not line or not alone or len(line) > 40 or line.endswith(_END_PUNCT) or _NOT_HEADING.search(line):
            continue
        m = _NUMBERED.match(line)
        # "7.3 Title" and "7. Title" are numbered; "1 0 0 0" (a matrix row) is not: a top-level number needs its dot.
        if m and ("." in m.group(1) or line.startswith(m.group(1) + ".")):
            heads.append(Heading(i, line, m.group(1), m.group(2).strip()))
        else:
            heads.append(Heading(i, line, None, line))
    return Seed(tuple(lines), tuple(heads))


def resolve_section(seed: Seed, label: str) -> tuple[Heading | None, str]:
    """The heading a section label names, or None and why not."""
    bare = label.removeprefix("§").strip()
    m = re.match(r"^(\d+(?:\.\d+)*)\.?(?:\s+(.*))?$", bare)
    if not m:
        found = [h for h in seed.headings if h.number is None and h.text == bare]
        return (found[0], "") if found else (None, f"no heading {bare!r}")
    number, rest = m.group(1), (m.group(2) or "").strip()
    parent = next((h for h in seed.headings if h.number == number), None)
    if parent is None:
        return None, f"no numbered section {number}"
    if not rest or rest == parent.title:
        return parent, ""
    subs = [h for h in seed.headings if parent.line < h.line < seed.end(parent) and h.text == rest]
    if not subs:
        return None, f"section {number} is {parent.title!r}, and it has no sub-heading {rest!r}"
    return subs[0], ""


def citation_problems(source: Source, seeds: dict[str, Seed]) -> list[str]:
    """Why ``source`` is not a verbatim quote under the heading it names; empty when it is."""
    if source.seed not in seeds:
        return [f"unknown seed {source.seed!r}; known: {', '.join(sorted(seeds))}"]
    seed = seeds[source.seed]
    heading, why = resolve_section(seed, source.section)
    if heading is None:
        return [f"section {source.section!r} is not a heading of {source.file}: {why}"]
    whole = normalise("\n".join(seed.lines))
    span = seed.span(heading)
    problems = []
    for sentence in source.sentences:
        quote = normalise(sentence)
        if quote not in whole:
            problems.append(f"{quote!r} does not occur in {source.file} (whitespace-normalised)")
        elif quote not in span:
            where = [h.text for h in seed.headings if quote in seed.span(h)]
            problems.append(f"{quote!r} is in {source.file}, but not under {source.section!r} (it is under {where})")
    return problems


@pytest.fixture(scope="module")
def seeds() -> dict[str, Seed]:
    if not SEEDS_DIR.is_dir():
        pytest.skip(f"the seed articles are not at {SEEDS_DIR} (expected <repository>/../shared/seeds)")
    missing = [f for f in SEEDS.values() if not (SEEDS_DIR / f).is_file()]
    if missing:
        pytest.skip(f"seed files {missing} are not in {SEEDS_DIR}")
    return {key: parse_seed((SEEDS_DIR / f).read_text(encoding="utf-8")) for key, f in SEEDS.items()}


def test_every_clause_quotes_its_seed_verbatim_under_a_real_heading(seeds):
    bad = {}
    for cid, info in sorted(catalog.load().items()):
        if getattr(info.source, "is_seed", True) is False:
            continue  # a variant's own definition, not the seed: tests/test_definitions.py checks those
        problems = citation_problems(info.source, seeds)
        if problems:
            bad[cid] = problems
    assert not bad, "clauses whose citation is not verbatim in its seed section:\n" + "\n".join(
        f"  {cid}: {p}" for cid, ps in bad.items() for p in ps
    )


def test_every_declared_deviation_quotes_its_seed_verbatim_under_a_real_heading(seeds):
    """The sentences a verdict of CONFORMS AS DECLARED cites (harness.records.deviations) are checked as
    the clauses' are."""
    from conformance.harness.records import deviations

    sources = deviations.sources()
    assert sources
    bad = {s.cite(): problems for s in sources if (problems := citation_problems(s, seeds))}
    assert not bad, "deviation rules whose citation is not verbatim in its seed section:\n" + "\n".join(
        f"  {c}: {p}" for c, ps in bad.items() for p in ps
    )


def test_the_heading_parser_finds_the_articles_sections(seeds):
    """Pinned against the articles themselves, so that a parser that finds nothing cannot pass the test above."""
    numbered = [h.number for h in seeds["000"].headings if h.number]
    assert numbered == ["1", "2", "3", "4", "5", "6", "6.1", "6.2", "7", "7.1", "7.2", "7.3", *"89", "10", "11", "12"]
    titles = {h.text for h in seeds["003"].headings}
    assert {"逐步推导", "Worked Example", "工程实现", "边界与失败方式", "主动回忆", "输入与输出"} <= titles
    assert not any(h.text.startswith(("1 0", "0 ", "Q:", "import")) for s in seeds.values() for h in s.headings)


@pytest.mark.parametrize(
    "source, expect",
    [
        # the old SHAPE-OUT-01 quote: two lines of §4 glued together, with "$T$" written as "T"
        (
            Source(
                "000",
                "§4 完整 Shape 检查",
                "注意力权重最后两维是 Query 长度 × Key 长度；输出长度由 Query 的长度 T 决定。",
            ),
            "does not occur",
        ),
        (Source("000", "§3 矩阵形式", "输出长度由 Query 的长度 $T$ 决定。"), "not under '§3 矩阵形式'"),
        (Source("000", "§4 形状检查", "weights: [B, H, T, S]"), "has no sub-heading"),
        (Source("000", "§13 附录", "weights: [B, H, T, S]"), "no numbered section 13"),
        (Source("003", "结论", "Softmax 沿最后一维 T_k 归一化。"), "no heading '结论'"),
        (
            Source("003", "输入与输出", ("Softmax 沿最后一维 T_k 归一化。", "Softmax 沿最后一维归一化。")),
            "does not occur",
        ),
        (Source("007", "输入与输出", "x"), "unknown seed"),
    ],
)
def test_the_check_fails_on_a_paraphrase_or_a_wrong_section(seeds, source, expect):
    problems = citation_problems(source, seeds)
    assert problems and expect in problems[0], problems


@pytest.mark.parametrize(
    "source",
    [
        Source("000", "§4 完整 Shape 检查", ("output:  [B, H, T, Dv]", "输出长度由 Query 的长度 $T$ 决定。")),
        Source("000", "§12 误区二：softmax 对错维度", "应该沿 Key 维度，也就是分数张量的最后一维做 softmax。"),
        Source("000", "§12 常见误区与代码错误", "只有 $T=S$ 时才是方阵。"),  # under 误区三, inside §12
        Source(
            "000", "§7.3 Mask 应加在 softmax 之前", "QK^T / sqrt(dk)\n→  加 Mask → softmax"
        ),  # whitespace-normalised
        Source("003", "Worked Example", "两个未缩放点积都为 1，缩放后都为 1/√2。"),
    ],
)
def test_the_check_accepts_verbatim_quotes(seeds, source):
    assert citation_problems(source, seeds) == []


def test_a_source_can_cite_several_sentences_of_one_section():
    one = Source("003", "输入与输出", "Softmax 沿最后一维 T_k 归一化。")
    assert one.sentences == ("Softmax 沿最后一维 T_k 归一化。",)
    assert one.cite() == "003_648455d5abd16778.txt 输入与输出: \u201cSoftmax 沿最后一维 T_k 归一化。\u201d"
    two = Source("003", "输入与输出", ["QKᵀ 得到 [B,h,T_q,T_k]。", "Softmax 沿最后一维 T_k 归一化。"])
    assert two.sentences == ("QKᵀ 得到 [B,h,T_q,T_k]。", "Softmax 沿最后一维 T_k 归一化。")
    assert two.text == "QKᵀ 得到 [B,h,T_q,T_k]。" + SENTENCE_JOINER + "Softmax 沿最后一维 T_k 归一化。"
    assert two.text in two.cite() and " \u2026 " in two.cite()
    hash(two)  # still a frozen, hashable dataclass
    with pytest.raises(ValueError):
        Source("003", "输入与输出", ())
    with pytest.raises(ValueError):
        Source("003", "输入与输出", ("ok", " "))

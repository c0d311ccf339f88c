"""Programs: the structures a kernel was given and its first calls (``harness.calls.programs``,
``harness.run.programs``), and discovery's ``compiles_per_shape`` probe (``harness.discovery.compiling``).

A compiling kernel's certification cost is its number of distinct structures; the count must be the
one a compiler sees (shapes, strides, dtypes, scalar arguments: two calls that differ in values only
share a program), must reach the summary and the certificate, and the probe that sets the field must
follow its rule. The probe's rule is tested on scripted times, not on a clock (a busy machine's
clock proves nothing either way).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conformance.harness.calls import programs
from conformance.harness.cases.build import random_case
from conformance.harness.discovery import compiling
from conformance.harness.discovery import discover as discovery
from conformance.harness.discovery.witness import Outcome

pytest_plugins = ["pytester"]


def test_a_structure_is_what_a_compiler_keys_on():
    a = random_case(1, B=2, Hq=2, T=3, S=5, Dk=8, dtype="float32")
    key = programs.structure(a, "forward")
    assert programs.structure(random_case(2, B=2, Hq=2, T=3, S=5, Dk=8, dtype="float32"), "forward") == key
    others = [
        programs.structure(a, "vjp"),
        programs.structure(a.replace(scale=0.5), "forward"),
        programs.structure(a.replace(is_causal=True), "forward"),
        programs.structure(a.replace(mask=np.zeros((3, 5), bool)), "forward"),
        programs.structure(a.replace(mask=np.zeros((2, 1, 3, 5), bool)), "forward"),
        programs.structure(a.replace(query=np.asfortranarray(a.query)), "forward"),  # strides
        programs.structure(random_case(1, B=2, Hq=2, T=4, S=5, Dk=8, dtype="float32"), "forward"),
        programs.structure(random_case(1, B=2, Hq=2, T=3, S=5, Dk=8, dtype="float16"), "forward"),
        programs.structure(a.replace(window=(2, 0)), "forward"),
    ]
    assert len({key, *others}) == len(others) + 1


def test_the_log_counts_first_calls_per_process_and_hands_them_out_once():
    log = programs.ProgramLog()
    log.note("a", 2.0)
    log.note("a", 0.5)
    log.note("b", 1.0)
    first = log.take()
    assert first == {"new": ["a", "b"], "calls": 3, "first_s": 3.0, "all_s": 3.5}
    assert log.take() is None
    log.note("a", 0.25)  # seen in this process already: not a first call
    assert log.take() == {"new": [], "calls": 1, "first_s": 0.0, "all_s": 0.25}
    with pytest.raises(ZeroDivisionError):
        log.call(random_case(1), "forward", lambda: 1 / 0)
    assert log.take()["new"] == [programs.structure(random_case(1), "forward")]  # a raising call is noted too


def test_the_summary_of_several_processes():
    entry = {"keys": {"forward x", "forward y", "vjp x"}, "first_calls": 5, "calls": 40, "first_s": 9.0, "all_s": 12.0}
    rec = programs.summarize(entry)
    assert (rec["distinct"], rec["forward"], rec["backward"], rec["first_calls"]) == (3, 2, 1, 5)
    assert rec["first_share"] == 0.75
    text = programs.sentence(rec, True)
    assert text.startswith("Declares compiles_per_shape") and "3 distinct structures" in text and "75 %" in text


def _scripted(monkeypatch, times: list[float]) -> None:
    """The probe's calls take ``times`` seconds, in order (three calls per shape)."""
    it = iter(times)
    monkeypatch.setattr(compiling, "_timed", lambda p, case: (Outcome(value=np.zeros(case.out_shape)), next(it)))


@pytest.mark.parametrize(
    "times,expected",
    [
        ([0.6, 0.002, 0.001] * 3, True),  # every first call a compilation
        ([0.002, 0.001, 0.002] * 3, False),  # no difference
        ([0.6, 0.002, 0.001, 0.6, 0.002, 0.001, 0.003, 0.002, 0.002], False),  # one shape fast: not every one
        ([0.06, 0.02, 0.02] * 3, False),  # slower, but by less than 5x
        ([0.03, 0.001, 0.001] * 3, False),  # 30x, but 29 ms more: below MIN_EXTRA
        ([0.6, 0.5, 0.002] * 3, True),  # one repeat held up by the machine: the faster repeat counts
    ],
)
def test_the_compiling_probe_follows_its_rule(monkeypatch, times, expected):
    from tests.mutants import BaseKernel

    _scripted(monkeypatch, times)
    p = discovery.Probing(BaseKernel(), BaseKernel().declaration, {})
    compiling.compiles_per_shape(p)
    (m,) = p.measured
    assert m.field == "compiles_per_shape" and m.value is expected, m
    assert p.decl.compiles_per_shape is expected


def test_the_compiling_probe_keeps_a_pinned_value(monkeypatch):
    from tests.mutants import BaseKernel

    _scripted(monkeypatch, [])
    p = discovery.Probing(BaseKernel(), BaseKernel().declaration, {"compiles_per_shape": True})
    compiling.compiles_per_shape(p)
    assert p.measured[0].evidence.startswith("pinned")


def test_the_summary_and_the_certificate_report_programs(pytester, tmp_path, restore_hypothesis_profile):
    """A kernel declaring compiles_per_shape gets a programs line in the summary and a section in the
    certificate; the count is the distinct structures of the run, which the clauses' shapes decide."""
    from pathlib import Path

    import conformance

    clauses = Path(conformance.__file__).parent / "clauses" / "test_shapes.py"
    cert = tmp_path / "cert.json"
    args = [str(clauses), "--impl=numpy", "--allow-partial", "-p", "no:cacheprovider"]
    res = pytester.runpytest_inprocess(*args, "--declare", "compiles_per_shape=true", f"--certificate={cert}")
    out = res.stdout.str()
    assert res.ret == 0, out[-3000:]
    assert "sdpa-conformance programs" in out and "numpy (compiles_per_shape):" in out
    rec = json.loads(cert.read_text())["adapters"]["numpy"]["programs"]
    assert rec["distinct"] >= 1 and rec["calls"] >= rec["distinct"] and rec["first_calls"] == rec["distinct"]
    assert "## Programs" in cert.with_suffix(".md").read_text()
    plain = pytester.runpytest_inprocess(*args)
    assert "sdpa-conformance programs" not in plain.stdout.str()  # numpy compiles nothing: no line, no hint


def test_the_summary_hints_at_the_declaration_only_when_first_calls_are_many_times_slower():
    from conformance.contract import Declaration
    from conformance.harness.run.programs import _summary_lines

    def entry(first_calls, first_s, repeats, repeat_s):
        keys = {f"forward {i}" for i in range(first_calls)}
        return {"keys": keys, "first_calls": first_calls, "calls": first_calls + repeats, "first_s": first_s,
                "all_s": first_s + repeat_s}  # fmt: skip

    plain = Declaration()
    compiling = entry(100, 50.0, 300, 0.3)  # 0.5 s against 1 ms
    assert "--declare compiles_per_shape=true" in _summary_lines("k", plain, compiling)[0]
    assert _summary_lines("k", plain, entry(100, 0.1, 300, 0.3)) == []  # 1 ms both: most calls first, no hint
    assert _summary_lines("k", plain, entry(100, 50.0, 5, 0.005)) == []  # too few repeats to compare
    declared = _summary_lines("k", plain.replace(compiles_per_shape=True), entry(3, 1.0, 0, 0.0))
    assert declared[0].startswith("k (compiles_per_shape): 3 distinct structures")  # declared: always a line

"""The release sweep: the plan, the environments' requirements and the report built from certificates.

No environment is made here (that downloads releases): the plan and the pins held are checked as data,
and the report on hand-made certificates of three releases, one with a regression, one a fix and a
convention change, as a sweep over real releases writes them (docs/releases.md shows one)."""

from __future__ import annotations

import json

import pytest

from conformance.harness.records import sweep_report
from conformance.sweep import __main__ as sweep
from conformance.sweep import envs


def test_a_release_is_certified_with_the_other_pins_held_and_torch_alone_first():
    torch, others, held = envs.requirements(envs.Release("keras-torch", "keras", "3.13.0"), {"keras": "3.15.1",
                                            "torch": "2.13.0", "jax": "0.10.2", "jaxlib": "0.10.2"})  # fmt: skip
    assert torch == "torch==2.13.0" and "keras==3.13.0" in others and "torch" not in " ".join(others)
    assert held == ["jax==0.10.2", "jaxlib==0.10.2"]  # keras's pin lifted, torch installed apart
    _, others, held = envs.requirements(envs.Release("jax", "jax", "0.8.1"), {"jax": "0.10.2", "jaxlib": "0.10.2"})
    assert "jax==0.8.1" in others and held == []  # jaxlib moves with jax


def test_the_plan_pairs_each_adapter_with_the_releases_of_its_libraries():
    found = sweep.plan(["keras-torch", "jax"], sweep._versions(["keras==3.13.0,3.14.1", "jax==0.10.0"]))
    assert [(r.impl, r.label) for r in found] == [
        ("keras-torch", "keras 3.13.0"), ("keras-torch", "keras 3.14.1"), ("jax", "jax 0.10.0"),
    ]  # fmt: skip
    with pytest.raises(envs.SweepError, match="uses none of onnxruntime"):
        sweep.plan(["jax"], sweep._versions(["onnxruntime==1.27.0"]))
    with pytest.raises(envs.SweepError, match="write DIST==V1,V2"):
        sweep._versions(["keras 3.13.0"])


def _cert(version: str, outcomes: dict[str, str], *, all_blocked: str = "zeros", matched: bool = False) -> dict:
    entries = [{"behaviour": "is_causal dropped with a mask", "status": "matched" if matched else "other releases"}]
    return {
        "adapters": {
            "k": {
                "verdict": "DOES NOT CONFORM" if "fail" in outcomes.values() else "CONFORMS",
                "coverage": {"summary": "..."},
                "clauses": {c: {"outcome": o} for c, o in outcomes.items()},
                "declaration": {"all_blocked": all_blocked},
                "environment": {"measured_with": {"lib": "1.2"}, "libraries": {"lib": version}},
                "expectations": {"entries": entries},
                "likely_causes": {"causes": []},
            }
        }
    }


def test_the_report_tells_regressions_fixes_and_convention_changes(tmp_path):
    certs = {
        "1.10.0": _cert("1.10.0", {"A": "pass", "B": "fail"}, matched=True),
        "1.2.0": _cert("1.2.0", {"A": "pass", "B": "pass"}),
        "1.9.0": _cert("1.9.0", {"A": "fail", "B": "expected failure"}, all_blocked="mean-v", matched=True),
    }
    paths = []
    for v, doc in certs.items():  # written out of order: the report orders by release, 1.10 after 1.9
        paths.append(tmp_path / f"{v}.json")
        paths[-1].write_text(json.dumps(doc))
    text = sweep.write_report(paths, tmp_path / "out", "cmd").read_text()
    assert text.index("lib 1.2.0") < text.index("lib 1.9.0") < text.index("lib 1.10.0")
    first = text[text.index("### lib 1.2.0 -> lib 1.9.0") : text.index("### lib 1.9.0 -> lib 1.10.0")]
    assert "- regression: A: passed in lib 1.2.0, fails in lib 1.9.0" in first
    assert "- regression: known cause fails from lib 1.9.0 on: is_causal dropped with a mask" in first
    assert "- convention change: declares all_blocked=mean-v from lib 1.9.0 (was zeros)" in first
    second = text[text.index("### lib 1.9.0 -> lib 1.10.0") :]
    assert "- fix: A: failed in lib 1.9.0, passes in lib 1.10.0" in second
    assert "- regression: B: failed only as a known cause in lib 1.9.0, fails in lib 1.10.0" in second
    assert "| A | pass | **FAIL** | pass |" in text


def test_a_certificate_that_cannot_be_read_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(envs.SweepError, match="cannot read certificate .*bad.json"):
        sweep.write_report([bad], tmp_path, "cmd")
    assert sweep_report.columns([]) == {}

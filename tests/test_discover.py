"""Self-tests of discovery (harness/discovery*.py, ``python -m conformance.discover``, ``pytest --discover``).

(a) On the built-ins, discovery measures what their hand-written declarations say (numpy: the spec's
conventions; torch-eager: the article's, no GQA / custom scale / float mask; torch-sdpa; jax: mean of V
on boolean all-blocked rows, NaN on -inf rows, float64 computed in float32), with no finding. (b) On
the self-test kernels of tests/discovery_kernels.py, each with one convention, it finds that
convention, and reports the behaviours no field allows as findings without declaring them. (c)
``pytest --discover`` gives numpy and jax the verdict line their hand-written declarations give (on
ALL-BLOCKED-02, which follows the declared policy; (a) compares every other field), with the summary
and the certificate saying so, and a finding kernel fails the clause its finding predicts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conformance.harness.calls import registry
from conformance.harness.discovery import discover as discovery
from conformance.harness.run import discovery_run, runstate
from tests import discovery_kernels

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("restore_hypothesis_profile")

CLAUSES = Path(__file__).resolve().parents[1] / "conformance" / "clauses"
KERNELS = "tests.discovery_kernels"

# Every field the issues ask discovery to cover (upcast is a note: the formulations say what happens instead).
COVERED = (
    "rejects_with dtypes float32_computed_as grad dropout gqa custom_scale bool_mask mask_sense float_mask causal "
    "causal_alignment causal_with_mask all_blocked all_blocked_float_mask float64_computed_as bfloat16_computed_as "
    "float16_computed_as scale_applied blocked_fill normwise_merges upcast max_head_dim requires_dk_eq_dv "
    "deterministic layout_invariant validates_inputs batch_invariant compiles_per_shape"
).split()

BUILTINS = {"numpy": "numpy", "torch-eager": "torch", "torch-sdpa": "torch", "jax": "jax"}
# jax compiles each witness's structure (about 40 s of a cold run's self-tests for the two tests below):
# its discovery runs where the compiled kernels' heavy checks run, `tox -e jax` (SDPA_CONFORMANCE_COMPILED=1).
_JAX = pytest.param(
    "jax",
    marks=pytest.mark.skipif(
        os.environ.get("SDPA_CONFORMANCE_COMPILED") != "1",
        reason="jax's discovery compiles a program per witness: SDPA_CONFORMANCE_COMPILED=1 (tox -e jax)",
    ),
)
# Fields each built-in's discovery must have *measured* (not kept for want of a witness), with the value.
MEASURED = {
    "numpy": {"all_blocked": "zeros", "causal_alignment": "top-left", "float64_computed_as": "float64", "gqa": "true"},
    "torch-eager": {"gqa": "false", "custom_scale": "false", "float_mask": "false", "all_blocked": "zeros"},
    "torch-sdpa": {
        "all_blocked": "zeros",
        "all_blocked_float_mask": "none",
        "causal_alignment": "top-left",
        "compiles_per_shape": "false",
    },
    "jax": {
        "all_blocked": "mean-v",
        "all_blocked_float_mask": "nan",
        "float64_computed_as": "float32",
        "requires_dk_eq_dv": "true",
        "dropout": "false",
    },
}

_FOUND: dict[str, discovery.Discovery] = {}


def _discover(spec: str, pinned: dict | None = None, timeout: float | None = None) -> discovery.Discovery:
    key = f"{spec} {pinned} {timeout}"
    if key not in _FOUND:
        found, reason = discovery.discover_spec(spec, pinned, timeout=timeout)
        if found is None:
            pytest.skip(f"{spec} cannot run here: {reason}")
        _FOUND[key] = found
    return _FOUND[key]


def _expected_causes(spec: str) -> list:
    from conformance.harness.records import expectations

    path = Path(__file__).resolve().parents[1] / "implementations" / "expectations" / f"{spec}.toml"
    return expectations.load(path) if path.exists() else []


def _by_field(found: discovery.Discovery) -> dict[str, discovery.Measured]:
    return {m.field: m for m in found.measured}


# -- (a) the built-ins -----------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [s if s != "jax" else _JAX for s in BUILTINS])
def test_discovery_reproduces_the_builtin_declaration(spec):
    pytest.importorskip(BUILTINS[spec])
    found = _discover(spec)
    declared = registry.resolve(spec).adapter.declaration
    measured = _by_field(found)
    assert set(COVERED) <= set(measured), sorted(set(COVERED) - set(measured))
    assert found.findings == [], found.findings
    # an invalid input the built-in answers by a known bug is an expectations cause, not a declaration
    known = {
        f.split(": ", 1)[1] for e in _expected_causes(spec) for s in e.when for f in s if f.startswith("bad input: ")
    }
    for m in found.measured:
        if m.declared and m.field == "accepts_invalid":
            extra = set(m.value) - set(declared.accepts_invalid)
            assert extra <= known and set(declared.accepts_invalid) <= set(m.value), (m.value, known)
        elif m.declared:
            want = discovery.declare_value(getattr(declared, m.field))
            assert discovery.declare_value(m.value) == want, f"{m.field}: measured {m.value!r}, declared {want}"
    changes = dict(found.changes())
    changes.pop("accepts_invalid", None)  # checked just above
    assert changes == {}, found.declare_line()
    for name, value in MEASURED[spec].items():
        m = measured[name]
        assert discovery.declare_value(m.value) == value and not m.evidence.startswith(("kept", "not measured")), m
    assert measured["upcast"].value == "yes", measured["upcast"]


# -- (b) one convention per self-test kernel --------------------------------------------------------
@pytest.mark.parametrize("name", list(discovery_kernels.EXPECTED))
def test_discovery_finds_the_one_convention_of_each_kernel(name):
    pytest.importorskip("torch")
    changes, finding = discovery_kernels.EXPECTED[name]
    found = _discover(f"{KERNELS}:{name}")
    got = {k: discovery.declare_value(v) for k, v in found.changes().items()}
    assert got == changes, "\n".join(found.lines())
    if finding is None:
        assert found.findings == [], found.findings
    else:
        assert any(f.startswith(finding) for f in found.findings), found.findings
    if changes:
        assert found.declare_line() == " ".join(f"--declare {k}={v}" for k, v in changes.items())


def test_a_finding_is_not_declared_away():
    """The ignoring kernel passes when folded (causal_with_mask=false); discovery must not say so."""
    pytest.importorskip("torch")
    found = _discover(f"{KERNELS}:ignores_causal_with_mask")
    assert found.declaration.causal_with_mask is None
    assert _by_field(found)["causal_with_mask"].evidence.startswith("kept")


def test_pinned_fields_are_not_probed():
    pytest.importorskip("torch")
    found = _discover(f"{KERNELS}:bottom_right", {"causal_alignment": "top-left"})
    m = _by_field(found)["causal_alignment"]
    assert m.value == "top-left" and "pinned by --declare" in m.evidence
    assert found.changes() == {"causal_alignment": "top-left", "batch_invariant": True}  # measured, not pinned


def test_a_probe_that_raises_or_hangs_is_evidence():
    """A rejection (a declared class: RuntimeError) rules a feature out; a hang is a crash: the feature is
    kept as declared, a finding says so, and the clauses that use it run (and fail on the hang)."""
    pytest.importorskip("torch")
    broken = _discover(f"{KERNELS}:raises_always")
    dtypes = _by_field(broken)["dtypes"]
    assert "raised RuntimeError: no kernel image" in dtypes.evidence and not dtypes.value, dtypes
    assert broken.findings == ["no dtype ran: nothing else could be probed"]
    hung = _discover(f"{KERNELS}:hangs_on_causal", timeout=0.5)
    causal = _by_field(hung)["causal"]
    assert causal.value is True and "did not return within 0.5 s" in causal.evidence, causal
    crash = "is_causal, T=S=4: did not return within 0.5 s: a crash"
    assert any(f.startswith(crash) for f in hung.findings), hung.findings
    assert _by_field(hung)["all_blocked"].value == "zeros"  # the other probes went on


def test_the_command_line(capsys):
    from conformance import discover

    pytest.importorskip("torch")
    assert discover.main(["--impl=numpy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("discovery of numpy") and lines[-1] == "findings: none"
    assert [ln.split(" = ")[0] for ln in lines[1:-2]] == COVERED
    assert lines[-2].startswith("--declare")
    assert discover.main([f"--impl={KERNELS}:ignores_causal_with_mask"]) == 1
    assert "finding: ignores is_causal when a mask is given" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        discover.main(["--impl=no-such-kernel"])
    assert exc.value.code == 2


# -- (c) pytest --discover --------------------------------------------------------------------------
def _verdict_line(result, spec: str) -> str:
    return next((ln for ln in result.outlines if ln.startswith(f"{spec}: ")), "no verdict line")


@pytest.mark.parametrize("spec", ["numpy", _JAX])
def test_the_discovered_declaration_gives_the_declared_verdict(pytester, tmp_path, spec):
    """The same clauses (ALL-BLOCKED-02, whose oracle follows the all-blocked policy: mean of V for jax)
    under the hand-written and under the discovered declaration: the same verdict line; the summary and
    the certificate say which declaration the second run certified under."""
    pytest.importorskip(BUILTINS[spec])
    args = [str(CLAUSES / "test_masks.py"), "-k", "all_blocked_rows", f"--impl={spec}", "--allow-partial"]
    declared = pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider")
    cert = tmp_path / "cert.json"
    found = pytester.runpytest_inprocess(*args, "--discover", f"--certificate={cert}", "-p", "no:cacheprovider")
    out = found.stdout.str()
    assert declared.ret == found.ret == 0, out[-3000:]
    assert _verdict_line(found, spec) == _verdict_line(declared, spec) != "no verdict line", out[-3000:]
    assert "certified under a discovered declaration (--discover): the adapter's own declaration" in out
    entry = json.loads(cert.read_text())["adapters"][spec]["discovery"]
    assert entry["declare"] == [] and entry["findings"] == []
    assert [m["field"] for m in entry["measured"]] == COVERED
    assert "## Discovered declaration" in cert.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    "name,selection,clause",
    [
        (
            "ignores_causal_with_mask",
            ["test_combinations.py", "-k", "causal_with_mask_arguments"],
            "CAUSAL-WITH-MASK-ARGS-05",
        ),
        ("nan_some_rows", ["test_masks.py", "-k", "all_blocked_rows"], "ALL-BLOCKED-02"),
        (
            "asserts_causal_with_mask",
            ["test_combinations.py", "-k", "causal_with_mask_arguments"],
            "CAUSAL-WITH-MASK-ARGS-05",
        ),
    ],
)
def test_a_finding_kernel_fails_certification_under_discover(pytester, name, selection, clause):
    pytest.importorskip("torch")
    path, *rest = selection
    result = pytester.runpytest_inprocess(
        str(CLAUSES / path),
        *rest,
        f"--impl={KERNELS}:{name}",
        "--discover",
        "--allow-partial",
        "-p",
        "no:cacheprovider",
    )
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    assert f"{clause} [{KERNELS}:{name}]" in out and "discovery finding: " in out, out[-3000:]


def test_discover_needs_impl(pytester):
    result = pytester.runpytest_inprocess(
        str(CLAUSES / "test_worked_example.py"), "--discover", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any("--discover needs --impl" in ln for ln in result.errlines), result.errlines


class _Config:
    """What discovery_run reads of a pytest config: the stash and, in an xdist worker, workerinput."""

    def __init__(self, workerinput: dict | None = None):
        self.stash = pytest.Stash()
        if workerinput is not None:
            self.workerinput = workerinput


def test_xdist_workers_apply_the_controllers_discovery(monkeypatch):
    """The controller discovers once and hands the record over; a worker applies it and probes nothing."""
    state = runstate.State(["numpy"], True, [], {}, 120.0, "ci")
    state._resolved = {"numpy": registry.resolve("numpy")}
    record = {"spec": "numpy", "declare": ["causal_alignment=bottom-right"], "measured": [], "findings": ["x"]}
    controller = _Config()
    controller.stash[runstate.STATE_KEY] = runstate.State(
        ["numpy"], True, [], {}, 120.0, "ci", discovered={"numpy": record}
    )

    class Node:
        workerinput: dict = {}

    discovery_run.to_worker(Node, controller)
    worker = _Config(Node.workerinput)
    monkeypatch.setattr(discovery, "discover", lambda *a, **k: pytest.fail("a worker must not run discovery again"))
    discovery_run.apply(worker, state, {}, "sdpa")
    assert state.resolved["numpy"].adapter.declaration.causal_alignment == "bottom-right"
    assert state.discovered["numpy"] is record

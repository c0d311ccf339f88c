"""scripts/hosts.py: the named dispatch settings, their environment, what a run under them reports.

The probes that decide whether a setting is accepted run real child processes; only NumPy's (about a
second) is exercised here, where NumPy's BLAS is an OpenBLAS built for every x86 core.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("hosts", ROOT / "scripts" / "hosts.py")
hosts = importlib.util.module_from_spec(_spec)
sys.modules["hosts"] = hosts  # dataclasses resolve their module by name
_spec.loader.exec_module(hosts)


def _dynamic_openblas() -> bool:
    import numpy

    blas = numpy.__config__.CONFIG["Build Dependencies"]["blas"]
    return platform.machine() == "x86_64" and "openblas" in blas["name"] and "DYNAMIC_ARCH" in str(blas)


def _cpu_flags() -> set[str]:
    info = Path("/proc/cpuinfo")
    line = next((ln for ln in info.read_text().splitlines() if ln.startswith("flags")), "") if info.exists() else ""
    return set(line.partition(":")[2].split())


def test_a_setting_sets_its_variables_and_adds_to_xla_flags():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "OPENBLAS_CORETYPE": "Haswell", "PATH": "/bin"}
    env = hosts.child_env(hosts.SETTINGS["no-avx"], base)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_cpu_max_isa=SSE4_2"
    assert env["OPENBLAS_CORETYPE"] == "Nehalem" and env["ATEN_CPU_CAPABILITY"] == "default"
    assert env["PATH"] == "/bin" and base["OPENBLAS_CORETYPE"] == "Haswell"  # the caller's mapping untouched
    assert hosts.child_env(hosts.SETTINGS["default"], base) == base


def test_every_setting_expects_only_what_its_probes_report():
    facts = {
        "torch": {"torch.capability", "torch.onednn_isa", "torch.mkl_cnr"},
        "numpy": {"numpy.openblas_core"},
        "jax": {"jax.xla_isa"},
    }
    for setting in hosts.SETTINGS.values():
        reported = set().union(*(facts[lib] for lib in setting.libraries()))
        assert set(setting.expect) <= reported, setting.name
        assert setting.name == "default" or setting.env, setting.name


def test_the_instruction_set_is_read_from_the_compiled_code():
    def asm(*lines):
        return "".join(f"  {10 + n:x}:\t{ln}\n" for n, ln in enumerate(lines))

    sse = asm("movups (%rdi),%xmm0", "mulps  %xmm1,%xmm0", "pxor   %xmm2,%xmm2")
    assert hosts.xla_isa(sse) == "sse"
    assert hosts.xla_isa(sse + asm("vpxor  %xmm1,%xmm1,%xmm1", "vmulps %ymm1,%ymm0,%ymm0")) == "avx"
    assert hosts.xla_isa(sse + asm("vpermilps $0x1b,%ymm0,%ymm1")) == "avx"  # a vp-named AVX instruction
    assert hosts.xla_isa(sse + asm("vpslld $0x2,%ymm0,%ymm0")) == "avx2"
    assert hosts.xla_isa(sse + asm("vaddps %zmm1,%zmm0,%zmm0")) == "avx512"
    assert hosts.xla_isa("") == "none"


def test_the_closing_line_and_the_verdicts_are_read_from_a_run():
    out = (
        "....s.x\n"
        "=========== sdpa-conformance summary ===========\n"
        "numpy: CONFORMS: 92/123 clauses passed; 2019 cases run (ci profile)\n"
        "torch-sdpa: DEVIATES AS EXPECTED: 110/146 clauses passed, 5 expected failures\n"
        "    not in this profile: BACKEND-01\n"
        "torch-sdpa: refuses 10 of 14 invalid inputs\n"
        "==== 421 passed, 158 skipped, 1 deselected in 40.48s ====\n"
    )
    assert hosts.closing_line(out) == "421 passed, 158 skipped, 1 deselected in 40.48s"
    assert hosts.verdict_lines(out) == [
        "numpy: CONFORMS: 92/123 clauses passed; 2019 cases run (ci profile)",
        "torch-sdpa: DEVIATES AS EXPECTED: 110/146 clauses passed, 5 expected failures",
    ]
    assert hosts.closing_line("ERROR: file not found\n") == ""


def test_run_passes_the_setting_and_reports_each_one(capsys):
    code = (
        "import os; print(os.environ.get('OPENBLAS_CORETYPE'), os.environ.get('ATEN_CPU_CAPABILITY'));"
        "print('k: CONFORMS: 1/1 clauses passed'); print('== 3 passed in 0.10s ==')"
    )
    names = ["--setting", "openblas-sandybridge", "--setting", "torch-default-isa"]
    rc = hosts.main(["run", *names, "--no-check", "--", sys.executable, "-c", code])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Sandybridge None" in out and "None default" in out  # each run under its own setting only
    assert "openblas-sandybridge: rc=0: 3 passed in 0.10s" in out
    assert "verdicts agree across 2 settings" in out


def test_run_says_when_the_verdicts_differ(capsys):
    code = "import os; print('k: CONFORMS' if os.environ.get('OPENBLAS_CORETYPE') else 'k: DOES NOT CONFORM')"
    names = ["--setting", "default", "--setting", "openblas-nehalem"]
    rc = hosts.main(["run", *names, "--no-check", "--quiet", "--", sys.executable, "-c", code])
    out = capsys.readouterr().out
    assert rc == 1 and "verdicts DIFFER across 2 settings" in out


@pytest.mark.skipif(not _dynamic_openblas(), reason="NumPy's BLAS here is not an OpenBLAS built for every x86 core")
def test_an_openblas_setting_is_accepted_as_the_core_it_names():
    ok, why, facts = hosts.check(hosts.SETTINGS["openblas-sandybridge"])
    assert ok, why
    assert facts["numpy.openblas_core"] == "Sandybridge"


@pytest.mark.skipif(not _dynamic_openblas(), reason="NumPy's BLAS here is not an OpenBLAS built for every x86 core")
@pytest.mark.skipif("avx512f" in _cpu_flags(), reason="this CPU has AVX-512: the SkylakeX kernels run")
def test_a_setting_that_needs_instructions_this_cpu_lacks_is_refused():
    ok, why, _ = hosts.check(hosts.SETTINGS["openblas-skylakex"])
    assert not ok and "SIGILL" in why, why


def test_a_library_not_installed_leaves_its_part_of_a_setting_moot(monkeypatch):
    reported = {
        "torch": ({"torch.capability": "DEFAULT", "torch.onednn_isa": "SSE4.1", "torch.mkl_cnr": "COMPATIBLE"}, ""),
        "numpy": ({"numpy.openblas_core": "Nehalem"}, ""),
        "jax": ({}, "jax is not installed"),
    }
    monkeypatch.setattr(hosts, "probe", lambda lib, env: reported[lib])
    ok, why, _ = hosts.check(hosts.SETTINGS["no-avx"])
    assert ok and why.endswith("; jax not installed here"), why
    ok, why, _ = hosts.check(hosts.SETTINGS["xla-avx"])
    assert not ok and why == "jax not installed here"
    reported["numpy"] = ({"numpy.openblas_core": "Haswell"}, "")  # the variable ignored: not this setting
    ok, why, _ = hosts.check(hosts.SETTINGS["no-avx"])
    assert not ok and why == "numpy.openblas_core is 'Haswell', not 'Nehalem'"

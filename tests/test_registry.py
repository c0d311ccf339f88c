"""How kernels arrive: built-in names, ``module:attr``, plain SDPA-signature functions, entry points.

The end-to-end checks run pytest in a subprocess from a directory outside the repository, the way a
kernel author runs ``pytest --pyargs conformance --impl=...`` after ``pip install``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from conformance.contract import Declaration
from conformance.harness.calls import registry

ROOT = Path(__file__).resolve().parents[1]


def run_pytest(args: list[str], cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    paths = [str(p) for p in (extra_path,) if p is not None]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_builtin_names_resolve_or_say_why():
    for name in ("numpy", "torch-eager", "torch-sdpa-cuda", "jax-cudnn"):
        res = registry.resolve(name)
        assert res.adapter is not None or res.reason, name
    assert registry.resolve("numpy").reason is None


def test_unknown_name_lists_the_alternatives():
    with pytest.raises(registry.ImplSpecError) as err:
        registry.resolve("nmupy")
    assert "numpy" in str(err.value) and "module:attr" in str(err.value)


def test_plain_function_gets_the_function_adapter_and_overrides():
    pytest.importorskip("torch", reason="the example function is torch's own SDPA")
    overrides = registry.parse_declare(["grad=false", "dtypes=float32,float16", "all_blocked=nan"])
    res = registry.resolve("torch.nn.functional:scaled_dot_product_attention", overrides)
    decl = res.adapter.declaration
    assert decl.grad is False and decl.dtypes == frozenset({"float32", "float16"}) and decl.all_blocked == "nan"
    assert decl.mask_sense == "attend"


@pytest.mark.parametrize("bad", ["nonsense", "grad=maybe", "dtypes=float8", "all_blocked=zero"])
def test_bad_declare_values_are_rejected(bad):
    with pytest.raises(registry.ImplSpecError):
        registry.parse_declare([bad])


FIELDS = [f.name for f in dataclasses.fields(Declaration)]
HINTS = typing.get_type_hints(Declaration)


def _spelled(value) -> str:
    """A Declaration value as the user writes it after ``--declare KEY=``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (frozenset, set, tuple, list)):
        return ",".join(sorted(value))
    return str(value)


@pytest.mark.parametrize("field", FIELDS)
def test_every_declaration_field_round_trips_through_declare(field):
    """Each field, whatever its type, parses from its own default spelled on the command line."""
    default = getattr(Declaration(), field)
    assert registry.parse_declare([f"{field}={_spelled(default)}"]) == {field: default}


@pytest.mark.parametrize("field", [f for f in FIELDS if HINTS[f] is not str])
def test_a_bad_value_is_one_line_naming_field_value_and_expected_type(field):
    with pytest.raises(registry.ImplSpecError) as err:
        registry.parse_declare([f"{field}=???"])
    msg = str(err.value)
    assert msg.startswith(f"--declare {field}='???': expected ") and "\n" not in msg, msg


@pytest.mark.parametrize(
    "item, message",
    [
        ("max_head_dim=abc", "--declare max_head_dim='abc': expected an integer or none"),
        ("grad=maybe", "--declare grad='maybe': expected true or false"),
        ("all_blocked=zero", "--declare all_blocked='zero': expected one of 'zeros', 'nan', 'mean-v'"),
        (
            "all_blocked_float_mask=zero",
            ("--declare all_blocked_float_mask='zero': expected one of 'zeros', 'nan', 'mean-v' or none"),
        ),
        ("causal-alignment=middle", "--declare causal_alignment='middle': expected one of 'top-left', 'bottom-right'"),
        (
            "dtypes=float32,float8",
            (
                "--declare dtypes='float32,float8': expected a comma-separated list; unknown dtypes "
                "['float8']; known: float64, float32, float16, bfloat16"
            ),
        ),
    ],
)
def test_declare_error_messages(item, message):
    with pytest.raises(registry.ImplSpecError) as err:
        registry.parse_declare([item])
    assert str(err.value) == message


def test_declare_values_are_typed_by_the_field():
    got = registry.parse_declare(
        [
            "max_head_dim=none",
            "grad=on",
            "dtypes= float32 , float16 ",
            "notes=a b",
            "all_blocked_float_mask=nan",
            "max-head-dim=128",
        ]
    )
    assert got == {
        "max_head_dim": 128,
        "grad": True,
        "dtypes": frozenset({"float32", "float16"}),
        "notes": "a b",
        "all_blocked_float_mask": "nan",
    }
    assert registry.parse_declare(["max_head_dim="]) == {"max_head_dim": None}
    assert registry.parse_declare(["dtypes="]) == {"dtypes": frozenset()}  # declares nothing: a verdict matter
    # Collections of names, whatever the field: comma-separated, blanks dropped, the container kept.
    assert registry._parse_as(tuple[str, ...], " ValueError, KeyError ,") == ("ValueError", "KeyError")
    assert registry._parse_as(frozenset[str], "a,b,a") == frozenset({"a", "b"})


def test_a_bad_declare_is_a_usage_error_not_an_internal_error(tmp_path):
    run = run_pytest(["--impl=numpy", "--declare", "max_head_dim=abc"], tmp_path)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "ERROR: --declare max_head_dim='abc': expected an integer or none" in run.stderr.splitlines()
    assert "INTERNALERROR" not in run.stdout + run.stderr


def test_declaration_rejects_unknown_conventions():
    with pytest.raises(ValueError):
        Declaration(causal_alignment="middle")


def test_certifying_a_plain_function_needs_no_adapter(tmp_path):
    pytest.importorskip("torch", reason="plain SDPA-signature functions are called with torch tensors")
    (tmp_path / "userkernel.py").write_text(
        textwrap.dedent("""
        import torch.nn.functional as F

        def my_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

        def broken_sdpa(
            query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
        ):
            # reads the suite's True = blocked as True = attend: the classic §10 migration bug
            if attn_mask is not None and attn_mask.dtype.is_floating_point is False:
                attn_mask = ~attn_mask
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    """)
    )
    # The two clauses' modules by package name, from outside the checkout, as an installed suite runs them;
    # a subset: PARTIAL, exit 0 if it passed.
    mods = ["--pyargs", "conformance.clauses.test_worked_example", "conformance.clauses.test_masks"]
    sel = [*mods, "-k", "worked_example or mask_before_softmax", "--allow-partial"]
    ok = run_pytest(["--impl=userkernel:my_sdpa", *sel], tmp_path, tmp_path)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert re.search(r"userkernel:my_sdpa: PARTIAL: 2/\d+ clauses passed", ok.stdout), ok.stdout[-2000:]
    bad = run_pytest(["--impl=userkernel:broken_sdpa", *sel], tmp_path, tmp_path)
    assert bad.returncode == 1, bad.stdout[-3000:]
    assert "clause MASK-BEFORE-SOFTMAX-01" in bad.stdout and "reproduce: pytest" in bad.stdout
    assert "DOES NOT CONFORM" in bad.stdout


def _third_party_site(tmp_path: Path) -> Path:
    """An installed third-party package that registers an adapter under the suite's entry-point group."""
    site = tmp_path / "site"
    (site / "thirdparty_attn").mkdir(parents=True)
    (site / "thirdparty_attn" / "__init__.py").write_text(
        "from implementations.numpy_kernel import NumpyAdapter\n\n"
        "class ThirdParty(NumpyAdapter):\n    name = 'thirdparty'\n"
    )
    dist = site / "thirdparty_attn-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-attn\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sdpa_conformance.adapters]\nthirdparty = thirdparty_attn:ThirdParty\n")
    return site


def test_entry_point_adapters_are_listed_and_usable(tmp_path, monkeypatch, capsys):
    """The entry point is found, listed by the code of ``--impl-list`` and certified by its name. The
    listing is made here with the built-ins left out (listing them imports every framework, seconds
    each); the thorough twin below runs the whole ``pytest --impl-list``."""
    from conformance.harness.run import options

    site = _third_party_site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "builtin_names", dict)
    options.print_impl_list()
    listing = capsys.readouterr().out
    assert "thirdparty" in listing and "thirdparty_attn:ThirdParty" in listing and "[available]" in listing
    monkeypatch.undo()
    run = run_pytest(
        ["--pyargs", "conformance", "--impl=thirdparty", "-k", "worked_example", "--allow-partial"], tmp_path, site
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"thirdparty: PARTIAL: 1/\d+ clauses passed", run.stdout), run.stdout[-2000:]


@pytest.mark.thorough
def test_entry_point_adapters_are_listed_by_impl_list(tmp_path):
    site = _third_party_site(tmp_path)
    listing = run_pytest(["--impl-list"], tmp_path, site)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert "thirdparty" in listing.stdout and "thirdparty_attn:ThirdParty" in listing.stdout


def test_property_clause_whose_every_case_is_refused_is_an_undeclared_refusal(tmp_path):
    """A kernel that refuses every generated case its declaration covers fails the property clause
    (an undeclared refusal, with the --declare that would make the declaration honest) rather than
    passing or erroring in hypothesis; declaring the dtype away makes the clause not applicable."""
    (tmp_path / "refuser.py").write_text(
        textwrap.dedent("""
        from conformance.contract import NotApplicable
        from implementations.numpy_kernel import NumpyAdapter

        class Refuser(NumpyAdapter):
            name = "refuser"

            def forward(self, case):
                raise NotApplicable("this kernel takes no case at all")
    """)
    )
    args = [
        "--pyargs",
        "conformance.clauses.test_agreement",
        "--impl=refuser:Refuser",
        "-k",
        "agrees_with_oracle and float32",
    ]
    args.append("-rs")
    run = run_pytest(args, tmp_path, tmp_path)
    assert run.returncode == 1, run.stdout[-3000:]
    assert "undeclared refusal" in run.stdout and "this kernel takes no case at all" in run.stdout
    assert "--declare dtypes=" in run.stdout
    declared = run_pytest([*args, "--declare", "dtypes=float64"], tmp_path, tmp_path)
    assert declared.returncode != 1 and "1 skipped" in declared.stdout, declared.stdout[-3000:]


def test_declared_causal_alignment_of_a_function_is_tested_not_emulated(tmp_path):
    """torch's SDPA aligns is_causal top-left; declaring bottom-right for it must fail the alignment
    clause (the adapter passes is_causal through instead of building the declared mask itself)."""
    pytest.importorskip("torch", reason="the function under test is torch's own SDPA")
    args = [
        "--pyargs",
        "conformance.clauses.test_causal",
        "--impl=torch.nn.functional:scaled_dot_product_attention",
        "-k",
        "test_causal_alignment and float32",
        "--allow-partial",
    ]
    assert run_pytest(args, tmp_path).returncode == 0
    wrong = run_pytest(args + ["--declare", "causal_alignment=bottom-right"], tmp_path)
    assert wrong.returncode == 1 and "clause CAUSAL-ALIGN-02" in wrong.stdout, wrong.stdout[-2000:]


def test_mask_sense_of_a_function_is_declared_and_tested(tmp_path):
    """A function whose boolean mask means True = blocked (nn.MultiheadAttention's sense) conforms
    when it says so with --declare mask_sense=blocked, and fails the mask clauses when it does not."""
    pytest.importorskip("torch", reason="plain SDPA-signature functions are called with torch tensors")
    (tmp_path / "blockedsense.py").write_text(
        textwrap.dedent("""
        import torch.nn.functional as F

        def sdpa_blocked(
            query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
        ):
            if attn_mask is not None and attn_mask.dtype.is_floating_point is False:
                attn_mask = ~attn_mask  # this kernel's API: True = blocked
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    """)
    )
    args = [
        "--pyargs",
        "conformance.clauses.test_mask_kinds",
        "--impl=blockedsense:sdpa_blocked",
        "-k",
        "mask_sense and float32",
        "--allow-partial",
    ]
    declared = run_pytest(args + ["--declare", "mask_sense=blocked"], tmp_path, tmp_path)
    assert declared.returncode == 0, declared.stdout[-2000:]
    undeclared = run_pytest(args, tmp_path, tmp_path)
    assert undeclared.returncode == 1 and "clause MASK-SENSE-07" in undeclared.stdout, undeclared.stdout[-2000:]


def test_an_unrelated_pytest_run_does_not_import_the_frameworks(tmp_path):
    """The plugin is loaded by every pytest run in the environment; a run that collects no clause
    must not pay for importing torch or jax (built-ins resolve only when clauses are collected)."""
    (tmp_path / "test_unrelated.py").write_text(
        "import sys\n\ndef test_frameworks_not_imported():\n"
        "    assert 'torch' not in sys.modules and 'jax' not in sys.modules\n"
    )
    run = run_pytest([], tmp_path)
    assert run.returncode == 0, run.stdout[-2000:]

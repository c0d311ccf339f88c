"""The conformance matrix (``python -m conformance.matrix``): rows, columns, cells and their
commands from certificates, the HTML page's no-external-resource rule, escaping of every string a
kernel or a certificate supplies, and the command end to end on one cheap adapter (whose printed
cell command is then run and must reproduce the cell)."""

from __future__ import annotations

import html
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conformance import catalog
from conformance.harness.records import matrix_html, matrix_markdown
from conformance.harness.records.matrix_build import build_matrix
from conformance.harness.records.matrix_fields import likely_cause_lines, run_options, split_citation

ROOT = Path(__file__).resolve().parents[1]
EVIL = "<script>alert(1)</script>"
catalog.load()


def _clause(outcome: str, detail: str, source: str, title: str = "a title") -> dict:
    return {"title": title, "source": source, "outcome": outcome, "detail": detail, "by_dtype": {}}


S3 = "000_f3dcd408372d9e02.txt §3 矩阵形式: \u201cM 是可选的加性 Mask。\u201d"
S10 = "000_f3dcd408372d9e02.txt §10 something: \u201cten\u201d"
S2 = "000_f3dcd408372d9e02.txt §2 从单个 Query 到公式: \u201ctwo\u201d"
WORKED = "003_648455d5abd16778.txt Worked Example: \u201co = [1, 2]\u201d"


def certificate(spec: str, clauses: dict, *, verdict: str = "CONFORMS", failures=(), command="", **extra) -> dict:
    """A certificate document in harness.run.certificate.build's format, reduced to what the matrix reads."""
    entry = {
        "spec": spec,
        "name": spec,
        "verdict": verdict,
        "coverage": {"summary": f"{len(clauses)} clauses"},
        "environment": {"device": "cpu (test)", "libraries": {"numpy": "9.9"}, "kernel_libraries": {"numpy": "9.9"}},
        "clauses": clauses,
        "failures": list(failures),
        **extra,
    }
    return {"date": "2026-12-01 00:00 UTC", "command": command or f"pytest --impl={spec}", "adapters": {spec: entry}}


def two_certificates() -> list[tuple[str, dict]]:
    good = certificate(
        "numpy",
        {
            "WORKED-EXAMPLE-01": _clause("pass", "passed: float64, float32", WORKED),
            "FLOAT-MASK-M-13": _clause("not applicable", "not applicable to numpy: declares float_mask=False", S3),
            "X-TEN-01": _clause("pass", "passed: float64", S10),
            "X-TWO-01": _clause("pass", "passed: float64", S2),
        },
        command="pytest --impl=numpy -k worked or mask -q --declare float_mask=false --certificate=x.json",
    )
    bad = certificate(
        "mykernel",
        {
            "WORKED-EXAMPLE-01": _clause("fail", "failed: float16", WORKED),
            "FLOAT-MASK-M-13": _clause("expected failure", "expected failure: float64", S3),
            "X-TEN-01": _clause("fail", "failed: float64", S10),
        },
        verdict="DOES NOT CONFORM",
        failures=[
            {
                "clause": "WORKED-EXAMPLE-01",
                "dtype": "float16",
                "nodeid": "conformance/clauses/test_worked_example.py::test_worked_example[mykernel-float16]",
                "reproduce": "",
                "message": "ClauseViolation: got [1, 3]",
            },
            {
                "clause": "X-TEN-01",
                "dtype": "float64",
                "nodeid": "conformance/clauses/test_ten.py::test_ten[mykernel-float64]",
                "message": "",
            },
        ],
        counts={"fail": 2, "expected failure": 1},
        expectations={
            "expected_failures": [{"clause": "FLOAT-MASK-M-13", "dtype": "float64", "reason": "softmax in f32"}],
            "entries": [
                {
                    "behaviour": "softmax in f32",
                    "when_text": "dtype=float64",
                    "status": "matched",
                    "tests": 1,
                    "clauses": ["FLOAT-MASK-M-13"],
                },
                {
                    "behaviour": "fixed long ago",
                    "when_text": "decode T = 1",
                    "status": "stale",
                    "tests": 0,
                    "clauses": [],
                },
                {"behaviour": "never met", "when_text": "GQA 8:1", "status": "not reached", "tests": 0, "clauses": []},
            ],
        },
        likely_causes={"failures": 1, "causes": ["float16 + forward: 1 failing clause test"], "unexplained": []},
        discovery={"declare": ["all_blocked=nan"], "measured": [], "findings": ["causal ignored with a mask"]},
    )
    return [("a.json", good), ("b.json", bad)]


def test_rows_grouped_by_section_in_the_seeds_order_with_a_cell_per_adapter():
    m = build_matrix(two_certificates())
    assert [c.label for c in m.columns] == ["numpy", "mykernel"]
    assert [c.libraries for c in m.columns] == [{"numpy": "9.9"}] * 2
    headings = [s.heading for s in m.sections]
    assert headings == [
        "000_f3dcd408372d9e02.txt §2 从单个 Query 到公式",
        "000_f3dcd408372d9e02.txt §3 矩阵形式",
        "000_f3dcd408372d9e02.txt §10 something",
        "003_648455d5abd16778.txt Worked Example",
    ]
    rows = {r.clause: r for r in m.rows}
    assert rows["FLOAT-MASK-M-13"].sentence == "M 是可选的加性 Mask。"
    words = {cid: [(c.word, c.kind) for c in r.cells] for cid, r in rows.items()}
    assert words["WORKED-EXAMPLE-01"] == [("pass", "ok"), ("fail", "bad")]
    assert words["FLOAT-MASK-M-13"] == [("n/a", "na"), ("expected failure", "xfail")]
    assert words["X-TWO-01"] == [("pass", "ok"), ("-", "nr")]  # not in mykernel's certificate
    na, xfail = rows["FLOAT-MASK-M-13"].cells
    assert na.reason == "declares float_mask=False"
    assert "softmax in f32" in xfail.reason
    assert rows["WORKED-EXAMPLE-01"].cells[1].message == "ClauseViolation: got [1, 3]"
    assert m.columns[1].likely_causes == ("float16 + forward: 1 failing clause test",)
    notes = m.columns[1].notes
    assert (
        "known cause: softmax in f32",
        "known cause: softmax in f32 (when dtype=float64): 1 clause test(s) of FLOAT-MASK-M-13",
    ) in notes
    assert any(short == "STALE known cause: fixed long ago" for short, _ in notes)
    assert not any("never met" in short for short, _ in notes)  # not reached: nothing to say
    assert ("discovery finding: causal ignored with a mask",) * 2 in m.columns[1].notes
    assert (
        "declaration discovered (--discover)",
        "certified under a discovered declaration: --declare all_blocked=nan",
    ) in m.columns[1].notes


def test_every_cell_names_its_clause_test_and_the_options_of_its_run():
    m = build_matrix(two_certificates())
    rows = {r.clause: r for r in m.rows}
    good, bad = rows["WORKED-EXAMPLE-01"].cells
    assert good.command == (
        "pytest conformance/clauses/test_worked_example.py::test_worked_example --impl=numpy --declare=float_mask=false"
    )
    assert bad.command == "pytest conformance/clauses/test_worked_example.py::test_worked_example --impl=mykernel"
    # a clause this suite does not know takes its test from the certificate's failure record
    assert rows["X-TEN-01"].test == "conformance/clauses/test_ten.py::test_ten"
    assert rows["X-TWO-01"].test == "" and rows["X-TWO-01"].cells[0].command == ""
    installed = build_matrix(two_certificates(), pyargs=True)
    cmd = {r.clause: r for r in installed.rows}["WORKED-EXAMPLE-01"].cells[1].command
    assert cmd == "pytest --pyargs conformance.clauses.test_worked_example::test_worked_example --impl=mykernel"
    for row in m.rows:
        if row.clause in catalog.load():
            path, _, func = row.test.partition("::")
            assert (ROOT / path).is_file() and f"def {func}(" in (ROOT / path).read_text()


def test_run_options_keep_what_changes_the_inputs_only():
    doc = {"command": "pytest --impl=x -k a or b --declare grad=false --signature=flash-attn -q --certificate=c.json"}
    assert run_options(doc) == ("--declare=grad=false", "--signature=flash-attn")
    assert run_options({"command": "pytest --impl=x --conformance-profile thorough --discover"}) == (
        "--conformance-profile=thorough",
        "--discover",
    )


def test_citations_split_into_where_and_sentence():
    assert split_citation(S3) == ("000_f3dcd408372d9e02.txt §3 矩阵形式", "M 是可选的加性 Mask。")
    assert split_citation("") == ("(no citation)", "")


def test_likely_causes_render_whatever_shape_they_come_in():
    assert likely_cause_lines(None) == ()
    assert likely_cause_lines(["a", {"text": "b"}]) == ("a", "b")
    (line,) = likely_cause_lines({"causes": [{"features": ["dtype=float64"], "clause_tests": 3, "clauses": 2}]})
    assert "dtype=float64" in line and "3 failing clause tests" in line
    assert likely_cause_lines({"causes": [], "unexplained": ["X[float16]"]}) == (
        "not explained by a feature set: X[float16]",
    )


def test_a_spec_in_two_certificates_gets_a_column_each():
    a, b = two_certificates()[0][1], two_certificates()[0][1]
    m = build_matrix([("run1.json", a), ("run2.json", b)])
    assert [c.label for c in m.columns] == ["numpy (run1)", "numpy (run2)"]
    assert {c.spec for c in m.columns} == {"numpy"}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _evil_certificates() -> list[tuple[str, dict]]:
    evil = certificate(
        EVIL,
        {"WORKED-EXAMPLE-01": _clause("fail", f"failed: float16 | {EVIL}\nsecond line", WORKED, title=EVIL)},
        verdict="DOES NOT CONFORM",
        failures=[{"clause": "WORKED-EXAMPLE-01", "dtype": "float16", "nodeid": "", "message": f"Error: {EVIL}"}],
        likely_causes=[f"cause {EVIL}"],
    )
    evil["adapters"][EVIL]["environment"]["kernel_libraries"] = {"evil": "<img src=x onerror=alert(1)>"}
    return [*two_certificates(), ("evil.json", evil)]


def test_the_page_is_one_file_that_fetches_nothing():
    page = matrix_html.render(build_matrix(_evil_certificates()), "python -m conformance.matrix --out d")
    parser = _Tags()
    parser.feed(page)
    tags = [t for t, _ in parser.tags]
    assert "table" in tags and "details" in tags and "style" in tags
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(tags), tags
    assert not any(k in attrs for _, attrs in parser.tags for k in ("src", "href", "srcset", "onerror")), parser.tags
    assert not re.search(r"url\(|@import|https?://", page)


def test_every_string_from_a_certificate_is_shown_as_text():
    m = build_matrix(_evil_certificates())
    page = matrix_html.render(m)
    parser = _Tags()
    parser.feed(page)
    assert EVIL not in page and "<img" not in page
    text = "".join(parser.text)
    assert f"Error: {EVIL}" in text  # the kernel's message, as text
    assert EVIL in text.replace("\n", "")  # the adapter name and title too
    assert "evil <img src=x onerror=alert(1)>" in text
    md = matrix_markdown.render(m)
    outside_code = re.sub(r"`+[^`]*`+", "", re.sub(r"```+text\n.*?\n```+", "", md, flags=re.S))
    assert "<script>" not in outside_code and "<img" not in outside_code
    assert "&lt;script&gt;" in outside_code
    for line in md.splitlines():
        if line.startswith("| ") and "WORKED-EXAMPLE-01" in line:
            # a pipe or newline in the reason cannot add a cell: clause + 3 columns
            assert len(re.findall(r"(?<!\\)\|", line)) == 5, line


def test_markdown_has_the_verdicts_the_sections_and_the_deviations_with_their_commands():
    md = matrix_markdown.render(build_matrix(two_certificates()), "python -m conformance.matrix --out d")
    assert "| numpy | numpy 9.9 | cpu (test) | **CONFORMS** |" in md
    assert "**DOES NOT CONFORM**" in md and "float16 + forward: 1 failing clause test" in md
    assert md.index("§2 从单个") < md.index("§3 矩阵形式") < md.index("§10 something") < md.index("Worked Example")
    assert "### mykernel: WORKED-EXAMPLE-01 (fail)" in md
    assert "Reproduce: `pytest conformance/clauses/test_worked_example.py::test_worked_example --impl=mykernel`" in md
    assert "n/a (declares float\\_mask=False)" in md


def _python_pytest(command: str) -> list[str]:
    args = shlex.split(command)
    assert args[0] == "pytest"
    return [sys.executable, "-m", "pytest", *args[1:], "-q", "-p", "no:cacheprovider"]


# An adapter that is unavailable on every machine and imports no framework (a CUDA built-in would be
# available on a CUDA machine, and certifying it imports torch).
NO_DEVICE = "tests.unavailable:NoDevice"


def test_the_command_certifies_writes_both_files_and_its_cells_reproduce(tmp_path):
    out = tmp_path / "m"
    wrong = "tests.mutants:MaskAfterSoftmax"  # fails the worked example
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.matrix", "--out", str(out), "--impl", "numpy", "--impl", wrong,
         "--impl", NO_DEVICE, "--pytest-arg=-k", "--pytest-arg=test_worked_example",
         "--pytest-arg=--allow-partial"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out / "certs" / "numpy.json").is_file() and (out / "matrix.html").is_file()
    md = (out / "matrix.md").read_text()
    assert "| numpy | numpy " in md and "**PARTIAL**" in md and "**DOES NOT CONFORM**" in md
    assert f"{NO_DEVICE} (" in md and "needs a device this machine lacks" in md  # listed with its reason, no column
    docs = [(p.name, json.loads(p.read_text())) for p in sorted((out / "certs").glob("*.json"))]
    numpy_doc = dict(docs)["numpy.json"]
    assert numpy_doc["adapters"]["numpy"]["environment"]["kernel_libraries"] == {
        "numpy": importlib.metadata.version("numpy")
    }
    m = build_matrix(docs)
    assert [c.spec for c in m.columns] == ["numpy", wrong]
    row = {r.clause: r for r in m.rows}["WORKED-EXAMPLE-01"]
    good, bad = row.cells
    assert (good.word, bad.word) == ("pass", "fail") and bad.message
    page = (out / "matrix.html").read_text()
    assert html.escape(good.command) in page and html.escape(bad.command) in page
    parser = _Tags()
    parser.feed(page)
    assert not {"script", "link", "img"} & {t for t, _ in parser.tags}
    assert not any("src" in a or "href" in a for _, a in parser.tags) and "http" not in page
    # each cell's command reruns exactly that clause on that adapter, with the cell's outcome
    for cell, spec, outcome in ((good, "numpy", "PARTIAL"), (bad, wrong, "DOES NOT CONFORM")):
        rerun = subprocess.run(_python_pytest(cell.command), cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert f"{spec}: {outcome}: " in rerun.stdout, rerun.stdout
        assert re.search(r"\b4 passed\b" if cell is good else r"\b4 failed\b", rerun.stdout), rerun.stdout
        assert "clauses passed" in rerun.stdout and ("1 failed" in rerun.stdout) == (cell is bad)


def test_kernel_libraries_name_the_kernels_own_library_not_the_contracts():
    from conformance.harness.calls import registry
    from conformance.harness.calls.environment import kernel_libraries

    assert list(kernel_libraries(registry.resolve("numpy").adapter)) == ["numpy"]
    # a module of this checkout's tests package is not the stray `tests` package a wheel (mlx's) ships
    assert list(kernel_libraries(registry.resolve("tests.mutants:MaskAfterSoftmax").adapter)) == ["numpy"]
    pytest.importorskip("torch")
    assert list(kernel_libraries(registry.resolve("torch-eager").adapter)) == ["torch"]
    fn = registry.resolve("torch.nn.functional:scaled_dot_product_attention").adapter  # a wrapped function
    assert list(kernel_libraries(fn)) == ["torch"]
    flex = registry.resolve("torch-flex").adapter
    flex._flex()  # holds torch.compile(flex_attention) (compiled on first call): its module's imports are not kernels
    assert list(kernel_libraries(flex)) == ["torch"]
    pytest.importorskip("transformers")
    hf = registry.resolve("hf-eager")  # its attention function is loaded on first use, then held
    assert hf.usable and set(kernel_libraries(hf.adapter)) == {"torch", "transformers"}


def _check_default_columns(usable: list[str], unavailable: list[tuple[str, str]]) -> None:
    from conformance.harness.calls import registry

    assert "numpy" in usable
    assert sorted(usable + [name for name, _ in unavailable]) == sorted(registry.builtin_names())
    assert all(why.strip() for _, why in unavailable)


def test_the_default_columns_are_every_available_builtin_and_the_rest_say_why():
    """The columns the command draws without --impl, asked in this process (in the suite's run its
    frameworks are already imported by the clause tests); the thorough twin below asks in the child
    process the command itself starts, which imports every framework afresh."""
    from conformance import matrix

    _check_default_columns(*matrix.available_builtins())


@pytest.mark.thorough
def test_the_default_columns_probed_in_a_child_process():
    from conformance import matrix

    _check_default_columns(*matrix.probe_builtins())


@pytest.mark.parametrize("argv", [["--out", "x", "--certificates", "/nonexistent.json"]])
def test_bad_input_is_a_clear_error(argv, tmp_path):
    from conformance import matrix

    with pytest.raises(SystemExit, match="cannot read certificate /nonexistent.json"):
        matrix.main([*argv[:1], str(tmp_path / "x"), *argv[2:]])

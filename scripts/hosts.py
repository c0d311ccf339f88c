#!/usr/bin/env python3
"""Other hosts on this one: run a command under the kernels another CPU would get.

torch, NumPy's OpenBLAS and XLA each pick their kernels by the CPU they find, so a verdict measured on an
AVX2 machine says nothing yet about a machine without AVX. Each library takes a setting that makes it
pick as on a lesser (or greater) CPU:

    ATEN_CPU_CAPABILITY   torch's own vectorised kernels (softmax, the CPU flash path): default, avx2, avx512
    ONEDNN_MAX_CPU_ISA    oneDNN's ceiling in torch: SSE41, AVX, AVX2, AVX512_CORE, ...
    MKL_CBWR              MKL's code branch (torch's BLAS): COMPATIBLE is the one every x86 CPU runs alike
    OPENBLAS_CORETYPE     NumPy's OpenBLAS core: Haswell, Sandybridge, Nehalem, Prescott, SkylakeX, ...
    XLA_FLAGS             --xla_cpu_max_isa=SSE4_2 / AVX / AVX2 / AVX512: the widest code XLA's CPU compiler emits

A named setting is a set of these. A setting is *accepted* here when a child process under it imports the
libraries it touches, reports the capability the setting asks for, and runs a small attention through each
without dying: a setting asking for instructions this CPU lacks is refused (torch reports AVX512 when
told to and then dies with SIGILL on its first kernel; OpenBLAS does the same with SkylakeX).

Usage:
    python scripts/hosts.py describe                      this machine: CPU, torch capability, BLAS and core
    python scripts/hosts.py list [--no-check]             every setting, its variables, accepted here or why not
    python scripts/hosts.py run --setting NAME -- CMD...  CMD under one setting (refused if not accepted)
    python scripts/hosts.py run --all -- CMD...           CMD under every accepted setting, then a comparison

``run`` prints the command's output, then per setting its exit status, pytest's closing line and the
verdict lines, and says whether the verdicts agree across settings. Exit status: 0 when every run
exited 0 (and, with --all, the verdicts agree); 2 when a named setting is not accepted here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setting:
    name: str
    about: str
    env: dict[str, str] = field(default_factory=dict)
    # fact name -> the value the probe must report (see probe facts below)
    expect: dict[str, str] = field(default_factory=dict)

    def libraries(self) -> list[str]:
        """The libraries whose probe decides acceptance: those the setting's variables touch."""
        libs = {
            "ATEN_CPU_CAPABILITY": "torch",
            "ONEDNN_MAX_CPU_ISA": "torch",
            "MKL_CBWR": "torch",
            "OPENBLAS_CORETYPE": "numpy",
            "XLA_FLAGS": "jax",
        }
        return sorted({libs[k] for k in self.env}) or ["numpy", "torch"]


NO_AVX = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_CBWR": "COMPATIBLE",
    "OPENBLAS_CORETYPE": "Nehalem",
    "XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2",
}

SETTINGS = {
    s.name: s
    for s in (
        Setting("default", "what this machine picks by itself"),
        Setting(
            "torch-default-isa",
            "torch as on a CPU without AVX: ATen's scalar-width kernels, oneDNN at SSE4.1",
            {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
            {"torch.capability": "DEFAULT", "torch.onednn_isa": "SSE4.1"},
        ),
        Setting(
            "torch-onednn-avx",
            "torch's oneDNN at AVX (Sandy Bridge); ATen as found",
            {"ONEDNN_MAX_CPU_ISA": "AVX"},
            {"torch.onednn_isa": "AVX"},
        ),
        Setting(
            "torch-mkl-compatible",
            "MKL's compatible code branch (the same on every x86 CPU)",
            {"MKL_CBWR": "COMPATIBLE"},
            {"torch.mkl_cnr": "COMPATIBLE"},
        ),
        Setting(
            "torch-avx512",
            "torch's AVX-512 kernels (accepted only on a CPU with AVX-512)",
            {"ATEN_CPU_CAPABILITY": "avx512"},
            {"torch.capability": "AVX512"},
        ),
        Setting(
            "openblas-sandybridge",
            "NumPy's OpenBLAS with its Sandy Bridge kernels (AVX, no FMA)",
            {"OPENBLAS_CORETYPE": "Sandybridge"},
            {"numpy.openblas_core": "Sandybridge"},
        ),
        Setting(
            "openblas-nehalem",
            "NumPy's OpenBLAS with its Nehalem kernels (SSE4.2)",
            {"OPENBLAS_CORETYPE": "Nehalem"},
            {"numpy.openblas_core": "Nehalem"},
        ),
        Setting(
            "openblas-prescott",
            "NumPy's OpenBLAS with its Prescott kernels (SSE3; OpenBLAS names the core Katmai)",
            {"OPENBLAS_CORETYPE": "Prescott"},
            {"numpy.openblas_core": "Katmai"},
        ),
        Setting(
            "openblas-skylakex",
            "NumPy's OpenBLAS with its AVX-512 kernels (accepted only on a CPU with AVX-512)",
            {"OPENBLAS_CORETYPE": "SkylakeX"},
            {"numpy.openblas_core": "SkylakeX"},
        ),
        Setting(
            "xla-sse4.2",
            "XLA's CPU compiler emitting SSE4.2 at most (no AVX)",
            {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
            {"jax.xla_isa": "sse"},
        ),
        Setting(
            "xla-avx",
            "XLA's CPU compiler emitting AVX at most (no AVX2 or FMA)",
            {"XLA_FLAGS": "--xla_cpu_max_isa=AVX"},
            {"jax.xla_isa": "avx"},
        ),
        Setting(
            "no-avx",
            "every library as on a CPU without AVX (torch, oneDNN, MKL, OpenBLAS, XLA together)",
            NO_AVX,
            {
                "torch.capability": "DEFAULT",
                "torch.onednn_isa": "SSE4.1",
                "torch.mkl_cnr": "COMPATIBLE",
                "numpy.openblas_core": "Nehalem",
                "jax.xla_isa": "sse",
            },
        ),
    )
}


def child_env(setting: Setting, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a command runs in under ``setting``: XLA_FLAGS is added to, every other variable set."""
    env = dict(os.environ if base is None else base)
    for key, value in setting.env.items():
        if key == "XLA_FLAGS" and env.get(key):
            env[key] = f"{env[key]} {value}"
        else:
            env[key] = value
    return env


# -- probes: each runs in a child process (a setting may kill it with SIGILL) and prints one JSON object


def _probe_torch() -> dict:
    import torch

    q = torch.randn(1, 2, 5, 8)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.softmax(q @ q.transpose(-1, -2), -1)
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):  # oneDNN prints its ISA on first use
        torch.nn.functional.conv2d(torch.randn(2, 16, 32, 32), torch.randn(16, 16, 3, 3))
    return {
        "torch.version": torch.__version__,
        "torch.capability": torch.backends.cpu.get_cpu_capability(),
        "torch.blas": re.search(r"BLAS_INFO=(\w+)", torch.__config__.show()).group(1),
    }


def _openblas_corename() -> str:
    import ctypes

    import numpy

    libs = Path(numpy.__file__).parent.parent / "numpy.libs"
    for lib in sorted(libs.glob("lib*openblas*.so*")):
        handle = ctypes.CDLL(str(lib))
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            fn = getattr(handle, symbol, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    try:
        import threadpoolctl
    except ImportError:
        return "unknown"
    return next(
        (i.get("architecture", "unknown") for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"),
        "unknown",
    )


def _probe_numpy() -> dict:
    import numpy

    q = numpy.random.default_rng(0).standard_normal((2, 5, 8))
    s = q @ q.transpose(0, 2, 1)
    w = numpy.exp(s - s.max(-1, keepdims=True))
    (w / w.sum(-1, keepdims=True)) @ q
    blas = numpy.__config__.CONFIG["Build Dependencies"]["blas"]
    return {
        "numpy.version": numpy.__version__,
        "numpy.blas": f"{blas['name']} {blas['version']}",
        "numpy.openblas_core": _openblas_corename(),
    }


def xla_isa(asm: str) -> str:
    """The widest instruction set in ``objdump -d`` text: AVX-512 uses zmm registers, AVX2 integer
    operations on ymm, AVX the VEX-encoded (v-prefixed) forms, SSE none of these."""
    instructions = [ln.split("\t")[1] for ln in asm.splitlines() if ln.count("\t") >= 1 and ln.startswith(" ")]
    if any("%zmm" in i for i in instructions):
        return "avx512"
    if any(i.startswith("vp") and "%ymm" in i and not i.startswith(("vpermil", "vperm2f128")) for i in instructions):
        return "avx2"
    if any(i.startswith("v") and "%" in i and "mm" in i for i in instructions):
        return "avx"
    return "sse" if instructions else "none"


def _probe_jax() -> dict:
    with tempfile.TemporaryDirectory() as dump:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
        import jax
        import jax.numpy as jnp

        q = jnp.ones((1, 64, 2, 64), jnp.float32)
        jax.block_until_ready(jax.jit(jax.nn.dot_product_attention)(q, q, q))
        i = jnp.arange(4096, dtype=jnp.int32)  # integer vector code: what tells AVX2 from AVX
        jax.block_until_ready(jax.jit(lambda a: (a * 3 + a) ^ 5)(i))
        isa = "unverified (no objdump)"
        if shutil.which("objdump"):
            asm = "".join(
                subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(o)], capture_output=True, text=True).stdout
                for o in Path(dump).glob("*.o")
            )
            isa = xla_isa(asm)
    return {"jax.version": jax.__version__, "jax.xla_isa": isa}


PROBES = {"torch": _probe_torch, "numpy": _probe_numpy, "jax": _probe_jax}


def probe(library: str, env: dict[str, str], timeout: float = 180) -> tuple[dict, str]:
    """(facts, '') from a child process under ``env``, or ({}, why it gave none)."""
    env = dict(env, MKL_VERBOSE="1")  # MKL names its code branch (CNR:...) with each call
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "_probe", library],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {}, f"{library} probe timed out after {timeout:.0f} s"
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        why = " (an instruction this CPU lacks)" if name == "SIGILL" else ""
        return {}, f"{library} died with {name}{why}"
    if proc.returncode == 1 and f"No module named '{library}'" in proc.stderr:
        return {}, f"{library} is not installed"
    lines = proc.stdout.splitlines()
    found = [ln for ln in lines if ln.startswith("{")]
    if proc.returncode != 0 or not found:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, f"{library} probe exited {proc.returncode}: {tail}"
    facts = json.loads(found[-1])
    if library == "torch":
        isa = next((m.group(1) for ln in lines if (m := re.search(r"onednn_verbose.*isa:Intel (.+)$", ln))), None)
        cnr = next((m.group(1) for ln in lines if (m := re.search(r"MKL_VERBOSE \w+\(.*CNR:(\w+)", ln))), None)
        facts["torch.onednn_isa"] = isa or "unknown"
        facts["torch.mkl_cnr"] = cnr or "unknown"
    return facts, ""


def check(setting: Setting) -> tuple[bool, str, dict]:
    """(accepted here, why not or what it reported, facts) for one setting."""
    env = child_env(setting)
    facts: dict = {}
    absent = []
    for lib in setting.libraries():
        got, why = probe(lib, env)
        if why.endswith("is not installed"):  # its variables change nothing a run here can call
            absent.append(lib)
            continue
        if why:
            return False, why, facts
        facts.update(got)
    if absent and len(absent) == len(setting.libraries()):
        return False, f"{', '.join(absent)} not installed here", facts
    expect = {k: v for k, v in setting.expect.items() if k.split(".")[0] not in absent}
    wrong = [f"{k} is {facts.get(k)!r}, not {v!r}" for k, v in expect.items() if facts.get(k) != v]
    if wrong:
        return False, "; ".join(wrong), facts
    shown = ", ".join(f"{k}={facts[k]}" for k in expect) or "probes ran"
    shown += "".join(f"; {lib} not installed here" for lib in absent)
    return True, shown, facts


# -- what a run printed


VERDICT = re.compile(
    r"^\S+: (?:CONFORMS AS DECLARED|CONFORMS|DEVIATES AS EXPECTED|DOES NOT CONFORM|NOT RUN|PARTIAL)\b.*$", re.M
)


def closing_line(output: str) -> str:
    """pytest's closing line ('== 12 passed, 3 skipped in 4.56s =='), without its rule."""
    lines = [ln for ln in output.splitlines() if re.search(r"\b\d+ (?:passed|failed|error|skipped|deselected)", ln)]
    timed = [ln for ln in lines if re.search(r" in [\d.]+s\b", ln)]
    return ((timed or lines or [""])[-1]).strip("= ").strip()


def verdict_lines(output: str) -> list[str]:
    return VERDICT.findall(output)


def run_under(setting: Setting, cmd: list[str], quiet: bool) -> tuple[int, str]:
    """Run ``cmd`` under ``setting``, its output passed through (unless quiet); (exit status, output)."""
    proc = subprocess.Popen(
        cmd, env=child_env(setting), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    out = []
    for line in proc.stdout:
        out.append(line)
        if not quiet:
            sys.stdout.write(line)
            sys.stdout.flush()
    return proc.wait(), "".join(out)


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        sys.exit("hosts.py run: give the command after --")
    if args.all:
        names = list(SETTINGS)
    else:
        unknown = [n for n in args.setting if n not in SETTINGS]
        if unknown:
            sys.exit(f"hosts.py: no setting {', '.join(unknown)} (python scripts/hosts.py list)")
        names = args.setting
    results = []
    for name in names:
        setting = SETTINGS[name]
        if not args.no_check:
            ok, why, _ = check(setting)
            if not ok:
                print(f"setting {name}: not accepted on this machine: {why}", flush=True)
                if not args.all:
                    return 2
                continue
        env_text = " ".join(f"{k}={v}" for k, v in setting.env.items()) or "(nothing set)"
        print(f"=== setting {name}: {env_text}", flush=True)
        rc, output = run_under(setting, cmd, args.quiet)
        results.append((name, rc, closing_line(output), verdict_lines(output)))
    print("\n=== per setting", flush=True)
    for name, rc, closing, verdicts in results:
        print(f"{name}: rc={rc}: {closing or '(no pytest closing line)'}")
        for v in verdicts:
            print(f"    {v}")
    status = 0 if results and all(rc == 0 for _, rc, _, _ in results) else 1
    if len(results) > 1:
        # the verdict words and counts, without the timings that follow them on no line (verdicts carry none)
        distinct = {tuple(v) for _, _, _, v in results}
        if len(distinct) == 1:
            print(f"verdicts agree across {len(results)} settings")
        else:
            print(f"verdicts DIFFER across {len(results)} settings")
            status = 1
    return status


def _cmd_list(args: argparse.Namespace) -> int:
    for s in SETTINGS.values():
        env_text = " ".join(f"{k}={v}" for k, v in s.env.items()) or "(nothing set)"
        line = f"{s.name:22s} {env_text}\n{'':22s} {s.about}"
        if not args.no_check:
            ok, why, _ = check(s)
            line += f"\n{'':22s} {'accepted' if ok else 'NOT accepted'} here: {why}"
        print(line, flush=True)
    return 0


def _cpu() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    wanted = ("sse4_2", "avx", "fma", "avx2", "avx512f", "avx512_bf16", "amx_tile")
    return {
        "cpu": model.group(1).strip() if model else "unknown",
        "cores": str(os.cpu_count()),
        "instruction sets": " ".join(f for f in wanted if f in flags) or "unknown",
    }


def _cmd_describe(_: argparse.Namespace) -> int:
    facts = _cpu()
    for lib in ("torch", "numpy", "jax"):
        got, why = probe(lib, dict(os.environ))
        facts.update(got or {lib: why})
    width = max(map(len, facts))
    for k, v in facts.items():
        print(f"{k:{width}s}  {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_probe"]:
        print(json.dumps(PROBES[argv[1]]()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("describe", help="this machine's CPU, torch capability, BLAS and core")
    p_list = sub.add_parser("list", help="every setting and whether this machine accepts it")
    p_list.add_argument("--no-check", action="store_true", help="do not probe (instant)")
    p_run = sub.add_parser("run", help="run a command under settings")
    which = p_run.add_mutually_exclusive_group(required=True)
    which.add_argument("--setting", action="append", default=[], help="a setting's name (repeatable)")
    which.add_argument("--all", action="store_true", help="every setting this machine accepts")
    p_run.add_argument("--no-check", action="store_true", help="run without probing the setting first")
    p_run.add_argument("--quiet", action="store_true", help="print only the per-setting summary")
    p_run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    args = ap.parse_args(argv)
    return {"describe": _cmd_describe, "list": _cmd_list, "run": _cmd_run}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())

"""How a clause failure reads: the clause and its spec sentence, the kernel's own words, and one
command that reproduces it (the fourth thing users judge a conformance suite by)."""

from __future__ import annotations

import shlex
import traceback
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.run import runstate
from conformance.harness.spec.report import AdapterError, ClauseViolation

_SUITE_ROOT = str(Path(__file__).resolve().parents[3])


def reproduce_command(item: pytest.Item) -> str:
    """One command that reruns exactly this clause test, with every option that changes its inputs."""
    config = item.config
    state = runstate.get_state(config)
    path = Path(str(item.path))
    try:
        shown = path.relative_to(Path(config.invocation_params.dir))
    except ValueError:
        shown = path
    cmd = ["pytest", f"{shown}::{item.name}"]
    spec = getattr(item, "callspec", None) and item.callspec.params.get("impl")
    if spec:
        cmd.append(f"--impl={spec}")
    random_seeds = bool(runstate.getoption(config, runstate.OPT_RANDOM_SEEDS))
    if state is not None:
        cmd += [f"--declare={d}" for d in state.declare]
        if state.profile != "ci":
            cmd.append(f"--conformance-profile={state.profile}")
        if state.timeout != runstate.DEFAULT_CALL_TIMEOUT:
            cmd.append(f"--call-timeout={state.timeout:g}")
    if random_seeds:
        cmd.append("--conformance-random-seeds")
    seed = runstate.getoption(config, "hypothesis_seed")
    if seed is not None:
        cmd.append(f"--hypothesis-seed={seed}")
    text = " ".join(shlex.quote(c) for c in cmd)
    if ((state is not None and state.profile != "ci") or random_seeds) and seed is None:
        text += "  (random examples: add the @reproduce_failure line printed above, or rerun with --hypothesis-seed)"
    return text


def clause_section(item: pytest.Item, info: Any) -> str:
    """The block printed above a clause failure: which sentence of the spec it breaks, and how to rerun it."""
    return (
        f"clause {info.id}: {info.title}\n"
        f"spec: {info.source.cite()}\n"
        + (f"tolerance: {info.tolerance}\n" if info.tolerance else "")
        + (f"false-positive rate: {info.fpr}\n" if info.fpr else "")
        + f"reproduce: {reproduce_command(item)}"
    )


def describe_exception(exc: BaseException) -> str:
    """The clause's message, plus the kernel's own traceback frames for an adapter error."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, AdapterError) and exc.__cause__ is not None:
        cause = exc.__cause__
        frames = [f for f in traceback.extract_tb(cause.__traceback__) if not f.filename.startswith(_SUITE_ROOT)]
        if frames:
            text += (
                "\n  the kernel's own traceback (suite and adapter frames hidden):\n"
                + "".join(traceback.format_list(frames[-4:])).rstrip()
            )
    notes = getattr(exc, "__notes__", None) or []
    if notes:
        text += "\n" + "\n".join(str(n) for n in notes)
    return text


def compact_failure(exc: BaseException) -> str | None:
    """The clause's own message (plus hypothesis' falsifying example) instead of a source listing.

    Only clause violations are compacted; any other exception is a bug in the suite or the test
    and keeps pytest's full traceback. ``--tb=long`` keeps the full traceback for everything.
    """
    if isinstance(exc, ClauseViolation):
        return describe_exception(exc)
    group = exc if isinstance(exc, BaseExceptionGroup) else None
    if group is not None and all(isinstance(e, ClauseViolation) for e in group.exceptions):
        parts = [f"[{i}] " + describe_exception(e) for i, e in enumerate(group.exceptions, 1)]
        return f"{len(parts)} distinct failures:\n" + "\n\n".join(parts)
    return None

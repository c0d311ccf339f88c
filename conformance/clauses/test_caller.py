"""A caller that lives with the kernel: many calls, and what a caller does between and around them.

Every other clause builds its cases, calls, and lets go. A real caller keeps its buffers: a static KV cache
written one position at a time and passed again as the same objects, results it holds across calls and writes
into (a residual added in place), a call it gets wrong and recovers from, a backward now and then, other
dtypes and shapes in between, and buffers it drops when a sequence ends. CALLER-HISTORY-01 is a hypothesis
state machine (``RuleBasedStateMachine``) whose rules are those steps; after every step each answer is the
oracle's for the inputs' values at that moment (under the error model), nothing the caller owns changed, and,
after the caller drops everything, nothing it passed or got is kept alive by the kernel (weak references to
the arrays; a torch adapter's tensors are views of them, so a kept tensor keeps its array). A failing history
shrinks to its fewest steps and is printed as a script:

    from conformance.clauses.test_caller import Caller
    caller = Caller.for_impl("numpy")
    caller.call(slot=0, B=2, Hq=2, T=4, S=6, Dk=8, dtype="float32", seed=0, causal=False)
    caller.update(slot=0, position=3, seed=1)

each line one step, which raises the clause's failure where the history fails. Steps: 8 per history and 4
histories in the ci profile, 24 and 40 in the thorough one; every case is small (at most 2 x 2 x 5 x 7).

The guarded call already checks what it can see within one call (inputs unchanged, the latest results
unchanged, process state); here the caller checks what only a caller sees: its own arrays between calls, the
results it owns (the guard lets go of a result the caller writes into: ``GuardedAdapter.release_latest``),
and what stays alive after it has let go.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from conformance.clauses.test_gradients import cotangent
from conformance.clauses.test_state_between_calls import FUNCTION_OF_INPUTS
from conformance.contract import DTYPES, Case
from conformance.harness.calls.guarded import HELD_RESULTS, GuardedAdapter
from conformance.harness.cases import strategies
from conformance.harness.cases.build import cast, rng_for
from conformance.harness.cases.profiles import examples
from conformance.harness.judge import compare, rejection
from conformance.harness.spec.clause import clause
from conformance.harness.spec.report import ClauseViolation

# The shapes a history switches between: a T < S cross shape, decode, a square one (each a program for a
# kernel that compiles per shape).
SHAPES = (
    dict(B=2, Hq=2, T=4, S=6, Dk=8),
    dict(B=1, Hq=2, T=1, S=7, Dk=8),
    dict(B=2, Hq=2, T=5, S=5, Dk=4),
)
STEPS = {"ci": 8, "thorough": 24}
NAMES = {"q": "query", "k": "key", "v": "value", "out": "output it holds"}
HISTORIES = 4  # ci; the thorough profile runs ten times as many


class Caller:
    """One caller's buffers and the steps it takes with them; each step records itself as a line of a script
    (``script``) and raises the clause's failure, with that script, where the history goes wrong."""

    def __init__(self, impl: GuardedAdapter, spec: str | None = None, failures: list | None = None):
        self.impl = impl
        self.failures = failures if failures is not None else []  # the failures met, first first (see the clause)
        self.spec = spec or impl.spec or impl.name
        self.slots: dict[int, dict] = {}  # slot -> {"q", "k", "v", "out", "causal", "snap"}
        self.dropped: list[tuple[str, weakref.ref]] = []  # arrays the caller let go of, by what they were
        self.lines: list[str] = []

    @classmethod
    def for_impl(cls, spec: str) -> Caller:
        """A caller of the adapter an ``--impl`` spec names, through the guarded call (as a clause has it)."""
        from conformance.harness.calls.registry import resolve

        resolved = resolve(spec)
        if resolved.adapter is None or resolved.reason:
            raise RuntimeError(f"--impl {spec!r} is not usable here: {resolved.reason}")
        return cls(GuardedAdapter(resolved.adapter, spec=spec), spec)

    # -- the record --------------------------------------------------------------------------------
    def script(self) -> str:
        head = ["from conformance.clauses.test_caller import Caller", f"caller = Caller.for_impl({self.spec!r})"]
        return "\n".join(f"    {line}" for line in head + self.lines)

    def _step(self, line: str, body) -> None:
        self.lines.append(line)
        try:
            body()
            self._check_owned()
        except AssertionError as exc:
            exc.args = (
                f"{exc.args[0] if exc.args else exc}\n  the history, step by step (it fails at its last line; run it "
                f"as a script):\n{self.script()}",
                *exc.args[1:],
            )
            self.failures.append(exc)
            raise

    def _fail(self, message: str, case: Case | None = None) -> None:
        raise ClauseViolation(message, case)

    # -- what the caller owns ----------------------------------------------------------------------
    def _case(self, slot: int, label: str) -> Case:
        s = self.slots[slot]
        return Case(s["q"], s["k"], s["v"], is_causal=s["causal"], seed=slot, label=f"caller slot {slot}: {label}")

    def _snap(self, slot: int) -> None:
        s = self.slots[slot]
        s["snap"] = {n: np.array(s[n], copy=True) for n in ("q", "k", "v", "out") if s.get(n) is not None}

    def _check_owned(self) -> None:
        for slot, s in self.slots.items():
            for name, before in s["snap"].items():
                now = s[name]
                if not np.array_equal(before, now, equal_nan=True):
                    what = NAMES[name]
                    self._fail(
                        f"the caller's {what} (slot {slot}) changed after the step although only the caller writes it: "
                        f"{int((before != now).sum())} of {now.size} elements differ (the kernel kept it and wrote it later)"
                    )

    def _forward(self, slot: int, label: str) -> None:
        """Call the kernel on the slot's arrays as they are now, judge the answer, and keep the kernel's own
        result array (the caller owns it from here)."""
        case = self._case(slot, label)
        self.impl.require(case)
        out = compare.assert_output_matches(self.impl, case)
        own = self.impl.release_latest()
        self.slots[slot]["out"] = own if own is not None else out
        self._snap(slot)

    def _let_go(self, slot: int, when: str) -> None:
        s = self.slots.pop(slot)
        for name in ("q", "k", "v", "out"):
            if s.get(name) is not None:
                self.dropped.append((f"{name} of slot {slot} ({when})", weakref.ref(s[name])))

    # -- the steps ---------------------------------------------------------------------------------
    def call(self, slot: int, B: int, Hq: int, T: int, S: int, Dk: int, dtype: str, seed: int, causal: bool) -> None:
        """New buffers in ``slot`` (the old ones let go of), filled and passed to the kernel."""
        line = f"caller.call(slot={slot}, B={B}, Hq={Hq}, T={T}, S={S}, Dk={Dk}, dtype={dtype!r}, seed={seed}, causal={causal})"

        def body():
            if slot in self.slots:
                self._let_go(slot, "replaced")
            rng = rng_for(seed)
            q, k, v = (
                cast(rng.standard_normal(shape), dtype) for shape in ((B, Hq, T, Dk), (B, Hq, S, Dk), (B, Hq, S, Dk))
            )
            self.slots[slot] = {"q": q, "k": k, "v": v, "out": None, "causal": causal, "snap": {}}
            self._forward(slot, f"new buffers {dtype} B={B} Hq={Hq} T={T} S={S} Dk={Dk}")

        self._step(line, body)

    def again(self, slot: int) -> None:
        """The same objects, unchanged, passed again."""
        self._step(f"caller.again(slot={slot})", lambda: self._forward(slot, "the same arrays again"))

    def update(self, slot: int, position: int, seed: int) -> None:
        """A decode step on a static KV cache: new values written in place into the same key and value arrays at
        ``position`` (and a new query), then the same objects passed again."""

        def body():
            s = self.slots[slot]
            # past the first row: a cache refilled whole is STATE-INPLACE-06's
            p = 1 + position % (s["k"].shape[-2] - 1)
            rng = rng_for(seed)
            dtype = self._case(slot, "").dtype
            s["k"][..., p, :] = cast(rng.standard_normal(s["k"][..., p, :].shape), dtype)
            s["v"][..., p, :] = cast(rng.standard_normal(s["v"][..., p, :].shape), dtype)
            s["q"][...] = cast(rng.standard_normal(s["q"].shape), dtype)
            self._snap(slot)
            self._forward(slot, f"key and value {p} written in place")

        self._step(f"caller.update(slot={slot}, position={position}, seed={seed})", body)

    def write_output(self, slot: int) -> None:
        """The caller adds into the output it holds (a residual, in place), then recomputes the same call (as
        activation checkpointing does): the kernel may not read what the caller wrote."""

        def body():
            s = self.slots[slot]
            s["out"] += np.ones((), dtype=s["out"].dtype)
            self._snap(slot)
            keep = s["out"]
            self._forward(slot, "recomputed after the caller wrote into its output")
            self.slots[slot]["out"] = keep  # the caller goes on holding the output it wrote into
            self._snap(slot)

        self._step(f"caller.write_output(slot={slot})", body)

    def backward(self, slot: int, seed: int) -> None:
        """A VJP of the slot's case (where the kernel declares gradients)."""

        def body():
            case = self._case(slot, "backward")
            compare.assert_vjp_matches(self.impl, case, cotangent(case, seed))

        self._step(f"caller.backward(slot={slot}, seed={seed})", body)

    def refused(self, slot: int) -> None:
        """A call the kernel must refuse (the slot's query and value with a key of another head dim), after
        which the caller goes on."""

        def body():
            s = self.slots[slot]
            k = s["k"]
            bad_key = np.zeros((*k.shape[:-1], k.shape[-1] + 1), dtype=k.dtype)
            case = Case(s["q"], bad_key, s["v"], is_causal=s["causal"], label="key head dim != query head dim")
            result, exc = self.impl.call_raw(case)
            decl = self.impl.declaration
            problem = rejection.judge(decl, "a key whose head dim differs from the query's", result, exc)
            del result, exc  # a traceback holds the call's frames, and they the caller's arrays
            if problem and decl.validates_inputs and "feature" not in decl.accepts_invalid:
                self._fail(problem, case)

        self._step(f"caller.refused(slot={slot})", body)

    def drop_all(self) -> None:
        """The caller lets go of every array it passed or got; after a few more calls (the guard holds the latest
        eight) nothing of it may be alive."""

        def body():
            for slot in list(self.slots):
                self._let_go(slot, "dropped")
            dtype = next(d for d in ("float32", *DTYPES) if d in self.impl.declaration.dtypes)
            rng = rng_for(7)
            flush = Case(
                *(cast(rng.standard_normal((1, 1, 1, 2)), dtype) for _ in range(3)), label="caller: other calls"
            )
            for _ in range(HELD_RESULTS + 1):
                self.impl.forward(flush)
            alive = [what for what, ref in self.dropped if ref() is not None]
            if alive:  # only what a reference cycle holds needs the collector (a tenth of a second with torch loaded)
                gc.collect()
                alive = [what for what, ref in self.dropped if ref() is not None]
            if alive:
                self._fail(
                    f"{len(alive)} of {len(self.dropped)} arrays the caller let go of are still alive "
                    f"{HELD_RESULTS + 1} calls later (the kernel keeps a reference: memory grows with every call): "
                    + "; ".join(alive[:6])
                )
            self.dropped.clear()

        self._step("caller.drop_all()", body)


def _square(shape: int, causal: bool) -> bool:
    """Causal only where T = S: the alignment of a causal T != S case is a declared convention (CAUSAL-*), no
    part of a caller's history."""
    return causal and SHAPES[shape]["T"] == SHAPES[shape]["S"]


def _machine(impl: GuardedAdapter, failures: list) -> type:
    decl = impl.declaration
    dtypes = [d for d in DTYPES if d in decl.dtypes]
    shapes = st.sampled_from(range(len(SHAPES)))
    seeds = st.integers(0, 2**16)
    causal = st.booleans() if decl.causal else st.just(False)
    pick = st.integers(0, 3)

    class History(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.caller = Caller(impl, failures=failures)

        def _slot(self, i: int) -> int:
            return sorted(self.caller.slots)[i % len(self.caller.slots)]

        def _have(self) -> bool:
            return bool(self.caller.slots)

        @initialize(shape=shapes, dtype=st.sampled_from(dtypes), seed=seeds, causal=causal)
        def start(self, shape, dtype, seed, causal):
            self.caller.call(0, **SHAPES[shape], dtype=dtype, seed=seed, causal=_square(shape, causal))

        @rule(slot=st.integers(0, 1), shape=shapes, dtype=st.sampled_from(dtypes), seed=seeds, causal=causal)
        def call(self, slot, shape, dtype, seed, causal):
            self.caller.call(slot, **SHAPES[shape], dtype=dtype, seed=seed, causal=_square(shape, causal))

        @precondition(_have)
        @rule(i=pick)
        def again(self, i):
            self.caller.again(self._slot(i))

        @precondition(_have)
        @rule(i=pick, position=st.integers(0, 7), seed=seeds)
        def update(self, i, position, seed):
            self.caller.update(self._slot(i), position, seed)

        @precondition(_have)
        @rule(i=pick)
        def write_output(self, i):
            self.caller.write_output(self._slot(i))

        @precondition(lambda self: self._have() and decl.grad)
        @rule(i=pick, seed=seeds)
        def backward(self, i, seed):
            self.caller.backward(self._slot(i), seed)

        @precondition(_have)
        @rule(i=pick)
        def refused(self, i):
            self.caller.refused(self._slot(i))

        @rule()
        def drop_all(self):
            self.caller.drop_all()

    return History


@clause(
    "CALLER-HISTORY-01",
    "a caller's history of calls gets the oracle's answer at every step for its arrays' values at that moment: "
    "buffers written in place a position at a time and passed again, outputs held and written into, a call that must "
    "be refused, backwards, other dtypes and shapes; nothing the caller owns changes, and nothing it let go of is "
    "kept alive",
    FUNCTION_OF_INPUTS,
    kills=["kv_cache_checked_by_first_row", "call_keeps_every_input", "result_memo_keeps_returned_array"],
)
def test_caller_history(impl):
    if not impl.declaration.dtypes:
        impl.not_applicable("declares no dtype")
    steps = STEPS.get(strategies.profile_name(), STEPS["ci"])
    failures: list[AssertionError] = []
    try:
        run_state_machine_as_test(
            _machine(impl, failures), settings=settings(test_caller_history.settings(), stateful_step_count=steps)
        )
    except Flaky:
        # A kernel whose state carries from one history to the next (a cache, a memo) may not fail the same way
        # when hypothesis replays a history to shrink it: the first failing history stands, unshrunk.
        first = failures[0]
        first.args = (
            f"{first.args[0]}\n  (the first failing history, not shrunk: replayed, it did not fail the same way, so the "
            "kernel's state carries from one history to the next)",
            *first.args[1:],
        )
        raise first from None


def _settings() -> settings:
    """The histories' settings, kept where hypothesis keeps a ``@given`` test's (and read back from there), so that
    the suite's tools that rerun a failing clause without its shrink phase (``harness.run.worst_case``, the
    self-tests' ``clause_runner``) do the same to this one."""
    held = getattr(test_caller_history, "_hypothesis_internal_use_settings", None)
    return held if held is not None else examples(HISTORIES)


test_caller_history.settings = _settings
test_caller_history._hypothesis_internal_use_settings = examples(HISTORIES)

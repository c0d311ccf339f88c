"""The guarded call: every clause reaches the kernel through :class:`GuardedAdapter`, never directly.

A conformance suite meets broken kernels by design, so a broken kernel must produce a failure of
the clause that was running, with a specific message, and the rest of the suite must go on. Each
call here therefore: refuses cases the declaration rules out (as *not applicable*, with the reason);
fails a case the kernel refuses (``NotApplicable``) although its declaration covers it, since an
undeclared refusal would let a kernel pass by declining what it gets wrong; counts the cases that
ran (the verdict's case coverage); runs the adapter under a per-call timeout; turns an exception
into a failure naming the exception; checks the result's type, shape and dtype; and checks that
the inputs were not modified and that the result is not a view of them.

Long because it is one class whose every check wraps the same call; the undeclared-refusal hint
(:func:`declarations_ruling_out`) is its only helper; the timeout, which runs the kernel on the
caller's own thread, is ``harness.calls.call_timeout``'s.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conformance.contract import (
    DTYPES,
    Case,
    ContextRefused,
    Declaration,
    KernelFault,
    NotApplicable,
    aliases,
    dtype_name,
    np_dtype,
)
from conformance.harness.calls import process_state
from conformance.harness.calls.call_timeout import DEFAULT_CALL_TIMEOUT, CallTimedOut, call_with_timeout
from conformance.harness.calls.programs import ProgramLog
from conformance.harness.cases import cells as space_cells
from conformance.harness.cases import features as causes_features
from conformance.harness.cases.admitted import admitted
from conformance.harness.spec.report import MEASURED_CAPABILITY, AdapterError, ClauseViolation

DEFAULT_TIMEOUT = DEFAULT_CALL_TIMEOUT  # one default for the option and for direct use
HELD_BYTES = 1 << 20  # results up to this size are held and checked after later calls (GuardedAdapter.hold)
HELD_RESULTS = 8  # how many of the latest results are held


HELD_SAMPLE = 4096  # elements of a held result compared after each later call


def _digest(a: np.ndarray) -> bytes:
    """A held result's fingerprint: every element of a small one, an evenly spread sample of a larger one (a
    buffer handed out again is rewritten whole by the next call of its shape; the sample keeps the check cheap
    when eight results are compared after every call)."""
    flat = a.reshape(-1)
    if flat.size > HELD_SAMPLE:
        flat = flat[:: flat.size // HELD_SAMPLE]
    return hashlib.blake2b(np.ascontiguousarray(flat).tobytes(), digest_size=16).digest()


class UndeclaredRefusal(ClauseViolation):
    """The kernel refused (raised ``NotApplicable`` on) a case its declaration says it supports.

    A refusal is honest only when declared: otherwise a kernel could earn CONFORMS by refusing
    every case it gets wrong. The message names the ``--declare`` that would rule the case out.
    """


def declarations_ruling_out(case: Case, decl: Declaration) -> list[str]:
    """``--declare KEY=VALUE`` settings under which ``case`` would be not applicable."""
    qkv = (case.query, case.key, case.value)
    checks = (
        (case.mask is not None, "bool_mask=false"),
        (case.bias is not None, "float_mask=false"),
        (case.is_causal, "causal=false"),
        (case.scale is not None, "custom_scale=false"),
        (case.is_gqa, "gqa=false"),
        (case.dropout_p > 0, "dropout=false"),
        (case.Dk != case.Dv, "requires_dk_eq_dv=true"),
        (max(case.Dk, case.Dv) > 1, f"max_head_dim={max(case.Dk, case.Dv) - 1}"),
        (case.window is not None, "window=false"),
        (bool(case.softcap), "softcap=false"),
        (case.alibi_slopes is not None, "alibi=false"),
        (case.sinks is not None, "sinks=false"),
        (case.seqlens_q is not None, "varlen=false"),
        (case.seqlens_k is not None and case.seqlens_q is None, "kv_lengths=false --declare varlen=false"),
        (case.kv_form is not None and case.kv_form.page_size is not None, "paged_kv=false"),
        (case.kv_form is not None and bool(case.kv_form.append), "kv_append=false"),
        (
            any(np.ndim(a) and np.shape(a)[-1] > 1 and a.strides[-1] != a.itemsize for a in map(np.asarray, qkv)),
            "unit_last_stride=true",
        ),
    )
    return [flag for cond, flag in checks if cond]


def grads_asked(case: Case) -> frozenset[str]:
    """The inputs whose gradient a VJP of ``case`` returns: those its presentation asks for (query,
    key and value by default), with every argument that is one object with one of them."""
    asked = set(case.presentation.asked("vjp") if case.presentation is not None else ("query", "key", "value"))
    for group in aliases(case):
        if asked & set(group):
            asked |= set(group)
    return frozenset(asked)


def _call_with_timeout(fn: Callable[[], Any], timeout: float, what: str, case: Case | None = None) -> Any:
    """Run ``fn`` on this thread under ``timeout`` (harness.calls.call_timeout); a hang becomes a failure
    of the running clause instead of a stuck suite."""
    try:
        return call_with_timeout(fn, timeout, what)
    except CallTimedOut as exc:
        raise AdapterError(str(exc), case) from None


class GuardedAdapter:
    """An adapter under test, with the guards described in the module docstring."""

    def __init__(self, adapter: Any, spec: str = "", timeout: float = DEFAULT_TIMEOUT):
        self.adapter = adapter
        self.spec = spec
        self.timeout = timeout
        self.calls = 0
        self.rejected: list[str] = []  # reasons for cases hypothesis had to discard
        self.programs = ProgramLog()  # structures met in this process, and the time of first calls
        # hold(): (label, the kernel's array, its digest, the call that returned it)
        self.held: deque[tuple[str, np.ndarray, bytes, int]] = deque(maxlen=HELD_RESULTS)
        # Callers may call one kernel from several threads at once (CONTEXT-THREADS-02): the held results are
        # read and written under this lock (the kernel call itself is not: that is what those callers do).
        self._held_lock = threading.RLock()
        self.begin()

    def __repr__(self) -> str:  # shown in hypothesis' falsifying examples: keep it short
        return f"GuardedAdapter({self.spec or self.name!r})"

    @property
    def name(self) -> str:
        return str(getattr(self.adapter, "name", self.spec or type(self.adapter).__name__))

    @property
    def declaration(self) -> Declaration:
        return self.adapter.declaration

    # -- coverage ------------------------------------------------------------------------------
    def begin(self) -> None:
        """Reset the per-clause coverage counters (the plugin calls this before every clause test)."""
        self.rejected.clear()
        self.cases_run = 0  # kernel calls that returned
        self.refused: list[str] = []  # cases refused although the declaration covers them
        self.examples_run = 0  # hypothesis examples that reached the kernel
        self.cells: Counter[str] = Counter()  # case-space cells reached (harness.cases.cells)
        self.case_features: Counter[str] = Counter()  # harness.cases.features keys of the calls that returned
        self.recent_calls: deque[tuple] = deque(maxlen=8)  # (case, call, features key, result): harness.causes.likely
        self._last_example: Any = None
        self.worst_failure: dict | None = None  # harness.run.worst_case's record of a failing clause test

    def _count_example(self) -> None:
        from hypothesis.control import current_build_context, currently_in_test_context

        if currently_in_test_context():
            ctx = current_build_context()
            if ctx is not self._last_example:  # held, so its id cannot be reused by a later example
                self._last_example = ctx
                self.examples_run += 1

    # -- applicability -------------------------------------------------------------------------
    def not_applicable(self, reason: str) -> None:
        """Report the clause (or, inside a hypothesis test, this one generated case) as not applicable.

        Skipping from inside a property-based clause would skip the whole clause because of one
        drawn case; there the case is rejected instead and hypothesis draws another.
        """
        from hypothesis import reject
        from hypothesis.control import currently_in_test_context

        if currently_in_test_context():
            self.rejected.append(reason)
            reject()
        pytest.skip(f"not applicable to {self.name}: {reason}")

    def require(self, case: Case) -> None:
        reasons = self.declaration.not_supported_reasons(case)
        if reasons:
            self.not_applicable("; ".join(reasons))

    def admitted(self, case: Case) -> Case:
        """``case`` brought within the declaration for the features its clause does not test
        (``harness.cases.admitted``: grouped heads repeated, is_causal folded into a mask, one mask kind
        given as the other, or dropped)."""
        return admitted(case, self.declaration)

    def admit(self, case: Case) -> Case:
        """:meth:`admitted`, then required: not applicable only for what the clause tests."""
        case = self.admitted(case)
        self.require(case)
        return case

    def supports(self, case: Case) -> bool:
        return not self.declaration.not_supported_reasons(case)

    # -- guarded calls -------------------------------------------------------------------------
    def _guarded(self, case: Case, what: str, fn: Callable[[], Any], extra_inputs: tuple = ()) -> Any:
        inputs = [("query", case.query), ("key", case.key), ("value", case.value)]
        if case.mask is not None:
            inputs.append(("mask", case.mask))
        if case.bias is not None:
            inputs.append(("bias", case.bias))
        if case.alibi_slopes is not None:
            inputs.append(("alibi_slopes", case.alibi_slopes))
        if case.sinks is not None:
            inputs.append(("sinks", case.sinks))
        inputs.extend(extra_inputs)
        snapshots = [(n, np.array(a, copy=True)) for n, a in inputs]
        self.calls += 1
        self._count_example()
        refusals = causes_features.refusal_count(self.adapter)
        self.recent_calls.append((case, what, None, None))
        state = process_state.Snapshot.take()
        try:
            try:
                result = self.programs.call(
                    case, what, lambda: _call_with_timeout(fn, self.timeout, f"{self.name}.{what}", case)
                )
            finally:
                self._after_call(case, what, inputs, snapshots, state)
        except ContextRefused:  # the framework refused the call under the caller's context: the clause's to record
            raise
        except NotApplicable as exc:
            self.refused.append(case.describe())
            flags = declarations_ruling_out(case, self.declaration)
            rest = ",".join(d for d in sorted(self.declaration.dtypes) if d != case.dtype)
            hint = (
                "a declaration that would rule it out: " + " | ".join(f"--declare {f}" for f in flags)
                if flags
                else "no feature declaration rules this case out (the spec asks every kernel to "
                f"take it); only dropping its dtype would: --declare dtypes={rest}"
            )
            raise UndeclaredRefusal(
                f"{self.name}.{what} refused a case its declaration covers (undeclared refusal): {exc}\n"
                f"  a refusal counts only when declared; {hint}",
                case,
            ) from exc
        except AdapterError:
            raise
        except KernelFault as exc:  # what the adapter alone could see the kernel do wrong
            raise AdapterError(f"{self.name}.{what}: {exc}", case) from exc
        except Exception as exc:  # any kernel error is a finding, not a crash
            raise AdapterError(f"{self.name}.{what} raised {type(exc).__name__}: {exc}", case) from exc
        self.cases_run += 1
        self.cells.update(space_cells.cells_of(case))
        folded = causes_features.folded_by(self.adapter, self.declaration, case, refusals)
        feats = causes_features.key(case, what, folded, self.declaration.causal_alignment)
        self.recent_calls[-1] = (case, what, feats, result)
        if feats is not None:
            self.case_features[feats] += 1
        return result, [a for _, a in inputs]

    def _after_call(self, case: Case, what: str, inputs: list, snapshots: list, state: Any) -> None:
        """What a call may not change besides its result, checked after it returned or raised: its
        inputs (put back when written), the results earlier calls returned (``hold``), and the process
        state a caller relies on (``harness.calls.process_state``, put back). The first change found
        fails the running clause."""
        found = []
        for (name, before), (_, now) in zip(snapshots, inputs):
            now = np.asarray(now)
            if not np.array_equal(before, now, equal_nan=before.dtype.kind == "f"):
                found.append(f"modified its input {name!r} in place")
                if now.flags.writeable:
                    np.copyto(now, before)
        with self._held_lock:
            for item in list(self.held):
                label, arr, digest, _ = item
                if _digest(arr) != digest:
                    found.append(
                        f"changed a result it returned earlier (from '{label}') during this call: a buffer it "
                        "handed out was reused, so a caller holding that result now holds other numbers"
                    )
                    self.held.remove(item)  # reported once, by the call that changed it
                    break
        changed = state.changes(generators=not case.dropout_p)
        if changed:
            found.append(
                "left process state its caller relies on changed (put back by the suite): " + "; ".join(changed)
            )
        if found:
            raise AdapterError(f"{self.name}.{what} " + "; and ".join(found), case)

    def hold(self, result: np.ndarray, case: Case) -> np.ndarray:
        """Keep ``result`` (the kernel's own array) to check after later calls that the kernel never writes
        it again, and give the caller a copy: nothing the suite does with the copy can look like the
        kernel's doing. Large results are not held (the cost), and only the last few are."""
        if not isinstance(result, np.ndarray) or result.nbytes > HELD_BYTES:
            return result
        with self._held_lock:
            self.held.append((case.label or case.describe()[:80], result, _digest(result), self.calls))
        return np.array(result, copy=True)

    def release_latest(self) -> np.ndarray | None:
        """Stop holding the latest call's result and return the kernel's own array (None when that call's result
        was not held): a caller that owns its result writes into it (a residual added in place), and what the
        kernel may not do with it afterwards is that caller's to check (conformance/clauses/test_caller.py)."""
        with self._held_lock:
            if self.held and self.held[-1][3] == self.calls:
                return self.held.pop()[1]
        return None

    def _check_array(self, arr: Any, what: str, shape: tuple, case: Case, inputs: list) -> np.ndarray:
        if not isinstance(arr, np.ndarray):
            raise AdapterError(f"{self.name}: {what} is {type(arr).__name__}, but should be numpy.ndarray", case)
        if arr.shape != tuple(shape):
            raise AdapterError(f"{self.name}: {what}.shape={arr.shape}, but should be {tuple(shape)}", case)
        want = np_dtype(case.dtype)
        if arr.dtype != want:
            raise AdapterError(f"{self.name}: {what}.dtype={arr.dtype}, but should be {want} (the input dtype)", case)
        for a in inputs:
            if np.shares_memory(arr, a):
                raise AdapterError(f"{self.name}: {what} shares memory with an input (a view, not a result)", case)
        with self._held_lock:
            held = tuple(self.held)
        for label, earlier, _, call in held:
            # a result the caller still holds is alive: no fresh allocation can overlap it, only a buffer handed
            # out again (the next write to it, by the kernel or by the caller, changes both results); one call's
            # results may share (one object given as query and key has one gradient)
            if call != self.calls and np.may_share_memory(arr, earlier) and np.shares_memory(arr, earlier):
                raise AdapterError(
                    f"{self.name}: {what} is memory it returned before (from '{label}'), which its caller still "
                    "holds: a buffer handed out again, so the earlier result now holds this call's numbers",
                    case,
                )
        return self.hold(arr, case)

    def call_raw(self, case: Case) -> tuple[Any, BaseException | None]:
        """Call ``forward`` on a case the declaration is NOT consulted for, e.g. a deliberately
        invalid one; returns (result, None) or (None, exception), ``NotApplicable`` included: the
        caller (``harness.judge.rejection``) judges it, and never counts a refusal as a rejection. A call
        that returns or raises is a case run; a hang still fails the clause (``AdapterError``), and so
        does a call that writes its inputs or changes process state (``_after_call``), valid or not."""
        self.calls += 1
        inputs = [(n, a) for n, a in (("query", case.query), ("key", case.key), ("value", case.value)) if a is not None]
        inputs += [(n, a) for n, a in (("mask", case.mask), ("bias", case.bias)) if a is not None]
        snapshots = [(n, np.array(a, copy=True)) for n, a in inputs]
        state = process_state.Snapshot.take()
        try:
            try:
                result = self.programs.call(
                    case,
                    "forward",
                    lambda: _call_with_timeout(
                        lambda: self.adapter.forward(case), self.timeout, f"{self.name}.forward", case
                    ),
                )
            finally:
                self._after_call(case, "forward", inputs, snapshots, state)
        except AdapterError:
            raise
        except Exception as exc:  # noqa: BLE001 - the caller judges the exception
            self.cases_run += 1
            return None, exc
        self.cases_run += 1
        return result, None

    def forward(self, case: Case) -> np.ndarray:
        """The kernel's output for ``case``; not-applicable cases skip with the declared reason."""
        self.require(case)
        out, inputs = self._guarded(case, "forward", lambda: self.adapter.forward(case))
        return self._check_array(out, "output", case.out_shape, case, inputs)

    def forward_with_weights(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        self.require(case)
        if not self.declaration.returns_weights:
            self.not_applicable("declares returns_weights=False")
        res, inputs = self._guarded(case, "forward_with_weights", lambda: self.adapter.forward_with_weights(case))
        if not (isinstance(res, tuple) and len(res) == 2):
            raise AdapterError(
                f"{self.name}.forward_with_weights returned {type(res).__name__}, not (out, weights)", case
            )
        out = self._check_array(res[0], "output", case.out_shape, case, inputs)
        w = self._check_array(res[1], "weights", case.weights_shape, case, inputs)
        return out, w

    def forward_with_lse(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        """(output, lse): the lse [B, Hq, T] in any float dtype (kernels keep it in float32)."""
        self.require(case)
        if not self.declaration.returns_lse:
            self.not_applicable("declares returns_lse=False")
        res, inputs = self._guarded(case, "forward_with_lse", lambda: self.adapter.forward_with_lse(case))
        if not (isinstance(res, tuple) and len(res) == 2):
            raise AdapterError(f"{self.name}.forward_with_lse returned {type(res).__name__}, not (out, lse)", case)
        out = self._check_array(res[0], "output", case.out_shape, case, inputs)
        lse = res[1]
        if not isinstance(lse, np.ndarray) or lse.dtype.kind != "f":
            raise AdapterError(
                f"{self.name}: lse is {type(lse).__name__} {getattr(lse, 'dtype', '')}, not a float array", case
            )
        if lse.shape != (case.B, case.Hq, case.T):
            raise AdapterError(f"{self.name}: lse.shape={lse.shape}, but should be {(case.B, case.Hq, case.T)}", case)
        return out, lse

    def vjp(self, case: Case, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.require(case)
        if not self.declaration.grad:
            self.not_applicable("declares grad=False")
        res, inputs = self._guarded(
            case, "vjp", lambda: self.adapter.vjp(case, grad_out), extra_inputs=(("grad_out", grad_out),)
        )
        asked = grads_asked(case)
        want = 4 if "bias" in asked else 3
        if not (isinstance(res, tuple) and len(res) == want):
            shape = "(dq, dk, dv, dbias)" if want == 4 else "(dq, dk, dv)"
            raise AdapterError(f"{self.name}.vjp returned {type(res).__name__}, not {shape}", case)
        out = []
        for g, n, name in zip(res, ("dq", "dk", "dv"), ("query", "key", "value")):
            arr = getattr(case, name)
            # an input that did not ask for its gradient gets None (torch's answer) or an array that is not judged
            out.append(self._check_array(g, n, arr.shape, case, inputs) if name in asked else None)
        if want == 4:
            db = res[3]
            if not isinstance(db, np.ndarray) or db.shape != np.shape(case.bias) or dtype_name(db.dtype) not in DTYPES:
                raise AdapterError(
                    f"{self.name}: dbias is {type(db).__name__} {getattr(db, 'shape', '')}, but should be a float "
                    f"array of the additive M's shape {np.shape(case.bias)}",
                    case,
                )
            out.append(db)
        return tuple(out)  # type: ignore[return-value]

    # -- transforms (conformance/contract.py: ``transforms``, ``jvp``, ``vjp_vjp``, ``jvp_vjp``, ``vmap_forward``,
    # ``fake_forward``)
    def _transform(self, kind: str, case: Case, call: Callable[[], Any], extra_inputs: tuple = ()) -> Any:
        """Ask the kernel for transform ``kind`` on ``case``: not applicable when the adapter does not offer it;
        a refusal (:data:`TRANSFORM_REFUSALS`) is recorded in ``transforms_seen`` (the run's transforms line,
        harness.run.transforms) and makes the clause not applicable with the kernel's words, never a failure
        and never silent; any other exception fails the clause as every call does."""
        self.require(case)
        method = TRANSFORM_METHODS[kind]
        if kind not in getattr(self.adapter, "transforms", ()) or not callable(getattr(self.adapter, method, None)):
            self.not_applicable(
                f"the adapter does not ask its kernel for {TRANSFORM_WORDS[kind]} (its `transforms` does not name "
                f"{kind!r})"
            )
        refused: list[BaseException] = []

        def attempt() -> Any:
            try:
                return call()
            except Exception as exc:  # a refusal is a capability; anything else is judged by _guarded
                if kind in ("vmap", "vmap_vjp") and case.dropout_p == 0 and RANDOM_UNDER_VMAP.search(str(exc)):
                    raise KernelFault(
                        "under vmap, with dropout off, the kernel draws random numbers (the framework stopped it: "
                        f"{(str(exc).splitlines() or [''])[0][:120]}): a call without dropout must not touch a "
                        "generator"
                    ) from exc
                if not is_transform_refusal(exc):
                    raise
                refused.append(exc)
                return None

        res, inputs = self._guarded(case, method, attempt, extra_inputs)
        detail = ""
        if refused:
            exc = refused[0]
            detail = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}".rstrip(": ")
        seen = self.__dict__.setdefault("transforms_seen", [])
        seen.append({"transform": kind, "dtype": case.dtype, "outcome": "refused" if refused else "answered",
                     "detail": detail})  # fmt: skip
        if refused:
            self.not_applicable(
                f"the kernel refuses {TRANSFORM_WORDS[kind]} ({detail}): {MEASURED_CAPABILITY}, listed on the "
                "run's transforms line"
            )
        return res, inputs

    def jvp(self, case: Case, tangents: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(out, tangent_out) of forward-mode AD along ``tangents`` ({input name: array})."""
        extra = tuple((f"tangent of {n}", a) for n, a in tangents.items())
        res, inputs = self._transform("jvp", case, lambda: self.adapter.jvp(case, tangents), extra)
        if not (isinstance(res, tuple) and len(res) == 2):
            raise AdapterError(f"{self.name}.jvp returned {type(res).__name__}, not (out, tangent_out)", case)
        out = self._check_array(res[0], "output", case.out_shape, case, inputs)
        return out, self._check_array(res[1], "tangent of the output", case.out_shape, case, inputs)

    def vjp_vjp(self, case: Case, grad_out: np.ndarray, w: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The gradient with respect to Q, K, V of <vjp(grad_out), w> by a double backward."""
        extra = tuple((f"w of {n}", a) for n, a in zip(("query", "key", "value"), w))
        call = lambda: self.adapter.vjp_vjp(case, grad_out, w)  # noqa: E731
        return self._second_order("vjp_vjp", case, grad_out, call, extra, "(d2q, d2k, d2v)", "second derivative of")

    def jvp_vjp(
        self, case: Case, grad_out: np.ndarray, tangents: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tangent of the VJP (dQ, dK, dV for ``grad_out``) along ``tangents`` of Q, K, V, by forward-mode AD
        of the backward."""
        extra = tuple((f"tangent of {n}", a) for n, a in tangents.items())
        call = lambda: self.adapter.jvp_vjp(case, grad_out, tangents)  # noqa: E731
        what = "tangent of the gradient of"
        return self._second_order("jvp_vjp", case, grad_out, call, extra, "(dq', dk', dv')", what)

    def _second_order(
        self, kind: str, case: Case, grad_out: np.ndarray, call: Callable[[], Any], extra: tuple, form: str, what: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A second-order transform's three arrays (one per Q, K, V, in their shapes), asked by ``call``."""
        if not self.declaration.grad:
            self.not_applicable("declares grad=False")
        res, inputs = self._transform(kind, case, call, (("grad_out", grad_out), *extra))
        if not (isinstance(res, tuple) and len(res) == 3):
            raise AdapterError(f"{self.name}.{kind} returned {type(res).__name__}, not {form}", case)
        return tuple(  # type: ignore[return-value]
            self._check_array(g, f"{what} {n}", getattr(case, n).shape, case, inputs)
            for g, n in zip(res, ("query", "key", "value"))
        )

    def vmap_forward(self, cases: list[Case]) -> np.ndarray:
        """The kernel under its framework's vmap over a leading axis of ``cases`` (alike but for Q, K, V)."""
        for c in cases[1:]:
            self.require(c)
        names = ("query", "key", "value")
        extra = tuple((f"{n} of case {i}", getattr(c, n)) for i, c in enumerate(cases[1:], 1) for n in names)
        res, inputs = self._transform("vmap", cases[0], lambda: self.adapter.vmap_forward(cases), extra)
        return self._check_array(res, "vmapped output", (len(cases), *cases[0].out_shape), cases[0], inputs)

    def vmap_vjp(self, cases: list[Case], grad_outs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kernel's VJP under its framework's vmap over a leading axis of ``cases`` (alike but for Q, K, V)
        and their cotangents: each input's per-item gradients, stacked."""
        if not self.declaration.grad:
            self.not_applicable("declares grad=False")
        for c in cases[1:]:
            self.require(c)
        names = ("query", "key", "value")
        extra = tuple((f"{n} of case {i}", getattr(c, n)) for i, c in enumerate(cases[1:], 1) for n in names)
        extra += tuple((f"grad_out of case {i}", g) for i, g in enumerate(grad_outs))
        call = lambda: self.adapter.vmap_vjp(cases, grad_outs)  # noqa: E731
        res, inputs = self._transform("vmap_vjp", cases[0], call, extra)
        if not (isinstance(res, tuple) and len(res) == 3):
            raise AdapterError(f"{self.name}.vmap_vjp returned {type(res).__name__}, not (dq, dk, dv)", cases[0])
        return tuple(  # type: ignore[return-value]
            self._check_array(
                g, f"vmapped gradient of {n}", (len(cases), *getattr(cases[0], n).shape), cases[0], inputs
            )
            for g, n in zip(res, names)
        )

    def fake_forward(self, case: Case) -> tuple[tuple[int, ...], str]:
        """(shape, dtype name) of the kernel's forward on fake tensors (shape, dtype and device, no data). Only
        the answer's form is checked here; whether it is the case's is the clause's to judge."""
        res, _ = self._transform("fake", case, lambda: self.adapter.fake_forward(case))
        shape, dtype = res if isinstance(res, tuple) and len(res) == 2 else (None, None)
        if not (isinstance(shape, tuple) and all(isinstance(n, int) for n in shape) and isinstance(dtype, str)):
            raise AdapterError(f"{self.name}.fake_forward returned {res!r}, not (shape tuple, dtype name)", case)
        return shape, dtype


# The transforms' adapter methods and words (conformance/contract.py: TRANSFORMS).
TRANSFORM_METHODS = {
    "jvp": "jvp",
    "vjp_vjp": "vjp_vjp",
    "jvp_vjp": "jvp_vjp",
    "vmap": "vmap_forward",
    "fake": "fake_forward",
    "vmap_vjp": "vmap_vjp",
}
TRANSFORM_WORDS = {
    "jvp": "forward-mode AD",
    "vjp_vjp": "a double backward",
    "jvp_vjp": "forward-mode AD of the backward",
    "vmap": "vmap",
    "fake": "fake tensors (shape, dtype and device without data, as torch.compile traces a call)",
    "vmap_vjp": "vmap of the backward (per-example gradients)",
}
# What a framework raises for a transform it has no rule for: an exception of a class that says so
# (NotImplementedError, the contract's NotApplicable), or a RuntimeError / TypeError / ValueError in the
# framework's own words for a missing rule (torch: "derivative for aten::... is not implemented", "Batching rule
# not implemented", "vmap: ... not supported"; jax: "can't apply forward-mode autodiff (jvp) to a custom_vjp
# function", "Differentiation rule for '...' not implemented", "Batching rule for '...' not implemented";
# a trace that meets data-dependent code: "data-dependent", "Cannot access data pointer"). Any other exception
# under a transform is a kernel that broke there: it fails the clause, as every call does.
TRANSFORM_REFUSALS = frozenset({"NotImplementedError", "NotApplicable"})
# vmap's words for a random draw in its default randomness mode (torch: "vmap: called random operation while in
# randomness error mode"; jax has no global generator): a refusal only where the case asks for dropout.
RANDOM_UNDER_VMAP = re.compile(r"random operation while in randomness error mode", re.IGNORECASE)
TRANSFORM_REFUSAL_CLASSES = frozenset({"RuntimeError", "TypeError", "ValueError"})
TRANSFORM_REFUSAL_WORDS = re.compile(
    r"not implemented|not supported|does not support|doesn't support|no (batching|differentiation) rule"
    r"|can't apply forward-mode|forward-mode autodiff|data-dependent|data dependent|Cannot access data pointer"
    r"|cannot be called on meta|can't vmap|vmap: ",
    re.IGNORECASE,
)


def is_transform_refusal(exc: BaseException) -> bool:
    """True when ``exc`` says the kernel has no such transform: by its class (any class of its MRO named in
    :data:`TRANSFORM_REFUSALS`), or a RuntimeError / TypeError / ValueError whose message is the framework's words
    for a missing rule (:data:`TRANSFORM_REFUSAL_WORDS`); a :class:`KernelFault` (a wrong answer the adapter saw)
    never is."""
    if isinstance(exc, KernelFault):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & TRANSFORM_REFUSALS:
        return True
    return bool(names & TRANSFORM_REFUSAL_CLASSES) and bool(TRANSFORM_REFUSAL_WORDS.search(str(exc)))

"""Discovery's capability and limit probes: what runs (dtypes, grad, dropout, GQA, scale) and where it stops.

Each probe takes the shared :class:`~conformance.harness.discovery.probing.Probing` state and records one
field. The rule for a capability: rejected (refused, or raised a declared ``rejects_with`` class) -> not
supported; crashed (raised anything else, hung, returned a wrong shape) -> the declared value kept and a
finding (``Probing.crashed``); ran and matched the oracle with
the feature -> supported; ran and matched the oracle *without* it (the argument ignored) -> not
supported, the evidence says "ignored"; ran and matched neither -> supported, with a finding: declaring
it unsupported would hide a wrong answer behind "not applicable". Witnesses are ``harness.cases.build``
random cases (fixed seeds), so every run and every xdist worker probes the same inputs.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import DTYPES, Case, dtype_name, np_dtype
from conformance.harness.cases.build import random_case
from conformance.harness.covering.build import at_alignment, offset_view
from conformance.harness.discovery import witness as w
from conformance.harness.discovery.probing import Probing

HEAD_DIMS = (64, 128, 256, 512)


def base(p: Probing, seed: int, dtype: str | None = None, **kw) -> Case:
    shape = dict(B=1, Hq=2, T=3, S=5, Dk=8)
    shape.update({k: kw.pop(k) for k in list(kw) if k in ("B", "Hq", "Hkv", "T", "S", "Dk", "Dv")})
    return random_case(seed, dtype=dtype or p.dtype, **shape, **kw)


def dtypes(p: Probing) -> bool:
    """Records ``dtypes`` and picks the working dtype; False when no dtype runs (nothing else can be probed)."""
    if p.pinned_here("dtypes"):
        ran = sorted(p.decl.dtypes, key=DTYPES.index)
    else:
        ran, crashing, notes = [], [], []
        for dt in DTYPES:
            case = base(p, 1, dt)
            o = p.forward(case)
            if not o.ok:
                notes.append(f"{dt} {o.error}")
                if dt in p.decl.dtypes and p.crashed(o, f"{dt} inputs"):
                    crashing.append(dt)
                    notes[-1] += " (a crash: kept)"
                continue
            ran.append(dt)
            e = w.err(o.value, w.reference(case))
            tol = w.MATCH["float32" if dt == "float64" else dt]  # float64 computed in float32 has its own probe
            if dtype_name(o.value.dtype) != dt:
                p.finding(
                    f"{dt} inputs give {dtype_name(o.value.dtype)} outputs (the contract returns the input dtype)"
                )
            if not e <= tol:
                p.finding(f"{dt}: the plain witness (no mask, no causal) differs from the oracle, err {w.fmt(e)}")
            notes.append(f"{dt} ran (err {w.fmt(e)})")
        p.record("dtypes", frozenset(ran + crashing), "; ".join(notes))
    if not ran:
        p.finding("no dtype ran: nothing else could be probed")
        return False
    p.dtype = "float32" if "float32" in ran else ran[0]
    return True


def capability(p: Probing, name: str, case: Case, without: Case, what: str) -> None:
    """The rule of the module docstring for one feature: ``case`` uses it, ``without`` is the same case without it."""
    if p.pinned_here(name):
        return
    o = p.forward(case)
    if not o.ok:
        p.failed(name, o, what)
        return
    e, e_without = w.err(o.value, w.reference(case)), w.err(o.value, w.reference(without))
    if p.matches(e):
        p.record(name, True, f"{what} matched the oracle (err {w.fmt(e)}; without it err {w.fmt(e_without)})")
    elif p.matches(e_without):
        p.record(name, False, f"{what} ran and was ignored: matched the oracle without it (err {w.fmt(e_without)})")
    else:
        p.record(name, True, f"{what} ran, matched neither (err {w.fmt(e)}; without it {w.fmt(e_without)})")
        p.finding(f"{what} gives an output that is neither the oracle's (err {w.fmt(e)}) nor the one without it")


def grad(p: Probing) -> None:
    if p.pinned_here("grad"):
        return
    case = base(p, 2)
    g = np.random.default_rng(2).standard_normal(case.out_shape).astype(np_dtype(p.dtype))
    o = p.vjp(case, g)
    if not o.ok:
        p.failed("grad", o, "vjp")
        return
    from conformance import oracle

    errs = [w.err(got, want) for got, want in zip(o.value, oracle.vjp(case, g))]
    text = ", ".join(f"d{n} err {w.fmt(e)}" for n, e in zip("qkv", errs))
    p.record("grad", True, f"vjp ran: {text}")
    if not all(p.matches(e) for e in errs):
        p.finding(f"gradients differ from the oracle's VJP ({text})")


def dropout(p: Probing) -> None:
    """V = I makes the output the dropped weight matrix itself: kept entries are weights / (1 - p)."""
    if p.pinned_here("dropout"):
        return
    S, rate = 8, 0.5
    plain = base(p, 3, T=4, S=S, Dk=S)
    eye = np.ascontiguousarray(np.broadcast_to(np.eye(S), plain.value.shape).astype(plain.value.dtype))
    plain = plain.replace(value=eye)
    case = plain.replace(dropout_p=rate, seed=7)
    what = f"dropout_p={rate} (V = I, T=4, S={S})"
    o = p.forward(case)
    if not o.ok:
        p.failed("dropout", o, what)
        return
    a, weights = np.asarray(o.value, dtype=np.float64), w.reference(plain)
    if p.matches(w.err(a, weights)):
        p.record("dropout", False, f"{what} ran and was ignored: the output is the undropped weights")
        return
    kept = a != 0
    e = w.err(np.where(kept, a, 0), np.where(kept, weights / (1 - rate), 0))
    if 0.15 < kept.mean() < 0.85 and p.matches(e):
        again = p.forward(case)
        same = again.ok and np.array_equal(again.value, o.value)
        p.record(
            "dropout",
            True,
            f"{what}: kept {kept.mean():.0%}, each weight / (1 - p) (err {w.fmt(e)}); "
            f"same seed {'repeats' if same else 'does NOT repeat'}",
        )
        if not same:
            p.finding(
                "dropout with the same seed drew a different mask: the suite replays a forward's mask by its seed"
            )
        return
    p.record("dropout", True, f"{what} ran: kept {kept.mean():.0%}, kept weights vs weights / (1 - p) err {w.fmt(e)}")
    p.finding(f"{what} does not give the dropped softmax scaled by 1/(1 - p)")


def gqa(p: Probing) -> None:
    if p.pinned_here("gqa"):
        return
    case = base(p, 4, Hq=4, Hkv=2)
    what = "Hq=4, Hkv=2"
    o = p.forward(case)
    if not o.ok:
        p.failed("gqa", o, what)
        return
    e = w.err(o.value, w.reference(case))
    modulo = w.err(o.value, w.reference(case.replace(key=case.key[:, [0, 1, 0, 1]], value=case.value[:, [0, 1, 0, 1]])))
    p.record("gqa", True, f"{what}: head h -> kv head h // 2 err {w.fmt(e)}, h % 2 err {w.fmt(modulo)}")
    if not p.matches(e):
        how = "query head h to kv head h % Hkv" if p.matches(modulo) else "query heads to kv heads in no known way"
        p.finding(f"GQA maps {how}; the contract's (torch's, jax's) mapping is h // (Hq / Hkv)")


def custom_scale(p: Probing) -> None:
    case = base(p, 5, scale=2.0)
    capability(p, "custom_scale", case, case.replace(scale=None), "scale=2.0 (default 1/sqrt(8) = 0.354)")


CAPABILITIES = (grad, dropout, gqa, custom_scale)


# -- limits -------------------------------------------------------------------------------------
def max_head_dim(p: Probing) -> None:
    if p.pinned_here("max_head_dim"):
        return
    largest, notes = 8, []
    for d in HEAD_DIMS:
        case = base(p, 7, B=1, Hq=1, T=2, S=3, Dk=d)
        o = p.forward(case)
        if not o.ok:
            notes.append(f"{d} {o.error}")
            if p.crashed(o, f"head dim {d}"):
                p.keep("max_head_dim", "kept: " + "; ".join(notes) + " (a crash, not a rejection)")
                return
            break
        e = w.err(o.value, w.reference(case))
        notes.append(f"{d} ran (err {w.fmt(e)})")
        if not p.matches(e):
            p.finding(f"head dim {d} runs but differs from the oracle (err {w.fmt(e)})")
        largest = d
    limit = None if largest == HEAD_DIMS[-1] else largest
    p.record("max_head_dim", limit, "; ".join(notes) + ("" if limit else f" (none refused up to {largest})"))


def requires_dk_eq_dv(p: Probing) -> None:
    if p.pinned_here("requires_dk_eq_dv"):
        return
    case = base(p, 8, Dk=8, Dv=12)
    o = p.forward(case)
    if not o.ok:
        p.failed("requires_dk_eq_dv", o, "Dk=8, Dv=12", off=True)
        return
    e = w.err(o.value, w.reference(case))
    p.record("requires_dk_eq_dv", False, f"Dk=8, Dv=12 ran (err {w.fmt(e)})")
    if not p.matches(e):
        p.finding(f"Dk=8, Dv=12 runs but differs from the oracle (err {w.fmt(e)})")


def deterministic(p: Probing) -> None:
    if p.pinned_here("deterministic"):
        return
    case = base(p, 9, B=2, Hq=2, T=64, S=96, Dk=64)
    outs = [p.forward(case) for _ in range(2)]
    if not all(o.ok for o in outs):
        p.keep("deterministic", f"B=2 H=2 T=64 S=96 D=64: {next(o.error for o in outs if not o.ok)}")
        return
    same = np.array_equal(outs[0].value, outs[1].value, equal_nan=True)
    notes = [f"forward twice on B=2 H=2 T=64 S=96 D=64: {'bitwise equal' if same else 'differs'}"]
    if p.decl.grad:
        g = np.random.default_rng(9).standard_normal(case.out_shape).astype(np_dtype(p.dtype))
        grads = [p.vjp(case, g) for _ in range(2)]
        if all(o.ok for o in grads):
            equal = all(np.array_equal(x, y, equal_nan=True) for x, y in zip(grads[0].value, grads[1].value))
            notes.append(f"vjp twice: {'bitwise equal' if equal else 'differs'}")
            same = same and equal
    p.record("deterministic", same, "; ".join(notes))


def _transposed_view(x: np.ndarray) -> np.ndarray:
    """The values of ``x`` as a view whose last two axes are stored transposed (a projection's output)."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)


def layout_invariant(p: Probing) -> None:
    """Whether the same numbers in other memory give the same bits: the query, key and value at 1 to 15 elements
    past a 64-byte boundary, as views into a larger buffer and as transposed views, against the same case on a
    64-byte boundary. Reported as a note, not declared: the author's claim to make (``layout_invariant=true``)."""
    if p.pinned_here("layout_invariant"):
        return
    if not p.decl.deterministic:
        p.note("layout_invariant", "false", "not deterministic: a repeated call already differs")
        return
    case = base(p, 10, B=2, Hq=2, T=16, S=40, Dk=24)
    names = ("query", "key", "value")
    aligned = case.replace(**{n: at_alignment(getattr(case, n)) for n in names})
    first = p.forward(aligned)
    if not first.ok:
        p.note("layout_invariant", "not measured", f"B=2 H=2 T=16 S=40 D=24 on a 64-byte boundary: {first.error}")
        return
    moved_by = []
    for k in range(1, 16):
        moved = case.replace(**{n: at_alignment(getattr(case, n), k * getattr(case, n).itemsize) for n in names})
        o = p.forward(moved)
        if o.ok and not np.array_equal(o.value, first.value, equal_nan=True):
            moved_by.append(str(k))
    differ = [f"{', '.join(moved_by)} element(s) past a 64-byte boundary"] if moved_by else []
    for what, view in (("views into a larger buffer", offset_view), ("transposed views", _transposed_view)):
        o = p.forward(case.replace(**{n: view(getattr(case, n)) for n in names}))
        if o.ok and not np.array_equal(o.value, first.value, equal_nan=True):
            differ.append(what)
    same = not differ
    evidence = (
        "Q, K, V at 1 to 15 elements past a 64-byte boundary, as offset views and as transposed views: bitwise equal"
        if same
        else f"bits differ from the 64-byte-aligned call with Q, K, V at {'; as '.join(differ)}"
    )
    # Reported, never claimed: bits measured on this CPU need not hold on another (a vector width or a BLAS core
    # type picks other blocking), so a kernel is held to layout invariance only when its author declares it.
    if same:
        evidence += (
            " on this host; not claimed (bits on one CPU need not hold on another): --declare it to be held to it"
        )
    p.note("layout_invariant", "true here" if same else "false", evidence)


LIMITS = (max_head_dim, requires_dk_eq_dv, deterministic, layout_invariant)

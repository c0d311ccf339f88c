"""Wrong kernels generated from the NumPy reference kernel: a trigger times a perturbation.

Why generated: hand-written mutants are the bugs their author thought of; a suite's coverage claim is
only as good as the bugs it was measured against. Here a *trigger* is a conjunction of 1 to 3
predicates over the value-class table (``harness.covering.table``: "mask form is [1,H,T,S]", "Dk is
above 64, not a multiple of 32", ...) or "called before with the same shapes" (a kernel's per-shape
state), and a *perturbation* is one way real kernels go wrong (a wrong scale, a mask dropped or read
for the wrong head, a wrong fill, causal misaligned, a head or batch mixed, a term of the backward
wrong, precision lost, ...). A mutant is the correct kernel (``tests.mutants_features.DropoutKernel``:
the base of ``tests/mutants.py`` with inverted dropout and the backward of the dropped forward) except
where its trigger holds: there it applies its perturbation. ``scripts/mutant_kill_rates.py`` samples
them, certifies each in-process and prints the kill rate per arity and per perturbation.

They live in tests/, not in the product package: they are kernels written to be wrong, for measuring
the suite, and the package ships only what certifies a user's kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from conformance.contract import Case, np_dtype
from conformance.harness.covering.table import BY_NAME as TABLE
from conformance.harness.covering.table import PARAMETERS, Call, memory_form
from tests.mutants_features import DropoutKernel

AGAIN = ("called before", "with the same shapes")  # the predicate a kernel's per-shape state makes
PREDICATE_PARAMETERS = tuple(p.name for p in PARAMETERS if p.name != "call")


@dataclass(frozen=True)
class Perturbation:
    """One way to be wrong: ``direction`` it acts in, and what a case needs for it to change anything
    (``needs``: alternatives, each the classes that must meet; empty: any case)."""

    name: str
    direction: str
    needs: tuple[dict[str, str], ...]
    acts_on: tuple[str, ...] = ()  # the parameters whose content it changes (a value hiding one makes it inert)
    inert: tuple[tuple[str, str], ...] = ()  # values under which it changes nothing by construction


def _any(param: str, values: tuple[str, ...]) -> tuple[dict[str, str], ...]:
    return tuple({param: v} for v in values)


_WIDE_DV = tuple(
    {"Dk": k, "Dv": dv} for k in ("128", "160", "256", "above 64, not a multiple of 32") for dv in ("= Dk", "> Dk")
) + ({"Dk": "64", "Dv": "> Dk"},)  # Dv > 64


_MASKS = ("[T,S]", "[B,1,1,S]", "[B,1,T,S]", "[1,H,T,S]", "[B,H,T,S]", "[S]", "[H,T,S]", "[B,H,T,S], stride 0 along H")
PERTURBATIONS: tuple[Perturbation, ...] = (
    Perturbation("scale off by 10 %", "forward", (), ("scale",), (("scale", "zero"),)),
    Perturbation("boolean mask dropped", "forward", _any("mask form", _MASKS)),
    Perturbation("mask read for the next head", "forward", _any("mask form", ("[1,H,T,S]", "[B,H,T,S]", "[H,T,S]"))),
    Perturbation(
        "mask read for the next batch item", "forward", _any("mask form", ("[B,1,1,S]", "[B,1,T,S]", "[B,H,T,S]"))
    ),
    Perturbation(
        "finite M dropped", "forward", _any("additive M", ("finite small", "finite large negative on whole rows"))
    ),
    Perturbation(
        "rows blocked entirely give the mean of V", "forward", _any("mask content", ("rows blocked entirely",))
    ),
    Perturbation("causal off by one (diagonal blocked)", "forward", _any("causal", ("on",))),
    Perturbation("causal aligned bottom-right", "forward", _any("causal", ("on",))),
    Perturbation("query heads mixed", "forward", (), ("Dk",)),  # Q's content: hidden where Dk is
    Perturbation("batch items mixed", "forward", _any("B", ("2", "5 or more", "equal to H")), ("B",)),
    Perturbation("precision lost (bfloat16 products)", "forward", _any("dtype", ("float64", "float32"))),
    Perturbation("last key dropped", "forward", ()),
    Perturbation("keys past 256 dropped", "forward", _any("S", ("long",))),
    Perturbation("last query row zeroed", "forward", ()),
    Perturbation("value columns past 64 zeroed", "forward", _WIDE_DV),
    Perturbation("dropout not rescaled", "forward", _any("dropout", ("on",))),
    Perturbation("dQ without the scale", "backward", ()),
    Perturbation("dK doubled", "backward", (), ("Dk",), (("scale", "zero"),)),  # dK carries the scale
    Perturbation("softmax row term dropped", "backward", ()),
    Perturbation("dV off by 10 %", "backward", ()),
    Perturbation("backward ignores dropout", "backward", _any("dropout", ("on",))),
)
BY_NAME = {p.name: p for p in PERTURBATIONS}


@dataclass(frozen=True)
class Spec:
    """A generated mutant: the predicates of its trigger and its perturbation."""

    trigger: tuple[tuple[str, str], ...]  # (parameter, value) or AGAIN
    perturbation: str

    @property
    def name(self) -> str:
        return (
            " & ".join(
                f"{p}: {v}" if (p, v) != AGAIN else "called before with the same shapes" for p, v in self.trigger
            )
            + f" -> {self.perturbation}"
        )

    @property
    def arity(self) -> int:
        return len(self.trigger)


def _roll(a: np.ndarray, axis: int) -> np.ndarray:
    return np.roll(a, 1, axis=axis)


class Generated(DropoutKernel):
    """The correct NumPy kernel, wrong by ``spec.perturbation`` wherever ``spec.trigger`` holds."""

    def __init__(self, spec: Spec):
        super().__init__(spec.name)
        # a NumPy kernel reads the case's arrays as they are: their memory and which is one object reach it
        self.declaration = self.declaration.replace(presents=frozenset({"memory", "identity"}))
        self.spec = spec
        self._seen: set = set()

    def _fires(self, case: Case, direction: str, grad_out: np.ndarray | None = None) -> bool:
        shapes = (case.query.shape, case.key.shape, case.value.shape, case.dtype)
        before = shapes in self._seen
        self._seen.add(shapes)
        how = Call(direction, cotangent="contiguous" if grad_out is None else memory_form(grad_out))
        for p, v in self.spec.trigger:
            if (p, v) == AGAIN:
                if not before:
                    return False
            elif not TABLE[p].value(v).holds(case, how):  # classes overlap (T = 5 is odd and < S): "is in", not "first"
                return False
        return True

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, case: Case) -> np.ndarray:
        pert = BY_NAME[self.spec.perturbation]
        if pert.direction != "forward" or not self._fires(case, "forward"):
            return super().forward(case)
        return _FORWARD[pert.name](self, case)

    def vjp(self, case: Case, grad_out: np.ndarray):
        pert = BY_NAME[self.spec.perturbation]
        if pert.direction != "backward" or not self._fires(case, "backward", grad_out):
            return super().vjp(case, grad_out)
        return _BACKWARD[pert.name](self, case, grad_out)

    def plain(self, case: Case) -> np.ndarray:
        return DropoutKernel.forward(self, case)


def _full_mask(case: Case) -> np.ndarray | None:
    return None if case.mask is None else np.broadcast_to(np.asarray(case.mask, dtype=bool), case.weights_shape).copy()


def _with_blocked(k: Generated, case: Case, extra: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    full = _full_mask(case)
    base = np.zeros(case.weights_shape, dtype=bool) if full is None else full
    return k.plain(case.replace(mask=extra(base)))


def _finish(case: Case, out: np.ndarray) -> np.ndarray:
    return np.asarray(out, dtype=np.float64).astype(np_dtype(case.dtype))


def _mean_v_fill(k: Generated, case: Case) -> np.ndarray:
    out = np.asarray(k.plain(case), dtype=np.float64)
    blocked = k.blocked(case).all(axis=-1)
    v = k.expand(np.asarray(case.value, dtype=np.float64), case.Hq).mean(axis=-2)
    out[blocked] = np.broadcast_to(v[:, :, None, :], out.shape)[blocked]
    return _finish(case, out)


def _keys_from(case: Case, start: int) -> np.ndarray:
    m = np.zeros(case.weights_shape, dtype=bool)
    m[..., start:] = True
    return m


def _zero_last_row(k: Generated, case: Case) -> np.ndarray:
    out = np.array(k.plain(case))
    out[..., -1, :] = 0
    return out


def _zero_columns(k: Generated, case: Case) -> np.ndarray:
    out = np.array(k.plain(case))
    out[..., 64:] = 0
    return out


def _bf16(k: Generated, case: Case) -> np.ndarray:
    lowp = np_dtype("bfloat16")
    lossy = [np.asarray(x).astype(lowp).astype(np.asarray(x).dtype) for x in (case.query, case.key, case.value)]
    return k.plain(case.replace(query=lossy[0], key=lossy[1], value=lossy[2]))


def _causal_shift(k: Generated, case: Case, bottom_right: bool) -> np.ndarray:
    T, S = case.T, case.S
    off = (S - T) if bottom_right else -1
    tri = np.arange(S)[None, :] > np.arange(T)[:, None] + off
    return _with_blocked(k, case.replace(is_causal=False), lambda b: b | tri)


def _heads_mixed(k: Generated, case: Case) -> np.ndarray:
    return k.plain(case.replace(query=_roll(np.asarray(case.query), 1)))


def _batch_mixed(k: Generated, case: Case) -> np.ndarray:
    return k.plain(case.replace(key=_roll(np.asarray(case.key), 0), value=_roll(np.asarray(case.value), 0)))


def _dropout_not_rescaled(k: Generated, case: Case) -> np.ndarray:
    return _finish(case, np.asarray(k.plain(case), dtype=np.float64) * (1.0 - case.dropout_p))


def _finite_m_dropped(k: Generated, case: Case) -> np.ndarray:
    only_inf = np.where(np.isneginf(np.asarray(case.bias, dtype=np.float64)), -np.inf, 0.0)
    return k.plain(case.replace(bias=only_inf))


_FORWARD: dict[str, Callable[[Generated, Case], np.ndarray]] = {
    "scale off by 10 %": lambda k, c: k.plain(c.replace(scale=c.effective_scale * 1.1)),
    "boolean mask dropped": lambda k, c: k.plain(c.replace(mask=None)),
    "mask read for the next head": lambda k, c: k.plain(c.replace(mask=_roll(_full_mask(c), 1))),
    "mask read for the next batch item": lambda k, c: k.plain(c.replace(mask=_roll(_full_mask(c), 0))),
    "finite M dropped": _finite_m_dropped,
    "rows blocked entirely give the mean of V": _mean_v_fill,
    "causal off by one (diagonal blocked)": lambda k, c: _causal_shift(k, c, False),
    "causal aligned bottom-right": lambda k, c: _causal_shift(k, c, True),
    "query heads mixed": _heads_mixed,
    "batch items mixed": _batch_mixed,
    "precision lost (bfloat16 products)": _bf16,
    "last key dropped": lambda k, c: _with_blocked(k, c, lambda b: b | _keys_from(c, c.S - 1)),
    "keys past 256 dropped": lambda k, c: _with_blocked(k, c, lambda b: b | _keys_from(c, 256)),
    "last query row zeroed": _zero_last_row,
    "value columns past 64 zeroed": _zero_columns,
    "dropout not rescaled": _dropout_not_rescaled,
}


def _grads(k: Generated, case: Case, grad_out: np.ndarray):
    return DropoutKernel.vjp(k, case, grad_out)


def _scaled(case: Case, x: np.ndarray, f: float) -> np.ndarray:
    return (np.asarray(x, dtype=np.float64) * f).astype(np_dtype(case.dtype))


def _no_row_term(k: Generated, case: Case, grad_out: np.ndarray):
    dq, dk, dv = _grads(k, case, grad_out)
    p = k.backward_weights(case)
    q, kk, v = k.operands(case)
    do = np.asarray(grad_out, dtype=np.float64)
    ds = p * (do @ np.swapaxes(v, -1, -2))  # the - rowsum(dP * P) term left out
    g = case.Hq // case.Hkv
    dq2 = ds @ kk * k.scale(case)
    dk2 = (np.swapaxes(ds, -1, -2) @ q * k.scale(case)).reshape(case.B, case.Hkv, g, case.S, case.Dk).sum(axis=2)
    lowp = np_dtype(case.dtype)
    return dq2.astype(lowp), dk2.astype(lowp), dv


def _dq_unscaled(k: Generated, case: Case, grad_out: np.ndarray):
    """dQ = dS K, the scale left out (at scale 0 the right dQ is 0, this one is not)."""
    dq, dk, dv = _grads(k, case, grad_out)
    if case.effective_scale != 0:
        return _scaled(case, dq, 1.0 / case.effective_scale), dk, dv
    unit = case.replace(scale=1.0)
    p = k.backward_weights(case)
    q, kk, v = k.operands(case)
    do = np.asarray(grad_out, dtype=np.float64)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return _scaled(unit, ds @ kk, 1.0), dk, dv


_BACKWARD = {
    "dQ without the scale": _dq_unscaled,
    "dK doubled": lambda k, c, g: (lambda r: (r[0], _scaled(c, r[1], 2.0), r[2]))(_grads(k, c, g)),
    "softmax row term dropped": _no_row_term,
    "dV off by 10 %": lambda k, c, g: (lambda r: (r[0], r[1], _scaled(c, r[2], 1.1)))(_grads(k, c, g)),
    "backward ignores dropout": lambda k, c, g: DropoutKernel.vjp(k, c.replace(dropout_p=0.0), g),
}
assert set(_FORWARD) | set(_BACKWARD) == set(BY_NAME), sorted(set(BY_NAME) ^ (set(_FORWARD) | set(_BACKWARD)))


def sample(
    n: int,
    arity: int,
    seed: int,
    values: dict[str, list[str]],
    admits: Callable[[dict], bool],
    equivalent: Callable[[Spec], str] = lambda spec: "",
) -> list[Spec]:
    """``n`` distinct mutants whose triggers hold ``arity`` predicates, seeded.

    The arity counts every class the bug needs to show: a backward perturbation's trigger holds
    "direction: backward", and a perturbation that needs a class (a mask to drop, dropout to ignore)
    holds one of them; the rest are drawn (distinct parameters, a value each from ``values``, what the
    declaration admits; "called before with the same shapes" a tenth of the time). Kept only when
    ``admits`` finds a row holding the whole trigger (else it could never fire), and only when
    ``equivalent`` gives no reason why the perturbation changes nothing under the trigger (an
    equivalent mutant is no bug, and a kill rate counts bugs: :func:`inert_reason`)."""
    rng = np.random.default_rng(seed)
    out: list[Spec] = []
    seen: set = set()
    tries = 0
    while len(out) < n and tries < 200 * n:
        tries += 1
        pert = PERTURBATIONS[rng.integers(len(PERTURBATIONS))]
        trigger: dict[str, str] = {}
        if pert.direction == "backward":
            trigger["direction"] = "backward"
        if pert.needs:
            options = [alt for alt in pert.needs if all(v in values.get(p, ()) for p, v in alt.items())]
            alt = options[rng.integers(len(options))]
            if any(trigger.get(p, v) != v for p, v in alt.items()):
                continue
            trigger.update(alt)
        again = arity > len(trigger) and rng.random() < 0.1
        # a parameter the declaration admits one value of cannot restrict a trigger (it holds on every case)
        free = [p for p in PREDICATE_PARAMETERS if p not in trigger and len(values.get(p, ())) > 1]
        k = arity - len(trigger) - again
        if k < 0:
            continue
        for i in sorted(rng.choice(len(free), size=k, replace=False)):
            trigger[free[i]] = values[free[i]][rng.integers(len(values[free[i]]))]
        if pert.direction == "forward" and trigger.get("direction") == "backward":
            continue  # a forward bug never fires where the trigger asks for the backward
        order = {p: i for i, p in enumerate(PREDICATE_PARAMETERS)}
        items = tuple(sorted(trigger.items(), key=lambda kv: order[kv[0]])) + ((AGAIN,) if again else ())
        spec = Spec(items, pert.name)
        if spec in seen or not admits(trigger) or equivalent(spec):
            continue
        seen.add(spec)
        out.append(spec)
    return out


_BACKWARD_ONLY = {("backward calls", "twice over one graph")}


def inert_reason(spec: Spec, decl, defaults: dict[str, str]) -> str:
    """Why ``spec``'s perturbation cannot change anything under its trigger, when the perturbation
    itself (``inert``) or the hiding table (``harness.covering.hiding``: a value of the trigger hides
    a parameter the perturbation ``acts_on``) says so; "" when nothing says so. Such a mutant is
    equivalent to the correct kernel by construction: a scale 10 % off is still 0 at scale 0, one key
    has weight 1 whatever the scale."""
    from conformance.harness.covering import hiding

    pert = BY_NAME[spec.perturbation]
    plain = {p: v for p, v in spec.trigger if (p, v) != AGAIN}
    backward_only = [
        f"{p}: {v}" for p, v in plain.items() if (p, v) in _BACKWARD_ONLY or p == "cotangent" and v != "contiguous"
    ]
    if pert.direction == "forward" and backward_only:
        # the incoming gradient's layout and a second backward exist in the backward alone: a forward never sees them
        return f"equivalent: {pert.name} acts in the forward, which {backward_only[0]} never reaches"
    for item in pert.inert:
        if item in plain.items():
            return f"equivalent: {pert.name} changes nothing at {item[0]}: {item[1]}"
    row = {**defaults, **plain}
    hidden = hiding.predicted(row, decl, pert.direction)
    for p in pert.acts_on:
        for h in hidden.get((p, row[p]), []):
            if h <= set(plain.items()):
                by = " and ".join(f"{a}: {b}" for a, b in sorted(h))
                return f"equivalent: {by} hides {p}, which {pert.name} changes (docs/case-space.md)"
    return ""

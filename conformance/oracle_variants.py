"""The float64 oracle extended to the variants kernel authors ship: windows, softcap, ALiBi, the lse.

The seed defines ``softmax(QK^T / sqrt(d_k) + M) V``; FlashAttention's signature (and vLLM's, and
FlexAttention's score mods) adds four things a kernel can get wrong, each defined here once, in
float64, on the values the kernel receives, and each tested against per-query loops written
independently (tests/test_oracle_variants.py):

* **softcap** ``c > 0``: the scaled score ``s = scale * q·k`` becomes ``c * tanh(s / c)``, before
  any mask or bias (FlashAttention's reference ``attention_ref``: ``scores = torch.tanh(scores /
  softcap) * softcap`` right after the product; Gemma 2's logit soft-capping);
* **sliding window** ``(left, right)``: query i sees key j only when
  ``i + off - left <= j <= i + off + right``, a negative side unbounded, where ``off`` is 0 for a
  top-left and ``S - T`` for a bottom-right alignment (the kernel's declared causal alignment: the
  window slides along the same diagonal as its causal mask). With ``is_causal`` the two are united
  (FlashAttention sets ``right = 0`` under causal, which is the same set);
* **ALiBi**: slopes ``[Hq]`` or ``[B, Hq]`` add ``-slope[b, h] * |i + off - j|`` to the score of query
  i and key j (after the softcap, like any additive mask), one slope per *query* head;
* **log-sum-exp**: ``lse = log(sum_j exp(s_j))`` over the visible final scores of a row, in natural
  log; ``-inf`` on a row that sees no key.

Everything else (mask, additive bias, ``is_causal`` in the declared alignment, GQA head mapping,
all-blocked fills) is the base oracle's (:mod:`conformance.oracle`), reused, not rewritten.
:func:`lower` turns a variant case into a base case that means the same thing in float64 (the
window folded into the boolean mask, ALiBi and the softcap's change of each score into the
additive bias), which is how the harness sizes allowances for variant cases with the one error model.
:func:`vjp` is the backward (the softcap's derivative included) and sinks (``Case.sinks``) a term in
every row's denominator. The module is longer than most because forward, backward and lowering must
read the variants the same way; split, they would drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.contract import MEAN_V_BUFFER, Case
from conformance.oracle import Forward, backward, blocked_and_bias, expand_kv


@dataclass(frozen=True)
class VariantForward(Forward):
    """The base oracle's :class:`~conformance.oracle.Forward` plus the log-sum-exp of every row."""

    lse: np.ndarray | None = None  # [B, Hq, T] float64, natural log; -inf on rows that see no key


def _offset(T: int, S: int, alignment: str) -> int:
    if alignment not in ("top-left", "bottom-right"):
        raise ValueError(f"unknown causal alignment {alignment!r}")
    return 0 if alignment == "top-left" else S - T


def window_blocked(T: int, S: int, window: tuple[int, int], alignment: str = "top-left") -> np.ndarray:
    """[T, S] bool, True where query i may not see key j under the sliding window (left, right)."""
    left, right = (int(w) for w in window)
    off = _offset(T, S, alignment)
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    blocked = np.zeros((T, S), dtype=bool)
    if left >= 0:
        blocked |= j < i + off - left
    if right >= 0:
        blocked |= j > i + off + right
    return blocked


def alibi_slopes_for(n_heads: int) -> np.ndarray:
    """The ALiBi paper's slopes for ``n_heads`` heads (Press et al., 2022, and its reference code).

    For a power of two n: the geometric sequence starting at, and with ratio, 2^(-8/n). Otherwise
    the slopes of the nearest lower power of two m, followed by every other slope of 2m (the case
    kernels that assume a power of two get wrong). Clauses feed these as inputs; this is the
    customary choice of values, not part of what a kernel computes.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads={n_heads} must be positive")

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    m = 1 << (n_heads.bit_length() - 1)
    if m == n_heads:
        return np.array(pow2(n_heads))
    return np.array(pow2(m) + pow2(2 * m)[0::2][: n_heads - m])


def alibi_bias(slopes: np.ndarray, B: int, Hq: int, T: int, S: int, alignment: str = "top-left") -> np.ndarray:
    """[B, Hq, T, S] float64: ``-slope[b, h] * |i + off - j|``; slopes of shape [Hq] or [B, Hq]."""
    sl = np.asarray(slopes, dtype=np.float64)
    if sl.shape == (Hq,):
        sl = np.broadcast_to(sl, (B, Hq))
    if sl.shape != (B, Hq):
        raise ValueError(f"alibi_slopes of shape {list(np.shape(slopes))}; expected [{Hq}] or [{B}, {Hq}]")
    off = _offset(T, S, alignment)
    dist = np.abs(np.arange(T)[:, None] + off - np.arange(S)[None, :]).astype(np.float64)
    return -sl[:, :, None, None] * dist


def lengths(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(query lengths [B], key lengths [B]): ``seqlens_q`` / ``seqlens_k``, or T and S for every sequence."""
    tq = np.full(case.B, case.T) if case.seqlens_q is None else np.asarray(case.seqlens_q, dtype=np.int64)
    sk = np.full(case.B, case.S) if case.seqlens_k is None else np.asarray(case.seqlens_k, dtype=np.int64)
    if tq.shape != (case.B,) or sk.shape != (case.B,):
        raise ValueError(f"seqlens of shapes {tq.shape}, {sk.shape}; expected [{case.B}]")
    if (tq < 0).any() or (tq > case.T).any() or (sk < 0).any() or (sk > case.S).any():
        raise ValueError(f"seqlens_q {tq.tolist()} / seqlens_k {sk.tolist()} outside [0, T={case.T}] / [0, S={case.S}]")
    return tq, sk


def padding(case: Case) -> np.ndarray:
    """[B, T] bool: query rows past their sequence's length (no part of the result)."""
    tq, _ = lengths(case)
    return np.arange(case.T)[None, :] >= tq[:, None]


def positions(case: Case, alignment: str) -> np.ndarray:
    """[B, T, 1]: each query's place on its own sequence's key axis, i + off_b, with off_b = S_b - T_b
    (bottom-right) or 0 (top-left), S_b and T_b the sequence's own lengths."""
    tq, sk = lengths(case)
    off = sk - tq if _offset(1, 2, alignment) else np.zeros(case.B, dtype=np.int64)
    return (np.arange(case.T)[None, :] + off[:, None])[:, :, None]


def scores(case: Case, causal_alignment: str = "top-left") -> tuple[np.ndarray, np.ndarray]:
    """(final scores, blocked), both [B, Hq, T, S]: softcapped scaled products plus the additive
    bias and ALiBi; blocked is the union of mask, causal, ``-inf`` bias, window and, for variable
    lengths, every key past its sequence's end and every padded query row. Positions (causal,
    window, ALiBi) are each sequence's own. Scores at blocked positions are finite and meaningless."""
    q = np.asarray(case.query).astype(np.float64)
    k = expand_kv(np.asarray(case.key).astype(np.float64), case.Hq)
    s = np.einsum("bhtd,bhsd->bhts", q, k) * case.effective_scale
    if case.softcap:
        c = float(case.softcap)
        s = c * np.tanh(s / c)
    blocked, bias = blocked_and_bias(case.replace(is_causal=False), causal_alignment)
    pos = positions(case, causal_alignment)[:, None]  # [B, 1, T, 1]
    j = np.arange(case.S)[None, None, None, :]
    if case.is_causal:
        blocked |= j > pos
    if case.window is not None:
        left, right = (int(w) for w in case.window)
        if left >= 0:
            blocked |= j < pos - left
        if right >= 0:
            blocked |= j > pos + right
    if case.alibi_slopes is not None:
        sl = np.asarray(case.alibi_slopes, dtype=np.float64)
        if sl.shape not in ((case.Hq,), (case.B, case.Hq)):
            raise ValueError(f"alibi_slopes of shape {list(sl.shape)}; expected [{case.Hq}] or [{case.B}, {case.Hq}]")
        sl = np.broadcast_to(sl, (case.B, case.Hq))[:, :, None, None]
        bias = bias - sl * np.abs(pos - j)
    if case.seqlens_q is not None or case.seqlens_k is not None:
        _, sk = lengths(case)
        blocked |= j >= sk[:, None, None, None]
        blocked |= padding(case)[:, None, :, None]
    return s + bias, blocked


def sinks_for(case: Case) -> np.ndarray:
    """[B, Hq, T] float64: each query head's sink logit on every row (``Case.sinks`` is [Hq])."""
    sk = np.asarray(case.sinks, dtype=np.float64)
    if sk.shape != (case.Hq,):
        raise ValueError(f"sinks of shape {list(sk.shape)}; expected [{case.Hq}] (one logit per query head)")
    return np.broadcast_to(sk[None, :, None], (case.B, case.Hq, case.T))


def forward(case: Case, *, all_blocked: str = "zeros", causal_alignment: str = "top-left") -> VariantForward:
    """The float64 forward of a variant case (a base case gives the base oracle's answer).

    Padded query rows (variable lengths) are all-blocked but not the kernel's to fill: their output
    and weights are 0 and their lse -inf whatever the all-blocked policy. The ``mean-v`` fill of an
    empty row of a sequence averages that sequence's own keys; ``mean-v-buffer`` (a kernel declaring
    ``mean_v_keys="buffer"``) every slot of the padded key axis, as the lowered base case does.
    With sinks (``Case.sinks``, gpt-oss) every row's denominator has ``exp(sink_h)`` more, its
    weights sum to less than 1, its lse includes the sink, and a row that sees no key has weights 0
    and output 0 (the sink takes all of it): no all-blocked fill applies."""
    s, blocked = scores(case, causal_alignment)
    s = np.where(blocked, -np.inf, s)
    empty = blocked.all(axis=-1)
    row_max = np.where(empty, 0.0, s.max(axis=-1, initial=-np.inf))
    sink = None
    if case.sinks is not None:  # a key with logit sink_h and no value: in the denominator only
        sink = sinks_for(case)
        empty = np.zeros_like(empty)  # every row sees its sink: no fill applies, a keyless row gives 0
        row_max = np.maximum(row_max, sink)
    e = np.exp(s - row_max[..., None])
    denom = e.sum(axis=-1)
    if sink is not None:
        denom = denom + np.exp(sink - row_max)
    weights = np.divide(e, denom[..., None], out=np.zeros_like(e), where=denom[..., None] > 0)
    if all_blocked == "nan":
        weights[empty] = np.nan
    elif all_blocked == "mean-v":
        _, sk = lengths(case)
        keys = (np.arange(case.S)[None, :] < sk[:, None]) / np.maximum(sk, 1)[:, None]  # [B, S]
        weights = np.where(empty[..., None], keys[:, None, None, :], weights)
    elif all_blocked == MEAN_V_BUFFER:
        weights = np.where(empty[..., None], 1.0 / max(case.S, 1), weights)
    elif all_blocked != "zeros":
        raise ValueError(f"unknown all_blocked policy {all_blocked!r}")
    pad = padding(case)[:, None, :]  # [B, 1, T]
    weights = np.where(pad[..., None], 0.0, weights)
    v = expand_kv(np.asarray(case.value).astype(np.float64), case.Hq)
    out = np.einsum("bhts,bhsd->bhtd", weights, v)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, row_max + np.log(np.where(empty, 1.0, denom)))
    return VariantForward(out=out, weights=weights, blocked=blocked, all_blocked=empty, lse=lse)


def vjp(
    case: Case, grad_out: np.ndarray, *, all_blocked: str = "zeros", causal_alignment: str = "top-left"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) of a variant case for the cotangent ``grad_out``, analytic, float64.

    The base oracle's backward (dV = P^T dO; dS = P (dP - rowsum(dP P)); zero on blocked positions
    and on rows with a fixed fill) with one more factor for the softcap: the final score is
    ``c tanh(s / c)`` of the scaled product ``s``, so dS reaches the product scaled by its derivative
    ``1 - tanh(s / c)^2`` (in (0, 1]: a capped score passes less gradient). Window, ALiBi and the
    lengths do not depend on Q and K and enter only through P and the blocked set. Tested against
    finite differences of a per-query loop (tests/test_oracle_variants.py).
    """
    fwd = forward(case, all_blocked=all_blocked, causal_alignment=causal_alignment)
    derivative = None
    if case.softcap:
        q = np.asarray(case.query).astype(np.float64)
        ke = expand_kv(np.asarray(case.key).astype(np.float64), case.Hq)
        product = np.einsum("bhtd,bhsd->bhts", q, ke) * case.effective_scale
        derivative = 1.0 - np.tanh(product / float(case.softcap)) ** 2
    return backward(case, fwd, grad_out, score_derivative=derivative)


def lower(case: Case, causal_alignment: str = "top-left") -> Case:
    """A base case (no window, softcap or ALiBi) whose float64 meaning is that of ``case``.

    The window and ``is_causal`` become blocked positions, ALiBi and the softcap's change of each
    score (``c tanh(s/c) - s``, computed from the rounded inputs in float64) an additive bias. Where
    the case had only an additive bias, blocked positions are written into it as ``-inf`` so that a
    kernel's declared fill for bias-emptied rows still applies. Only the harness's allowances use
    this; expected values come from :func:`forward`. Sinks become one more key (zero key and value,
    the sink as its bias), so a lowered sink case has S + 1 keys and the same output.
    """
    if not case.has_variant:
        return case
    final, blocked = scores(case, causal_alignment)
    q = np.asarray(case.query).astype(np.float64)
    k = expand_kv(np.asarray(case.key).astype(np.float64), case.Hq)
    plain = np.einsum("bhtd,bhsd->bhts", q, k) * case.effective_scale
    bias = final - plain
    if case.bias is None and not case.softcap and case.alibi_slopes is None:
        bias = None  # a window alone changes only what is blocked
    base = dict(window=None, softcap=None, alibi_slopes=None, sinks=None, is_causal=False)
    base.update(seqlens_q=None, seqlens_k=None)
    if case.mask is None and case.bias is not None:
        low = case.replace(bias=np.where(blocked, -np.inf, bias), **base)
    else:
        low = case.replace(mask=blocked, bias=bias, **base)
    return low if case.sinks is None else _sink_as_key(low, case)


def _sink_as_key(low: Case, case: Case) -> Case:
    """``low`` with one more key, S: a zero key and a zero value (q.k = 0, nothing added to the
    output) whose additive bias is the head's sink logit, visible to every row."""
    B, Hq, T, S = case.B, case.Hq, case.T, case.S

    def extend(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        return np.concatenate([x, np.zeros(x.shape[:2] + (1, x.shape[3]), dtype=x.dtype)], axis=2)

    bias = np.zeros((B, Hq, T, S)) if low.bias is None else np.broadcast_to(low.bias, (B, Hq, T, S))
    bias = np.concatenate([bias, sinks_for(case)[..., None]], axis=-1)
    mask = low.mask
    if mask is not None:
        mask = np.concatenate([np.broadcast_to(mask, (B, Hq, T, S)), np.zeros((B, Hq, T, 1), dtype=bool)], axis=-1)
    return low.replace(key=extend(low.key), value=extend(low.value), bias=bias, mask=mask)

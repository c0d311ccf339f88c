"""The variant oracle (conformance.oracle_variants) against computations that share none of its code.

The reference here is a per-query loop written from the definitions as FlashAttention documents
them (window: keys ``[i + S_k - S_q - left, i + S_k - S_q + right]`` inclusive for the bottom-right
alignment; ALiBi: ``-slope * |i + S_k - S_q - j|``; softcap ``c * tanh(s / c)`` on the scaled
product; lse the log of the softmax's normaliser), one scalar at a time with ``math``; plus the
identities the definitions imply (a window wide enough is no window, a huge softcap is none, ALiBi
with zero slopes is none, lse - max is in [0, log S], exp(s - lse) are the weights), the ALiBi
paper's slopes pinned, and :func:`lower` giving the base oracle the same answer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance import oracle, oracle_variants
from conformance.harness.cases.build import random_case, random_mask


def loop_variant(case, alignment: str) -> tuple[np.ndarray, np.ndarray]:
    """(out [B,Hq,T,Dv], lse [B,Hq,T]) one query row at a time, from the definitions."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (case.query, case.key, case.value))
    B, Hq, T, D = q.shape
    S, g = k.shape[2], Hq // k.shape[1]
    mask = None if case.mask is None else np.broadcast_to(case.mask, (B, Hq, T, S))
    slopes = None
    if case.alibi_slopes is not None:
        slopes = np.broadcast_to(np.asarray(case.alibi_slopes, dtype=np.float64), (B, Hq))
    out = np.zeros((B, Hq, T, v.shape[3]))
    lse = np.full((B, Hq, T), -math.inf)
    for b in range(B):
        # variable lengths: sequence b is its first tq queries and sk keys, positions its own
        tq = T if case.seqlens_q is None else int(case.seqlens_q[b])
        sk = S if case.seqlens_k is None else int(case.seqlens_k[b])
        for h in range(Hq):
            for i in range(tq):
                pos = i + (sk - tq if alignment == "bottom-right" else 0)  # the query's place on the key axis
                row = []
                for j in range(sk):
                    if mask is not None and mask[b, h, i, j]:
                        continue
                    if case.is_causal and j > pos:
                        continue
                    if case.window is not None:
                        left, right = case.window
                        if left >= 0 and j < pos - left:
                            continue
                        if right >= 0 and j > pos + right:
                            continue
                    s = case.effective_scale * sum(q[b, h, i, d] * k[b, h // g, j, d] for d in range(D))
                    if case.softcap:
                        s = case.softcap * math.tanh(s / case.softcap)
                    if slopes is not None:
                        s -= slopes[b, h] * abs(pos - j)
                    row.append((j, s))
                sink = None if case.sinks is None else float(case.sinks[h])  # a valueless key, logit sink
                if not row and sink is None:
                    continue
                top = max([s for _, s in row] + ([] if sink is None else [sink]))
                z = math.fsum([math.exp(s - top) for _, s in row] + ([] if sink is None else [math.exp(sink - top)]))
                lse[b, h, i] = top + math.log(z)
                for j, s in row:
                    out[b, h, i] += math.exp(s - top) / z * v[b, h // g, j]
    return out, lse


WINDOWS = [(2, 0), (0, 0), (1, 1), (3, -1), (-1, 2), (-1, -1), (0, 3)]


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("T,S", [(4, 7), (7, 4), (5, 5), (1, 6)])
def test_forward_and_lse_match_per_query_loop(T, S, alignment):
    for seed, window in enumerate(WINDOWS):
        Hq = (6, 3, 5)[seed % 3]  # head counts that are not powers of two
        Hkv = {6: 2, 3: 1, 5: 5}[Hq]
        B = 2
        slopes = None
        if seed % 2 == 0:
            slopes = oracle_variants.alibi_slopes_for(Hq)
        elif seed % 3 == 1:
            slopes = np.random.default_rng(seed).uniform(0.01, 1.0, (B, Hq))
        case = random_case(
            seed,
            B=B,
            Hq=Hq,
            Hkv=Hkv,
            T=T,
            S=S,
            Dk=5,
            Dv=3,
            dtype="float64",
            magnitude=2.0,
            mask=random_mask(seed, (B, 1, T, S), p_blocked=0.25) if seed % 3 == 2 else None,
            is_causal=seed % 4 == 1,
            scale=None if seed % 2 else 0.7,
        ).replace(window=window, softcap=(None, 1.5, 30.0)[seed % 3], alibi_slopes=slopes)
        got = oracle_variants.forward(case, causal_alignment=alignment)
        want_out, want_lse = loop_variant(case, alignment)
        np.testing.assert_allclose(got.out, want_out, rtol=1e-12, atol=1e-13, err_msg=case.describe())
        assert np.array_equal(np.isneginf(got.lse), np.isneginf(want_lse)), case.describe()
        live = np.isfinite(want_lse)
        np.testing.assert_allclose(got.lse[live], want_lse[live], rtol=1e-12, atol=1e-12, err_msg=case.describe())


def test_window_examples_from_flash_attention_docstring():
    """FlashAttention's docstring draws the bottom-right causal mask for (2, 5) and (5, 2)."""
    causal = (-1, 0)
    keep_2x5 = ~oracle_variants.window_blocked(2, 5, causal, "bottom-right")
    assert keep_2x5.astype(int).tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    keep_5x2 = ~oracle_variants.window_blocked(5, 2, causal, "bottom-right")
    assert keep_5x2.astype(int).tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    # the same causal pattern as the base oracle's, in both alignments
    for align in ("top-left", "bottom-right"):
        for T, S in ((2, 5), (5, 2), (4, 4)):
            got = oracle_variants.window_blocked(T, S, causal, align)
            assert np.array_equal(got, oracle.causal_blocked(T, S, align))


def test_window_width_counts_keys_inclusively():
    """(left, 0) lets each query see itself and exactly ``left`` earlier keys (where they exist)."""
    keep = ~oracle_variants.window_blocked(6, 6, (2, 0), "top-left")
    assert keep.sum(axis=1).tolist() == [1, 2, 3, 3, 3, 3]
    keep = ~oracle_variants.window_blocked(6, 6, (1, 2), "top-left")
    assert keep[3].nonzero()[0].tolist() == [2, 3, 4, 5]


def test_identities():
    case = random_case(5, B=2, Hq=3, T=4, S=6, Dk=8, dtype="float64", magnitude=1.5)
    base = oracle.forward(case).out
    wide = oracle_variants.forward(case.replace(window=(6, 6))).out
    np.testing.assert_allclose(wide, base, rtol=0, atol=1e-15)
    huge_cap = oracle_variants.forward(case.replace(softcap=1e9)).out
    np.testing.assert_allclose(huge_cap, base, rtol=1e-12, atol=1e-14)
    zero_slopes = oracle_variants.forward(case.replace(alibi_slopes=np.zeros(3))).out
    np.testing.assert_allclose(zero_slopes, base, rtol=0, atol=1e-15)
    f = oracle_variants.forward(case.replace(softcap=2.0, alibi_slopes=oracle_variants.alibi_slopes_for(3)))
    s, blocked = oracle_variants.scores(case.replace(softcap=2.0, alibi_slopes=oracle_variants.alibi_slopes_for(3)))
    assert not blocked.any()
    excess = f.lse - s.max(axis=-1)
    assert (excess >= 0).all() and (excess <= math.log(case.S) + 1e-12).all()
    np.testing.assert_allclose(np.exp(s - f.lse[..., None]), f.weights, rtol=1e-12, atol=1e-15)


def test_empty_rows_have_lse_minus_inf_and_the_declared_fill():
    # bottom-right causal with T > S leaves the first T - S queries without keys
    case = random_case(2, B=1, Hq=2, T=5, S=2, Dk=4, dtype="float64", is_causal=True).replace(window=(1, 0))
    f = oracle_variants.forward(case, causal_alignment="bottom-right")
    assert np.isneginf(f.lse[..., :3]).all() and np.isfinite(f.lse[..., 3:]).all()
    assert (f.out[..., :3, :] == 0).all()
    nan = oracle_variants.forward(case, all_blocked="nan", causal_alignment="bottom-right")
    assert np.isnan(nan.out[..., :3, :]).all()


def test_alibi_slopes_match_the_paper():
    """The reference implementation's values (ofirpress/attention_with_linear_biases, get_slopes)."""
    np.testing.assert_allclose(oracle_variants.alibi_slopes_for(8), [2.0**-k for k in range(1, 9)], rtol=1e-15)
    np.testing.assert_allclose(oracle_variants.alibi_slopes_for(4), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], rtol=1e-15)
    # 6 heads: the 4-head slopes, then every other 8-head slope
    np.testing.assert_allclose(
        oracle_variants.alibi_slopes_for(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3], rtol=1e-15
    )
    twelve = oracle_variants.alibi_slopes_for(12)
    assert len(twelve) == 12 and twelve[8] == pytest.approx(2.0**-0.5) and twelve[11] == pytest.approx(2.0**-3.5)


def test_alibi_slopes_must_match_the_heads():
    with pytest.raises(ValueError, match="alibi_slopes"):
        oracle_variants.alibi_bias(np.ones(4), 2, 3, 2, 2)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_lower_means_the_same_in_float64(alignment):
    """The base oracle on the lowered case gives the variant oracle's answer."""
    for seed, (mask, bias) in enumerate(((True, False), (False, True), (False, False), (True, True))):
        B, Hq, T, S = 2, 3, 4, 6
        case = random_case(
            seed,
            B=B,
            Hq=Hq,
            T=T,
            S=S,
            Dk=8,
            dtype="float32",
            magnitude=2.0,
            is_causal=seed % 2 == 0,
            mask=random_mask(seed, (B, Hq, T, S), p_blocked=0.3) if mask else None,
            bias=np.random.default_rng(seed).standard_normal((1, 1, T, S)) if bias else None,
        ).replace(window=(2, 1), softcap=3.0 if seed != 2 else None, alibi_slopes=oracle_variants.alibi_slopes_for(3))
        low = oracle_variants.lower(case, alignment)
        assert not low.has_variant and not low.is_causal
        want = oracle_variants.forward(case, causal_alignment=alignment)
        got = oracle.forward(low, causal_alignment=alignment)
        np.testing.assert_allclose(got.out, want.out, rtol=1e-12, atol=1e-13)
        assert np.array_equal(got.blocked, want.blocked)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_variable_lengths_match_per_sequence_loop(alignment):
    """Each sequence is its own problem: its lengths set its causal, window and ALiBi positions;
    zero-length and single-token sequences included; padded rows are 0 with lse -inf."""
    B, Hq, T, S = 5, 3, 6, 9
    tq = np.array([6, 1, 0, 4, 3])
    sk = np.array([9, 7, 5, 0, 2])
    for seed, (causal, window, alibi) in enumerate(((True, None, False), (False, (2, 1), True), (True, (1, 0), True))):
        case = random_case(seed, B=B, Hq=Hq, Hkv=1, T=T, S=S, Dk=4, Dv=3, dtype="float64", is_causal=causal).replace(
            seqlens_q=tq,
            seqlens_k=sk,
            window=window,
            alibi_slopes=oracle_variants.alibi_slopes_for(Hq) if alibi else None,
            softcap=2.0 if seed == 2 else None,
        )
        got = oracle_variants.forward(case, causal_alignment=alignment)
        want_out, want_lse = loop_variant(case, alignment)
        np.testing.assert_allclose(got.out, want_out, rtol=1e-12, atol=1e-13, err_msg=case.describe())
        assert np.array_equal(np.isneginf(got.lse), np.isneginf(want_lse)), case.describe()
        live = np.isfinite(want_lse)
        np.testing.assert_allclose(got.lse[live], want_lse[live], rtol=1e-12, atol=1e-12)
        pad = oracle_variants.padding(case)
        assert pad.sum() == (T - tq).sum() and (got.weights[:, :, :, :][pad[:, None, :].repeat(Hq, 1)] == 0).all()
        # each sequence alone, as a dense case of its own lengths, gives the same rows
        for b in range(B):
            if tq[b] == 0:
                continue
            alone = case.replace(
                query=case.query[b : b + 1, :, : tq[b]],
                key=case.key[b : b + 1, :, : sk[b]],
                value=case.value[b : b + 1, :, : sk[b]],
                seqlens_q=None,
                seqlens_k=None,
            )
            if sk[b] == 0:
                assert (got.out[b, :, : tq[b]] == 0).all()
                continue
            one = oracle_variants.forward(alone, causal_alignment=alignment)
            np.testing.assert_allclose(got.out[b, :, : tq[b]], one.out[0], rtol=1e-13, atol=1e-14)


def test_lengths_are_checked():
    case = random_case(1, B=2, Hq=1, T=3, S=4, Dk=4, dtype="float64")
    with pytest.raises(ValueError, match="outside"):
        oracle_variants.forward(case.replace(seqlens_q=np.array([4, 1])))
    with pytest.raises(ValueError, match="expected"):
        oracle_variants.forward(case.replace(seqlens_k=np.array([1, 2, 3])))


def test_mean_v_fill_of_a_varlen_row_averages_the_declared_keys():
    """mean-v on a row that sees no key: the sequence's own keys ("sequence"), or every slot of the
    padded key axis ("buffer", Declaration.mean_v_keys), computed here with plain means."""
    from conformance.contract import MEAN_V_BUFFER, Declaration

    tq, sk = np.array([2, 3, 1]), np.array([0, 4, 6])  # sequence 0 has no keys; (3, 4) with window (0, 0)
    case = random_case(7, B=3, Hq=2, T=3, S=6, Dk=4, dtype="float64").replace(seqlens_q=tq, seqlens_k=sk, window=(0, 0))
    v = np.asarray(case.value, dtype=np.float64)
    seq = oracle_variants.forward(case, all_blocked="mean-v")
    buf = oracle_variants.forward(case, all_blocked=MEAN_V_BUFFER)
    assert (seq.out[0, :, :2] == 0).all()  # the mean of no keys
    np.testing.assert_allclose(buf.out[0, :, :2], np.broadcast_to(v[0].mean(axis=1)[:, None], (2, 2, 4)), rtol=1e-13)
    # sequences with keys and a visible key per row agree under both; padded rows are 0 under both
    np.testing.assert_array_equal(seq.out[1:], buf.out[1:])
    assert (buf.out[0, :, 2] == 0).all() and (buf.out[2, :, 1:] == 0).all()
    decl = Declaration(all_blocked="mean-v", mean_v_keys="buffer")
    assert decl.all_blocked_policy(case) == MEAN_V_BUFFER
    assert decl.all_blocked_policy(case.replace(seqlens_q=None, seqlens_k=None)) == "mean-v"
    assert Declaration(all_blocked="zeros", mean_v_keys="buffer").all_blocked_policy(case) == "zeros"
    with pytest.raises(ValueError, match="mean_v_keys"):
        Declaration(mean_v_keys="padded")


def _finite_difference_vjp(case, grad_out, alignment: str, h: float = 1e-6):
    """<grad_out, d loop_variant / dx> by central differences, one input element at a time."""
    grads = []
    for name in ("query", "key", "value"):
        x = np.asarray(getattr(case, name), dtype=np.float64)
        d = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            hi, lo = x.copy(), x.copy()
            hi[idx] += h
            lo[idx] -= h
            up, _ = loop_variant(case.replace(**{name: hi}), alignment)
            down, _ = loop_variant(case.replace(**{name: lo}), alignment)
            d[idx] = np.sum(grad_out * (up - down)) / (2 * h)
        grads.append(d)
    return grads


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_vjp_matches_finite_differences_of_the_loop(alignment):
    """The variant VJP (softcap's 1 - tanh^2 factor, window, ALiBi, GQA, per-sequence lengths) against
    central differences of the independent per-query loop, in float64."""
    for seed, extra in enumerate(
        (
            dict(softcap=1.5),
            dict(softcap=0.7, window=(1, 0), alibi_slopes=oracle_variants.alibi_slopes_for(4)),
            dict(softcap=2.0, seqlens_q=np.array([3, 1]), seqlens_k=np.array([2, 4])),
        )
    ):
        case = random_case(
            50 + seed, B=2, Hq=4, Hkv=2, T=3, S=4, Dk=3, dtype="float64", magnitude=2.0, is_causal=seed == 1
        ).replace(**extra)
        g = np.random.default_rng(seed).standard_normal(case.out_shape)
        got = oracle_variants.vjp(case, g, causal_alignment=alignment)
        want = _finite_difference_vjp(case, g, alignment)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"{name}: {case.describe()}")
        assert np.abs(got[0]).max() > 1e-3  # the scores' gradient is not trivially zero


def test_vjp_without_variants_is_the_base_oracle():
    case = random_case(5, B=2, Hq=4, Hkv=2, T=3, S=5, Dk=4, dtype="float64", is_causal=True)
    g = np.random.default_rng(5).standard_normal(case.out_shape)
    for a, b in zip(oracle_variants.vjp(case, g), oracle.vjp(case, g)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_sinks_match_the_loop_and_lower_to_one_more_key(alignment):
    """Sinks (gpt-oss): exp(sink_h) joins each row's denominator; against the per-query loop, with
    GQA, causal T > S (rows with no key give 0, lse = sink), a window and lengths; the lowered case
    (the sink as an extra zero key with the sink as bias) gives the same output in the base oracle."""
    sinks = np.array([0.5, -1.0, 2.0, 0.0, 3.0, -0.25])
    for seed, extra in enumerate(
        (
            dict(),
            dict(is_causal=True, window=(1, 0)),
            dict(seqlens_q=np.array([4, 1]), seqlens_k=np.array([2, 5]), softcap=2.0),
        )
    ):
        case = random_case(60 + seed, B=2, Hq=6, Hkv=2, T=4, S=5 if seed != 1 else 2, Dk=4, dtype="float64")
        case = case.replace(sinks=sinks, **extra)
        got = oracle_variants.forward(case, causal_alignment=alignment)
        want_out, want_lse = loop_variant(case, alignment)
        np.testing.assert_allclose(got.out, want_out, rtol=1e-12, atol=1e-13, err_msg=case.describe())
        live = ~oracle_variants.padding(case)[:, None, :].repeat(6, 1)
        np.testing.assert_allclose(got.lse[live], want_lse[live], rtol=1e-12, atol=1e-12)
        assert (got.weights.sum(axis=-1)[live] < 1).all()
        low = oracle_variants.lower(case, alignment)
        assert low.S == case.S + 1 and not low.has_variant
        np.testing.assert_allclose(oracle.forward(low, causal_alignment=alignment).out, got.out, rtol=1e-12, atol=1e-13)
        g = np.random.default_rng(seed).standard_normal(case.out_shape)
        if case.softcap:
            continue  # the lowered case holds the cap as a constant bias: its VJP lacks the cap's derivative
        dq_low = oracle.vjp(low, g, causal_alignment=alignment)[0]  # the sink's zero key adds nothing to dQ
        np.testing.assert_allclose(oracle_variants.vjp(case, g, causal_alignment=alignment)[0], dq_low, atol=1e-12)
    with pytest.raises(ValueError, match="sinks"):
        oracle_variants.forward(case.replace(sinks=np.zeros(2)))


def test_the_sink_definition_is_jax_s_own_text():
    """The stored excerpt (conformance.harness.spec.sink_definitions) is the installed jax's source, unchanged,
    when the installed jax is the release it names."""
    import os

    import jax

    from conformance.harness.spec.sink_definitions import JAX_SPLASH_REFERENCE as doc

    if f"jax-{jax.__version__}" != doc.commit:
        pytest.skip(f"installed jax {jax.__version__}, the excerpt is from {doc.commit}")
    path = os.path.join(os.path.dirname(jax.__file__), os.path.relpath(doc.path, "jax"))
    first, last = (int(x) for x in doc.lines.split("-"))
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()[first - 1 : last]
    assert doc.text.strip("\n") == "\n".join(lines)

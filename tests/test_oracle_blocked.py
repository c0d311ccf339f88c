"""The blocked (online-softmax) oracle agrees with the plain one, and its memory does not grow with T·S.

The plain oracle reads like the formula; the blocked one is what long-sequence clauses can afford.
Holding them to ~1e-12 of each other on every convention (masks of every rank, -inf bias, causal in
both alignments, GQA, all-blocked rows under each policy, block sizes that leave tile tails) is what
lets a long-sequence verdict stand on the same footing as a short one.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from conformance import oracle
from conformance.harness.cases.build import random_case, random_mask

TOL = 1e-12


def _compare(case, **conv):
    plain = oracle.forward(case, **conv)
    for block in (1, 3, 7, 64):
        for tile in (1, 50, 1 << 22):
            got = oracle.forward_blocked(case, block=block, tile_elements=tile, **conv)
            np.testing.assert_array_equal(got.all_blocked, plain.all_blocked)
            np.testing.assert_allclose(got.out, plain.out, rtol=TOL, atol=TOL, equal_nan=True)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
@pytest.mark.parametrize("policy", ["zeros", "nan", "mean-v"])
@pytest.mark.parametrize("mask_shape", [None, "TS", "B1TS", "BHTS", "B11S"])
def test_blocked_matches_plain(alignment, policy, mask_shape):
    B, Hq, Hkv, T, S = 2, 4, 2, 9, 23
    shape = {None: None, "TS": (T, S), "B1TS": (B, 1, T, S), "BHTS": (B, Hq, T, S), "B11S": (B, 1, 1, S)}[mask_shape]
    mask = None if shape is None else random_mask(3, shape, p_blocked=0.5, keep_one=False)
    for causal in (False, True):
        case = random_case(
            5, B=B, Hq=Hq, Hkv=Hkv, T=T, S=S, Dk=8, Dv=5, dtype="float64", mask=mask, is_causal=causal, magnitude=2.0
        )
        _compare(case, all_blocked=policy, causal_alignment=alignment)


def test_bias_with_neg_inf_and_scale():
    T, S = 6, 17
    bias = np.random.default_rng(1).standard_normal((1, 1, T, S))
    bias[0, 0, 2, :] = -np.inf  # an all-blocked row made by the bias alone
    bias[0, 0, 3, ::2] = -np.inf
    case = random_case(7, B=1, Hq=3, T=T, S=S, Dk=4, Dv=4, dtype="float32", bias=bias, scale=0.3)
    _compare(case, all_blocked="mean-v")
    _compare(case, all_blocked="zeros")


def test_large_logits_stay_finite():
    case = random_case(11, B=1, Hq=1, T=5, S=40, Dk=16, dtype="float64", magnitude=30.0)
    _compare(case)
    assert np.isfinite(oracle.forward_blocked(case, block=8).out).all()


def test_logsumexp_is_the_softmax_normaliser():
    case = random_case(13, B=1, Hq=2, T=4, S=10, Dk=8, dtype="float64")
    got = oracle.forward_blocked(case, block=3)
    scores = np.einsum("bhtd,bhsd->bhts", case.query, case.key) * case.effective_scale
    want = np.log(np.exp(scores).sum(axis=-1))
    np.testing.assert_allclose(got.logsumexp, want, rtol=1e-13)


def test_long_sequence_memory_is_bounded():
    """S = 16384 keys with a padding mask: peak traced memory stays far below the [B,H,T,S] size."""
    B, H, T, S, D = 1, 2, 512, 16384, 32
    mask = np.zeros((B, 1, 1, S), dtype=bool)
    mask[..., -100:] = True
    case = random_case(17, B=B, Hq=H, T=T, S=S, Dk=D, dtype="float32", mask=mask)
    materialised = B * H * T * S * 8
    tracemalloc.start()
    try:
        oracle.forward_blocked(case, block=512, tile_elements=1 << 18)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    inputs = 8 * (case.query.size + case.key.size + case.value.size)
    assert peak < inputs + 16 * 2**20, (
        f"peak {peak / 2**20:.1f} MiB; [B,H,T,S] float64 would be {materialised / 2**20:.0f} MiB"
    )
    assert peak < 512 * 2**20

"""The returned lse normalises the softmax the kernel actually took: over the final scores, softcap
and ALiBi included.

FlashAttention defines the lse as "the log of the softmax normalization factor"; a kernel that takes
its row statistics in a separate pass (for the lse it returns, or for a split-KV merge) can compute
them from the scaled product before the softcap or before the ALiBi bias, while its output, from the
main loop, is right. LSE-01 checks the base, the empty rows and the scale on plain, causal, windowed
cases; its cases carry neither softcap nor ALiBi, and held-out kernels with that separate pass passed
every clause. Each case here reuses the shape of SOFTCAP-01 or ALIBI-01 (a compiling kernel builds
no new program for it).
"""

from __future__ import annotations

from conformance.clauses.common import supported
from conformance.clauses.test_lse import LSE_DEF
from conformance.clauses.test_variants import slopes
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge.lse import assert_lse_matches
from conformance.harness.spec.clause import clause


def _cases(dtype: str) -> list:
    capped = random_case(1330, B=2, Hq=2, T=5, S=12, Dk=16, dtype=dtype, magnitude=3.0).replace(
        softcap=5.0, label="lse, softcap 5"
    )
    alibi = random_case(1331, B=2, Hq=6, Hkv=2, T=7, S=7, Dk=8, dtype=dtype).replace(
        alibi_slopes=slopes(6), label="lse, ALiBi H=6 (Hkv=2)"
    )
    both = random_case(1332, B=2, Hq=6, Hkv=2, T=7, S=7, Dk=8, dtype=dtype, magnitude=2.5).replace(
        alibi_slopes=slopes(6), softcap=4.0, label="lse, softcap 4 and ALiBi"
    )
    return [capped, alibi, both]


@clause(
    "LSE-SCORES-03",
    "the returned lse is the log-normaliser of the softmax actually taken: over the softcapped scores, the ALiBi "
    "bias added, and both together",
    LSE_DEF,
    requires=["returns_lse"],
    kills=["lse_ignores_softcap", "lse_ignores_alibi"],
)
def test_lse_of_final_scores(impl, dtype):
    # Each case in one dtype for a compiling kernel (ci).
    for case in buckets.spread(impl, dtype, supported(impl, _cases(dtype))):
        assert_lse_matches(impl, case)

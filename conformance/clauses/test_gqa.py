"""003 §主动回忆: Q=[B,32,1,128] against K=[B,8,T,128] is grouped-query attention.

Query head h reads kv head ``h // (Hq / Hkv)`` (torch's ``enable_gqa``, jax, ONNX alike; DESIGN.md).
GQA is defined as ordinary multi-head attention on K and V whose heads are repeated in groups, so
the kernel is checked against the oracle *and* against itself run on the repeated K, V: the second
comparison holds even for a kernel whose numerics differ from the oracle's.

A head ratio that is not an integer has no mapping at all. A kernel that returns a result for one
has invented a mapping, which is a wrong answer, not a missing check: so the rejection clause
applies to every kernel that declares GQA, whether or not it declares ``validates_inputs``. It counts
only an exception of a class the kernel documents (``rejects_with``; ``NotApplicable`` never), and
asks the nearest valid ratio too, so that a kernel raising on every call does not pass.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import DTYPES, Case
from conformance.harness.cases import buckets
from conformance.harness.cases.build import random_case
from conformance.harness.judge import compare
from conformance.harness.judge.rejection import BadInput, check_rejections
from conformance.harness.spec.clause import Source, clause
from conformance.oracle import expand_kv

GQA = Source(
    "003", "主动回忆", "若 Q=[B,32,1,128]、K=[B,8,T,128]，为什么不能直接按普通 MHA 公式相乘？这提示了什么结构？"
)

# (Hq, Hkv): groups of 3 and 2, and MQA (one kv head for all query heads).
RATIOS = ((6, 2), (8, 4), (4, 1))


def _gqa_cases(dtype: str, ratios: tuple[tuple[int, int], ...] = RATIOS) -> list[Case]:
    return [
        random_case(600 + i, B=2, Hq=hq, Hkv=hkv, T=3, S=7, Dk=8, dtype=dtype, label=f"Hq={hq} Hkv={hkv}")
        for i, (hq, hkv) in enumerate(ratios)
    ]


@clause(
    "GQA-MAP-01",
    "query head h reads kv head h // (Hq/Hkv): groups of 3 and 2, and MQA (Hkv = 1), match the oracle",
    GQA,
    requires=["gqa"],
    kills=["gqa_wrong_mapping", "gqa_first_kv_head_only"],
)
def test_gqa_head_mapping(impl, dtype):
    # A kernel compiling per shape checks each ratio in one dtype per ci run (buckets.spread).
    for case in buckets.spread(impl, dtype, _gqa_cases(dtype)):
        impl.require(case)
        compare.assert_output_matches(impl, case)


@clause(
    "GQA-EXPAND-02",
    "GQA gives the kernel's own output on K, V with each kv head repeated Hq/Hkv times",
    GQA,
    requires=["gqa"],
    kills=["gqa_wrong_mapping", "gqa_first_kv_head_only"],
)
def test_gqa_equals_repeated_kv(impl, dtype):
    for case in buckets.spread(impl, dtype, _gqa_cases(dtype, RATIOS[::2])):
        impl.require(case)
        repeated = case.replace(
            key=expand_kv(case.key, case.Hq),
            value=expand_kv(case.value, case.Hq),
            label=case.label + " -> K, V repeated to Hq heads",
        )
        compare.assert_equivalent(impl, case, repeated, "GQA output vs the kernel on repeated K, V")


@clause(
    "GQA-DECODE-03",
    "the seed's decode shape Q=[B,32,1,128], K=V=[B,8,S,128] matches the oracle",
    GQA,
    requires=["gqa"],
    kills=["gqa_wrong_mapping", "gqa_first_kv_head_only"],
)
def test_gqa_decode_shape(impl, dtype):
    case = random_case(
        610, B=2, Hq=32, Hkv=8, T=1, S=37, Dk=128, dtype=dtype, label="003's Q=[B,32,1,128] K=[B,8,T,128]"
    )
    impl.require(case)
    compare.assert_output_matches(impl, case)


@clause(
    "GQA-RATIO-04",
    "Hq not a multiple of Hkv (6 query heads, 4 kv heads) is rejected with an exception of a declared class, never "
    "answered; the nearest valid ratio (8 query heads, 4 kv heads) is answered as the oracle does",
    GQA,
    requires=["gqa"],
    kills=[
        "gqa_ratio_unchecked",
        "rejects_everything",
        "refuses_bad_input_as_not_applicable",
        "bad_input_crashes_keyerror",
    ],
)
def test_gqa_bad_ratio_rejected(impl):
    decl = impl.declaration
    dtype = next((d for d in ("float32", *DTYPES) if d in decl.dtypes), None)
    if dtype is None:
        impl.not_applicable("declares no dtype")
    case = random_case(620, B=1, Hq=6, Hkv=4, T=3, S=5, Dk=8, dtype=dtype, label="Hq=6 Hkv=4 (no integer group)")
    q = case.query
    eight = case.replace(
        query=np.ascontiguousarray(np.concatenate([q, q[:, :2]], axis=1)), label="valid neighbour Hq=8 Hkv=4"
    )
    four = case.replace(query=np.ascontiguousarray(q[:, :4]), label="valid neighbour Hq=4 Hkv=4")
    bad = BadInput("Hq=6, Hkv=4: no head mapping h // (Hq/Hkv) exists, so any answer invents one", case, [eight, four])
    check_rejections(impl, [bad], "declared gqa=True: a head ratio that is not an integer has no answer")

"""Inputs the spec rules out raise an error instead of returning a number (000_f3dcd408372d9e02.txt §8).

The article's kernel states its preconditions as code: 4-D floating tensors of one dtype, matching
batch/head/feature dims and K/V lengths, positive dims, ``dropout_p`` in [0, 1]. A kernel that
declares ``validates_inputs`` must refuse each violation; broadcasting a key batch of 1 against a
query batch of 2, or casting integers to float, returns a plausible array and hides a caller's bug.
Cases are passed with ``impl.call_raw``: the declaration is not consulted for them, on purpose.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, NotApplicable
from conformance.harness.cases import random_case
from conformance.harness.clause import Source, clause
from conformance.harness.impl import Impl
from conformance.harness.report import fail

PRECONDITIONS = Source(
    "000",
    "§8 最小 PyTorch 实现",
    "要求 Q、K、V 是同设备、同 dtype 的有限浮点张量，batch 和 head 数一致",
)
NOT_A_MASK = Source(
    "000",
    "§7.1 Padding Mask",
    "不要把 [B,S] 直接传给下面的核心函数：广播从尾维对齐，可能报错，也可能恰好尺寸相同而错误广播。",
)

RANK = "Q、K、V 必须是四维张量"
FLOAT = "Q、K、V 必须为浮点张量"
SAME_DTYPE = "Q、K、V 必须使用相同的 dtype 和 device"
DIMS = "Q/K 特征维、K/V 长度和 batch/head 维度必须匹配"
POSITIVE = "各维度必须为正"
DROPOUT = "dropout_p 必须位于 [0, 1]"


def bad_cases(dtype: str, dropout: bool) -> list[tuple[str, Case, type, str]]:
    """(what is wrong, case, the article's exception type, the article's message)."""
    c = random_case(95, B=2, Hq=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype)
    q, k, v = c.query, c.key, c.value
    cut = np.ascontiguousarray
    cases = [
        ("query is 3-D", c.replace(query=cut(q[0])), ValueError, RANK),
        ("key is 5-D", c.replace(key=cut(k[None])), ValueError, RANK),
        ("integer q, k, v", c.replace(query=q.astype(np.int32), key=k.astype(np.int32), value=v.astype(np.int32)),
         TypeError, FLOAT),
        ("key dtype differs from query's", c.replace(key=k.astype(np.float64 if dtype != "float64" else np.float32)),
         ValueError, SAME_DTYPE),
        ("key/value batch 1 against query batch 2 (broadcastable)", c.replace(key=cut(k[:1]), value=cut(v[:1])),
         ValueError, DIMS),
        ("3 query heads against 2 kv heads (not a multiple)",
         random_case(96, B=2, Hq=3, Hkv=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype), ValueError, DIMS),
        ("key feature dim 4 against query's 8", c.replace(key=cut(k[..., :4])), ValueError, DIMS),
        ("value length 4 against key length 5", c.replace(value=cut(v[:, :, :4])), ValueError, DIMS),
        ("no queries (T = 0)", c.replace(query=cut(q[:, :, :0])), ValueError, POSITIVE),
        ("no keys (S = 0)", c.replace(key=cut(k[:, :, :0]), value=cut(v[:, :, :0])), ValueError, POSITIVE),
    ]
    if dropout:
        cases += [
            ("dropout_p = -0.1", c.replace(dropout_p=-0.1), ValueError, DROPOUT),
            ("dropout_p = 1.5", c.replace(dropout_p=1.5), ValueError, DROPOUT),
        ]
    return cases


def _needs_validation(impl: Impl) -> None:
    if not impl.declaration.validates_inputs:
        impl.not_applicable("declares validates_inputs=False")


@clause(
    "BAD-INPUT-01",
    "inputs the spec rules out (rank, dtype, mismatched dims, empty dims, dropout_p outside [0, 1]) raise an error",
    PRECONDITIONS,
    requires=["validates_inputs"],
    kills=["validates_nothing"],
)
def test_bad_input_raises(impl, dtype):
    _needs_validation(impl)
    accepted = []
    for what, case, _, _ in bad_cases(dtype, impl.declaration.dropout):
        result, exc = impl.call_raw(case)
        if exc is None:
            accepted.append(f"{what} -> returned {type(result).__name__} of shape {np.shape(result)}")
    if accepted:
        fail(f"{len(accepted)} inputs the spec rules out were accepted (declared validates_inputs=True):\n  - "
             + "\n  - ".join(accepted))


def _speaks_the_articles_errors(impl: Impl, dtype: str) -> bool:
    _, exc = impl.call_raw(bad_cases(dtype, False)[0][1])
    return exc is not None and str(exc) == RANK


@clause(
    "BAD-INPUT-ARTICLE-02",
    "a kernel raising the article's messages raises each documented one with the article's exception type",
    PRECONDITIONS,
    requires=["validates_inputs"],
    kills=["validation_by_assert"],
    tolerance="applies to kernels whose rank error is the article's (the article's own, torch-eager); others: not applicable",
)
def test_article_errors(impl, dtype):
    _needs_validation(impl)
    if not _speaks_the_articles_errors(impl, dtype):
        impl.not_applicable("its errors are not the article's (a 3-D query does not raise "
                            f"{RANK!r}); only the article's own implementation is held to its messages")
    wrong = []
    for what, case, etype, message in bad_cases(dtype, impl.declaration.dropout):
        _, exc = impl.call_raw(case)
        if isinstance(exc, NotApplicable) or type(exc) is not etype or str(exc) != message:
            got = "no error" if exc is None else f"{type(exc).__name__}({str(exc)!r})"
            wrong.append(f"{what}: raised {got}, the article raises {etype.__name__}({message!r})")
    if wrong:
        fail("the article's documented errors differ:\n  - " + "\n  - ".join(wrong))


@clause(
    "BAD-INPUT-MASK-03",
    "a mask that does not broadcast to [B, H, T, S] raises an error instead of being broadcast wrongly",
    NOT_A_MASK,
    requires=["validates_inputs", "bool_mask"],
    kills=["validates_nothing"],
)
def test_bad_mask_raises(impl, dtype):
    _needs_validation(impl)
    if not impl.declaration.bool_mask:
        impl.not_applicable("declares bool_mask=False")
    c = random_case(97, B=2, Hq=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype)
    for what, mask in (("[T+1, S] mask", np.zeros((4, 5), dtype=bool)),
                       ("[B, S+1] key padding mask", np.zeros((2, 6), dtype=bool))):
        result, exc = impl.call_raw(c.replace(mask=mask))
        if exc is None:
            fail(f"a {what} for T=3, S=5 was accepted: returned shape {np.shape(result)}", c)

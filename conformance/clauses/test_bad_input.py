"""The article's own errors: a kernel that speaks them raises each one with the article's type and message.

000 §8 states its preconditions as ``raise`` lines with their exception types and messages. Whether a
kernel refuses each invalid input at all is ``test_preconditions.py``, one precondition per clause, on
every kernel. Here a kernel whose rank error is the article's own (its reference implementation,
torch-eager) is held to every message too, so a port of the article that drifts in its errors is
seen. Cases are passed with ``impl.call_raw``: the declaration is not consulted for them, on purpose.
"""

from __future__ import annotations

import numpy as np

from conformance.contract import Case, NotApplicable
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import random_case
from conformance.harness.judge.rejection import BadInput
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import check, fail

PRECONDITIONS = Source(
    "000",
    "§8 最小 PyTorch 实现",
    "要求 Q、K、V 是同设备、同 dtype 的有限浮点张量，batch 和 head 数一致",
)

RANK = "Q、K、V 必须是四维张量"
FLOAT = "Q、K、V 必须为浮点张量"
SAME_DTYPE = "Q、K、V 必须使用相同的 dtype 和 device"
DIMS = "Q/K 特征维、K/V 长度和 batch/head 维度必须匹配"
POSITIVE = "各维度必须为正"
DROPOUT = "dropout_p 必须位于 [0, 1]"


def _all_zero_output(impl: GuardedAdapter, case: Case) -> None:
    """dropout_p = 1 drops every weight: the output is exactly 0 (000 §8's F.dropout)."""
    out = np.asarray(impl.forward(case), dtype=np.float64)
    check(
        bool(np.all(out == 0)),
        f"dropout_p = 1 must give an all-zero output; {int(np.count_nonzero(out))} elements are not 0",
        case,
    )


def bad_cases(dtype: str, dropout: bool) -> list[tuple[BadInput, type, str]]:
    """(the bad input with its valid neighbours, the article's exception type, the article's message)."""
    c = random_case(95, B=2, Hq=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype, label="valid neighbour")
    q, k, v = c.query, c.key, c.value
    cut = np.ascontiguousarray
    heads = random_case(96, B=2, Hq=3, Hkv=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype)
    q3 = heads.query
    cases = [
        (BadInput("query is 3-D", c.replace(query=cut(q[0])), [c]), ValueError, RANK),
        (BadInput("key is 5-D", c.replace(key=cut(k[None])), [c]), ValueError, RANK),
        (
            BadInput(
                "integer q, k, v",
                c.replace(query=q.astype(np.int32), key=k.astype(np.int32), value=v.astype(np.int32)),
                [c],
            ),
            TypeError,
            FLOAT,
        ),
        (
            BadInput(
                "key dtype differs from query's",
                c.replace(key=k.astype(np.float64 if dtype != "float64" else np.float32)),
                [c],
            ),
            ValueError,
            SAME_DTYPE,
        ),
        (
            BadInput(
                "key/value batch 1 against query batch 2 (broadcastable)",
                c.replace(key=cut(k[:1]), value=cut(v[:1])),
                [c],
            ),
            ValueError,
            DIMS,
        ),
        (
            BadInput(
                "3 query heads against 2 kv heads (not a multiple)",
                heads,
                [
                    heads.replace(
                        query=cut(np.concatenate([q3, q3[:, :1]], axis=1)), label="valid neighbour Hq=4 Hkv=2"
                    ),
                    heads.replace(query=cut(q3[:, :2]), label="valid neighbour Hq=2 Hkv=2"),
                ],
            ),
            ValueError,
            DIMS,
        ),
        (
            BadInput(
                "key feature dim 4 against query's 8",
                c.replace(key=cut(k[..., :4])),
                [c.replace(query=cut(q[..., :4]), key=cut(k[..., :4]), label="valid neighbour Dk=4"), c],
            ),
            ValueError,
            DIMS,
        ),
        (
            BadInput(
                "value length 4 against key length 5",
                c.replace(value=cut(v[:, :, :4])),
                [c.replace(key=cut(k[:, :, :4]), value=cut(v[:, :, :4]), label="valid neighbour S=4")],
            ),
            ValueError,
            DIMS,
        ),
        (
            BadInput(
                "no queries (T = 0)",
                c.replace(query=cut(q[:, :, :0])),
                [c.replace(query=cut(q[:, :, :1]), label="valid neighbour T=1")],
            ),
            ValueError,
            POSITIVE,
        ),
        (
            BadInput(
                "no keys (S = 0)",
                c.replace(key=cut(k[:, :, :0]), value=cut(v[:, :, :0])),
                [c.replace(key=cut(k[:, :, :1]), value=cut(v[:, :, :1]), label="valid neighbour S=1")],
            ),
            ValueError,
            POSITIVE,
        ),
    ]
    if dropout:
        cases += [
            (BadInput("dropout_p = -0.1", c.replace(dropout_p=-0.1), [c]), ValueError, DROPOUT),
            (
                BadInput(
                    "dropout_p = 1.5",
                    c.replace(dropout_p=1.5),
                    [c.replace(dropout_p=1.0, label="valid neighbour dropout_p=1")],
                    _all_zero_output,
                ),
                ValueError,
                DROPOUT,
            ),
        ]
    return cases


def _speaks_the_articles_errors(impl: GuardedAdapter, dtype: str) -> bool:
    _, exc = impl.call_raw(bad_cases(dtype, False)[0][0].case)
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
    if not _speaks_the_articles_errors(impl, dtype):
        impl.not_applicable(
            "its errors are not the article's (a 3-D query does not raise "
            f"{RANK!r}); only the article's own implementation is held to its messages"
        )
    wrong = []
    for bad, etype, message in bad_cases(dtype, impl.declaration.dropout):
        what, case = bad.what, bad.case
        _, exc = impl.call_raw(case)
        if isinstance(exc, NotApplicable) or type(exc) is not etype or str(exc) != message:
            got = "no error" if exc is None else f"{type(exc).__name__}({str(exc)!r})"
            wrong.append(f"{what}: raised {got}, the article raises {etype.__name__}({message!r})")
    if wrong:
        fail("the article's documented errors differ:\n  - " + "\n  - ".join(wrong))

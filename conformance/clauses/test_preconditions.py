"""Inputs the spec rules out are refused, one precondition at a time, and every run says which a kernel accepts.

000 §8 states its preconditions as code: 4-D floating tensors of one dtype, matching batch, head,
feature and length dims, ``dropout_p`` in [0, 1]; §4 and §7.1 ask for a mask that broadcasts to
[B, H, T, S] ("不要把 [B,S] 直接传给下面的核心函数"). A kernel that returns a number for such a call
turns a caller's bug into a plausible array. Each precondition is its own clause (its own verdict
line, likely cause and expectations entry: ``bad input: kv-length``), run on every kernel whatever it
declares: a kernel that validates (the spec's, and the default) must refuse each bad input with an
exception of a declared class (``rejects_with``; ``NotApplicable`` never counts) and accept its valid
neighbour, the same case with the one defect repaired, answering it as the oracle does; one that
declares ``validates_inputs=False`` or names the precondition in ``accepts_invalid`` is measured all
the same, and what it did is in the run's summary and certificate (``harness.run.preconditions``),
beside the deviation the verdict lists. Cases go through ``impl.call_raw``: the declaration is not
consulted for them, on purpose.

Positive dims (T = 0, B = 0) are not here: torch answers them with empty arrays, the article refuses
them; ``test_empty_sizes.py`` accepts either.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from conformance.contract import Case, Presentation
from conformance.harness.calls.guarded import GuardedAdapter
from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.cases.preconditions import WORDS, broken
from conformance.harness.judge import compare, rejection
from conformance.harness.judge.rejection import BadInput
from conformance.harness.run import preconditions as seen
from conformance.harness.spec.clause import Source, clause
from conformance.harness.spec.report import ClauseViolation

PRECONDITIONS = Source(
    "000", "§8 最小 PyTorch 实现", "要求 Q、K、V 是同设备、同 dtype 的有限浮点张量，batch 和 head 数一致"
)
RANK = Source("000", "§8 最小 PyTorch 实现", "Q、K、V 必须是四维张量")
FLOAT = Source("000", "§8 最小 PyTorch 实现", "Q、K、V 必须为浮点张量")
SAME_DTYPE = Source("000", "§8 最小 PyTorch 实现", "Q、K、V 必须使用相同的 dtype 和 device")
DIMS = Source("000", "§8 最小 PyTorch 实现", "Q/K 特征维、K/V 长度和 batch/head 维度必须匹配")
DROPOUT = Source("000", "§8 最小 PyTorch 实现", "dropout_p 必须位于 [0, 1]")
GQA = Source(
    "003", "主动回忆", "若 Q=[B,32,1,128]、K=[B,8,T,128]，为什么不能直接按普通 MHA 公式相乘？这提示了什么结构？"
)
NOT_A_MASK = Source(
    "000",
    "§7.1 Padding Mask",
    "不要把 [B,S] 直接传给下面的核心函数：广播从尾维对齐，可能报错，也可能恰好尺寸相同而错误广播。",
)
MASK_SHAPES = Source("000", "§4 完整 Shape 检查", "Mask:    [T, S]、[B, 1, T, S] 或可广播形状")

cut = np.ascontiguousarray


def _base(dtype: str, **dims) -> Case:
    shape = dict(B=2, Hq=2, T=3, S=5, Dk=8, Dv=8) | dims
    return random_case(95, dtype=dtype, label="valid neighbour", **shape)


def _rank(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    return [
        BadInput("query is 3-D", c.replace(query=cut(c.query[0])), [c]),
        BadInput("key is 5-D", c.replace(key=cut(c.key[None])), [c]),
    ]


def _integer(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    ints = {n: getattr(c, n).astype(np.int32) for n in ("query", "key", "value")}
    return [BadInput("integer q, k, v", c.replace(**ints), [c])]


def _mixed_dtype(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    other = np.float64 if dtype != "float64" else np.float32
    return [BadInput("a key in another float dtype than the query's", c.replace(key=c.key.astype(other)), [c])]


def _batch(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    return [
        BadInput(
            "key and value batch 1 against query batch 2", c.replace(key=cut(c.key[:1]), value=cut(c.value[:1])), [c]
        )
    ]


def _heads(dtype: str) -> list[BadInput]:
    c = random_case(96, B=2, Hq=3, Hkv=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype)
    q = c.query
    return [
        BadInput(
            "3 query heads against 2 key heads",
            c,
            [
                c.replace(query=cut(np.concatenate([q, q[:, :1]], axis=1)), label="valid neighbour Hq=4 Hkv=2"),
                c.replace(query=cut(q[:, :2]), label="valid neighbour Hq=2 Hkv=2"),
            ],
        )
    ]


def _gqa_flag(dtype: str) -> list[BadInput]:
    c = random_case(97, B=2, Hq=4, Hkv=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype)
    return [
        BadInput(
            "4 query heads against 2 key heads, enable_gqa=False",
            c.replace(enable_gqa=False),
            [c.replace(enable_gqa=True, label="valid neighbour enable_gqa=True")],
        )
    ]


def _feature(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    return [
        BadInput(
            "key feature dim 4 against query's 8",
            c.replace(key=cut(c.key[..., :4])),
            [c.replace(query=cut(c.query[..., :4]), key=cut(c.key[..., :4]), label="valid neighbour Dk=4"), c],
        )
    ]


def _kv_length(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    return [
        BadInput(
            "value length 4 against key length 5",
            c.replace(value=cut(c.value[:, :, :4])),
            [c.replace(key=cut(c.key[:, :, :4]), value=cut(c.value[:, :, :4]), label="valid neighbour S=4")],
        )
    ]


def _masks(dtype: str) -> tuple[Case, np.ndarray, np.ndarray]:
    c = _base(dtype)
    rows = random_mask(97, (3, 5), p_blocked=0.4)
    rows[:, 0] = False  # no row blocked entirely: the neighbour's answer is not a fill policy
    keys = random_mask(98, (2, 5), p_blocked=0.4)
    keys[:, 0] = False
    return c, rows, keys


def _mask_shape(dtype: str) -> list[BadInput]:
    c, rows, keys = _masks(dtype)
    return [
        BadInput(
            "[T+1, S] mask for T=3, S=5",
            c.replace(mask=np.concatenate([rows, rows[:1]])),
            [c.replace(mask=rows, label="valid neighbour: [T, S] mask")],
        ),
        BadInput(
            "[B, S] key padding mask passed as is (000 §7.1)",
            c.replace(mask=keys),
            [
                c.replace(
                    mask=cut(keys[:, None, None, :]), label="valid neighbour: the same padding mask as [B, 1, 1, S]"
                )
            ],
        ),
    ]


def _mask_larger(dtype: str) -> list[BadInput]:
    c, rows, _ = _masks(dtype)
    full = np.broadcast_to(rows, (2, 2, 3, 5))
    return [
        BadInput(
            "[2, B, H, T, S] mask (a leading axis more than the scores have)",
            c.replace(mask=cut(np.broadcast_to(full, (2, *full.shape)))),
            [c.replace(mask=cut(full), label="valid neighbour: the [B, H, T, S] mask")],
        )
    ]


def _all_zero_output(impl: GuardedAdapter, case: Case) -> None:
    """dropout_p = 1 drops every weight: the output is exactly 0 (000 §8's F.dropout)."""
    out = np.asarray(impl.forward(case), dtype=np.float64)
    if not np.all(out == 0):
        raise ClauseViolation(
            f"dropout_p = 1 must give an all-zero output; {int(np.count_nonzero(out))} elements are not 0", case
        )


def _dropout_range(dtype: str) -> list[BadInput]:
    c = _base(dtype)
    return [
        BadInput("dropout_p = -0.1", c.replace(dropout_p=-0.1), [c]),
        BadInput(
            "dropout_p = 1.5",
            c.replace(dropout_p=1.5),
            [c.replace(dropout_p=1.0, label="valid neighbour dropout_p=1")],
            _all_zero_output,
        ),
    ]


def _check(impl: GuardedAdapter, dtype: str, name: str, build: Callable[[str], list[BadInput]]) -> None:
    """Each bad input of precondition ``name``: refused with a declared class where the kernel is held to
    it, recorded as what it did either way; each valid neighbour accepted and right."""
    decl = impl.declaration
    bad_inputs = build(dtype)
    for b in bad_inputs:
        assert broken(b.case) == [name], (b.what, broken(b.case))  # the table reads the case as it is meant
    held = decl.validates_inputs and name not in decl.accepts_invalid
    problems, first = [], None
    for b in bad_inputs:
        result, exc = impl.call_raw(b.case)
        seen.record(impl, name, b.what, result, exc)
        problem = rejection.judge(decl, b.what, result, exc)
        if held and problem is not None:
            problems.append(problem)
            first = first or b.case
    if "grad_mode" in decl.presents:
        # The first bad input again under autograd with no grad-mode context of the suite's own around the call: a
        # kernel that switches autograd off and raises leaves its caller's grad mode off, which the guarded call
        # sees (it reads the process state after a call that raised as after one that returned).
        b = bad_inputs[0]
        impl.call_raw(b.case.replace(presentation=Presentation(grad_mode="grad"), label=f"{b.what}, under autograd"))
    neighbour: ClauseViolation | None = None  # the first valid neighbour that failed, as the guarded call said
    for b in bad_inputs:
        good = rejection.first_supported(impl, b.neighbours)
        if good is None:
            continue
        try:
            (b.check or compare.assert_output_matches)(impl, good)
        except ClauseViolation as exc:
            problems.append(f"the valid neighbour of '{b.what}' failed:\n    " + str(exc).replace("\n", "\n    "))
            neighbour = neighbour or type(exc)(
                f"the valid neighbour of '{b.what}' (the same call with its one defect repaired) failed: {exc}",
                exc.case,
            )
    if first is None and neighbour is not None:
        raise neighbour  # a valid call failed: its own kind and case, for its likely cause and expectations
    if problems:
        declare = "--declare accepts_invalid=" + ",".join(sorted({*decl.accepts_invalid, name}))
        raise ClauseViolation(
            f"{WORDS[name]}: {len(problems)} problem(s):\n  - "
            + "\n  - ".join(problems)
            + f"\n  a kernel that accepts this on purpose declares it ({declare}); the verdict then lists the departure",
            first,
        )


def _clause(cid: str, name: str, source: Source, build, kills: list[str], requires: tuple[str, ...] = ()):
    @clause(
        cid,
        f"{WORDS[name]} is refused with an error of a declared class where the kernel validates (what it does is "
        "measured and listed on every run), and the valid neighbour is accepted and answered as the oracle does",
        source,
        requires=list(requires),
        kills=kills,
    )
    def test(impl, dtype):
        _check(impl, dtype, name, build)

    test.__name__ = test.__qualname__ = f"test_refuses_{name.replace('-', '_')}"
    return test


test_refuses_rank = _clause(
    "PRECOND-RANK-01", "rank", RANK, _rank, ["accepts_rank", "validates_nothing", "refused_call_leaves_grad_mode_off"]
)
test_refuses_integer = _clause(
    "PRECOND-FLOAT-02", "integer", FLOAT, _integer, ["accepts_integer", "bad_input_crashes_keyerror"]
)
test_refuses_mixed_dtype = _clause(
    "PRECOND-DTYPE-03", "mixed-dtype", SAME_DTYPE, _mixed_dtype, ["accepts_mixed_dtype", "validation_by_assert"]
)
test_refuses_batch = _clause("PRECOND-BATCH-04", "batch", DIMS, _batch, ["accepts_batch", "rejects_everything"])
test_refuses_heads = _clause("PRECOND-HEADS-05", "heads", DIMS, _heads, ["accepts_heads"])
test_refuses_gqa_flag = _clause(
    "PRECOND-GQA-FLAG-06", "gqa-flag", GQA, _gqa_flag, ["accepts_gqa_flag"], requires=("gqa", "gqa_flag")
)
test_refuses_feature = _clause("PRECOND-FEATURE-07", "feature", DIMS, _feature, ["accepts_feature"])
test_refuses_kv_length = _clause("PRECOND-KV-LENGTH-08", "kv-length", DIMS, _kv_length, ["accepts_kv_length"])
test_refuses_mask_shape = _clause(
    "PRECOND-MASK-SHAPE-09",
    "mask-shape",
    NOT_A_MASK,
    _mask_shape,
    ["accepts_mask_shape", "refuses_bad_input_as_not_applicable"],
    requires=("bool_mask",),
)
test_refuses_mask_larger = _clause(
    "PRECOND-MASK-LARGER-10", "mask-larger", MASK_SHAPES, _mask_larger, ["accepts_mask_larger"], requires=("bool_mask",)
)
test_refuses_dropout_range = _clause(
    "PRECOND-DROPOUT-11", "dropout-range", DROPOUT, _dropout_range, ["accepts_dropout_range"], requires=("dropout",)
)

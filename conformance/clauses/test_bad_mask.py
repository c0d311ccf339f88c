"""A mask that does not broadcast to [B, H, T, S] raises an error (000_f3dcd408372d9e02.txt §7.1).

The article warns that a [B, S] key padding mask passed to the core function as is broadcasts from
the trailing axes: it may raise, or it may happen to fit and broadcast wrongly. A kernel that
declares ``validates_inputs`` must refuse such a mask with an error of a declared class and accept
the same mask in the right shape, as in test_bad_input.py (``conformance.harness.judge.rejection``).
"""

from __future__ import annotations

import numpy as np

from conformance.harness.cases.build import random_case, random_mask
from conformance.harness.judge.rejection import BadInput, check_rejections
from conformance.harness.spec.clause import Source, clause

NOT_A_MASK = Source(
    "000",
    "§7.1 Padding Mask",
    "不要把 [B,S] 直接传给下面的核心函数：广播从尾维对齐，可能报错，也可能恰好尺寸相同而错误广播。",
)


@clause(
    "BAD-INPUT-MASK-03",
    "a mask that does not broadcast to [B, H, T, S] raises an error of a declared class instead of being broadcast "
    "wrongly, and the mask of the right shape is accepted",
    NOT_A_MASK,
    requires=["validates_inputs", "bool_mask"],
    kills=["validates_nothing", "rejects_everything", "refuses_bad_input_as_not_applicable"],
)
def test_bad_mask_raises(impl, dtype):
    c = random_case(97, B=2, Hq=2, T=3, S=5, Dk=8, Dv=8, dtype=dtype)
    rows = random_mask(97, (3, 5), p_blocked=0.4)
    rows[:, 0] = False  # no all-blocked row: the neighbour's answer is not a fill policy
    keys = random_mask(98, (2, 5), p_blocked=0.4)
    keys[:, 0] = False
    bad = [
        BadInput(
            "[T+1, S] mask for T=3, S=5",
            c.replace(mask=np.concatenate([rows, rows[:1]])),
            [c.replace(mask=rows, label="valid neighbour: [T, S] mask")],
        ),
        BadInput(
            "[B, S] key padding mask passed as is (§7.1)",
            c.replace(mask=keys),
            [
                c.replace(
                    mask=np.ascontiguousarray(keys[:, None, None, :]),
                    label="valid neighbour: the same padding mask as [B, 1, 1, S]",
                )
            ],
        ),
    ]
    check_rejections(impl, bad, "masks that do not broadcast to [B, H, T, S]")

"""The torch adapters hand kernels the layouts a clause built, and no layout a user could not have.

A permuted NumPy array with a last axis of length one may carry any stride on that axis; copied with
``order="K"`` it reached torch as ``stride(-1) == 4``, which torch's fused kernels refuse ("All fused
kernels require the last dimension of the input to have stride 1"). A user's ``x.transpose(1, 2)`` of a
``[B, T, H, 1]`` buffer has stride 1 there, so the refusal was the adapter's artefact, seen as an
undeclared refusal of torch-sdpa-flash in a random-seed stability run (GRAD-VJP-SPACE-04, D = 1).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from implementations._torch import to_torch


@pytest.mark.parametrize("d", [1, 3])
def test_permuted_layout_keeps_the_permutation_and_a_unit_last_stride(d):
    x = np.arange(1 * 2 * 3 * d, dtype=np.float32).reshape(1, 2, 3, d)
    permuted = np.ascontiguousarray(np.swapaxes(x, 1, 2)).swapaxes(1, 2)  # a [B,T,H,D] buffer seen as [B,H,T,D]
    t = to_torch(permuted)
    assert t.stride(-1) == 1
    assert not t.is_contiguous() or d == 1  # the permutation survives (for d == 1 torch may call it contiguous)
    assert t.stride(1) < t.stride(2)  # heads inner to time, as in the buffer
    np.testing.assert_array_equal(t.numpy(), x)


def test_flash_backend_accepts_a_permuted_single_column_head():
    q = np.ascontiguousarray(np.swapaxes(np.ones((1, 2, 2, 1), np.float32), 1, 2)).swapaxes(1, 2)
    t = to_torch(q, requires_grad=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(t, t, t)
    out.sum().backward()
    assert t.grad is not None

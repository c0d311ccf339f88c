"""Kernels that break under a transform instead of refusing it: an error that is not the framework's words for
a missing rule.

A kernel without a forward-mode rule or a batching rule says so in its framework's words (torch's
NotImplementedError "Trying to use forward AD with ... that does not support it", "Batching rule not
implemented"), and the suite records a refused transform, a measured capability. A kernel that reaches an index
past an axis under vmap, because it read a shape the batched tensor does not have, has a bug there: the clause
fails (harness.calls.guarded.is_transform_refusal tells the two apart).
"""

from __future__ import annotations

from tests.mutants import mutant
from tests.mutants_calls import _Call
from tests.trust_kernels import reference


@mutant("transform_vmap_breaks_with_index_error")
class TransformVmapBreaksWithIndexError(_Call):
    """Right in every plain call; under vmap it indexes its per-head scratch by the logical head count plus the
    vmap axis and raises torch's IndexError-like RuntimeError ("index 2 is out of bounds"), not a refusal."""

    @staticmethod
    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        if torch._C._functorch.is_batchedtensor(q):
            raise RuntimeError(f"index {q.shape[-3]} is out of bounds for dimension 0 with size {q.shape[-3]}")
        return reference(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)

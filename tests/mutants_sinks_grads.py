"""Deliberately wrong variant kernels, the backward and attention sinks.

Each overrides one hook of ``VariantKernel`` (tests/mutants_variants.py, a correct kernel with
FlashAttention's variants, a backward and sinks): the softcap's backward without its derivative or
with tanh(s) for tanh(s/c); a backward that recomputes P without the window or the lengths; sinks
ignored, not exponentiated, read per kv head, added to every score, or left out of the lse.
"""

from __future__ import annotations

import numpy as np

from tests.mutants import mutant
from tests.mutants_variants import VariantKernel


# -- the backward ----------------------------------------------------------------------------------
@mutant("softcap_grad_no_derivative")
class SoftcapGradNoDerivative(VariantKernel):
    """The backward treats the softcap as a constant shift (dS passed on as if the cap were the identity)."""

    def cap_grad(self, s, c):
        return np.ones_like(s)


@mutant("softcap_grad_without_c")
class SoftcapGradWithoutC(VariantKernel):
    """The backward's derivative forgets the division by c: 1 - tanh(s)^2."""

    def cap_grad(self, s, c):
        return 1.0 - np.tanh(s) ** 2


@mutant("grad_window_ignored")
class GradWindowIgnored(VariantKernel):
    """The backward recomputes P without the sliding window (the forward applies it)."""

    def backward_case(self, case):
        return case.replace(window=None)


@mutant("grad_varlen_ignored")
class GradVarlenIgnored(VariantKernel):
    """The backward recomputes P over the padded batch, without the sequences' lengths."""

    def backward_case(self, case):
        return case.replace(seqlens_q=None, seqlens_k=None)


# -- attention sinks ------------------------------------------------------------------------------
@mutant("sinks_ignored")
class SinksIgnored(VariantKernel):
    """The sink never reaches the softmax: the weights sum to 1 as without sinks."""

    def sink_term(self, sink, m):
        return np.zeros_like(m)


@mutant("sinks_not_exponentiated")
class SinksNotExponentiated(VariantKernel):
    """The sink logit is added to the denominator as it is, not as exp(sink - max)."""

    def sink_term(self, sink, m):
        return np.broadcast_to(sink, m.shape).astype(m.dtype)


@mutant("sinks_per_kv_head")
class SinksPerKvHead(VariantKernel):
    """Query head h reads the sink of its kv head, sinks[h // G], instead of its own (a GQA index mix-up)."""

    def sink_logits(self, case):
        heads = np.arange(case.Hq) // (case.Hq // case.Hkv)
        return np.asarray(case.sinks, dtype=np.float64)[heads][None, :, None]


@mutant("sink_added_to_scores")
class SinkAddedToScores(VariantKernel):
    """The sink is added to every score (and so to the numerators) as well as being a column:
    exp(s_j + sink) / (sum exp(s_k + sink) + exp(sink)), i.e. as if every sink were 0."""

    def sink_logits(self, case):
        return np.zeros((1, case.Hq, 1))


@mutant("lse_without_sink")
class LseWithoutSink(VariantKernel):
    """The output has the sink, the returned lse leaves it out of the normaliser."""

    def lse(self, case):
        return super().lse(case.replace(sinks=None))

"""The definition of attention sinks the SINKS clauses cite: jax's own splash-attention reference, verbatim.

The seed has no sinks. gpt-oss introduced them to open models (one learned logit per query head
that joins every row's softmax as a column with no value, dropped after it), and the kernels that
take them (FlashInfer's and FlashAttention's ``sinks``, jax's splash attention) follow the same
definition. The excerpt cited is jax's pure-jnp reference for its splash-attention kernel, from
jax 0.10.2 (Apache-2.0, "Copyright 2023 The JAX Authors"), a dependency this project installs:
``jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py`` lines 170-207,
copied unchanged (tests/test_oracle_variants.py re-reads it from the installed jax when the
version matches). It is registered in :data:`conformance.harness.spec.definitions.DOCUMENTS` under
``"jax-splash-sinks"`` so that a :class:`~conformance.harness.spec.definitions.Definition` can cite it and
tests/test_definitions.py checks every quote, as for FlashAttention's documents. (It lives in its own
module because definitions.py belongs to another part of the project; moving the Document there is
a one-line change.)
"""

from __future__ import annotations

from conformance.harness.spec.definitions import DOCUMENTS, Definition, Document

JAX_SPLASH_REFERENCE = Document(
    title="jax splash attention, _attention_reference_default (sinks)",
    repo="jax-ml/jax",
    commit="jax-0.10.2",  # the release this project installs (no git hash in the wheel)
    path="jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py",
    lines="170-207",
    text="""
def _attention_reference_default(
    mask: jax.Array,  # [q_seq_len, kv_seq_len]
    q: jax.Array,  # [q_seq_len, head_dim]
    k: jax.Array,  # [kv_seq_len, head_dim]
    v: jax.Array,  # [kv_seq_len, head_dim]
    segment_ids: SegmentIds | None,
    sinks: jax.Array | None,  # [] one scalar per qhead
    mask_value: float,
    save_residuals: bool,
    custom_type: str,
    attn_logits_soft_cap: float | None,
):
  del custom_type
  logits = jnp.einsum("sd,td->st", q.astype(jnp.float32), k.astype(jnp.float32))

  if segment_ids is not None:
    mask = jnp.logical_and(
        mask, segment_ids.q[:, None] == segment_ids.kv[None, :]
    )

  if attn_logits_soft_cap is not None:
    logits = jnp.tanh(logits / attn_logits_soft_cap)
    logits = logits * attn_logits_soft_cap

  logits = jnp.where(mask, logits, mask_value)
  m = logits.max(axis=-1)
  sinks = None if sinks is None else sinks.astype(logits.dtype)
  m = m if sinks is None else jnp.maximum(m, sinks)
  s = jnp.exp(logits - m[..., None])
  l = s.sum(axis=-1) + (0 if sinks is None else jnp.exp(sinks - m))
  s = s / l[..., None]

  o = jnp.einsum("st,td->sd", s, v.astype(jnp.float32))

  logsumexp = m + jnp.log(l)
  if save_residuals:
    return o, (logsumexp,)
  return o
""",
)
DOCUMENTS.setdefault("jax-splash-sinks", JAX_SPLASH_REFERENCE)

SINKS_DEF = Definition(
    "jax-splash-sinks",
    "_attention_reference_default: the sink joins the row max and the denominator, not the numerator",
    (
        "sinks: jax.Array | None,  # [] one scalar per qhead",
        "m = m if sinks is None else jnp.maximum(m, sinks)",
        "l = s.sum(axis=-1) + (0 if sinks is None else jnp.exp(sinks - m))",
        "s = s / l[..., None]",
    ),
)

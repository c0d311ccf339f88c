"""``--impl=module:function --signature=flash-attn`` certifies a function with FlashAttention 2's signature.

What is checked: the adapter only translates (layout [B, T, H, D], each variant to its own argument,
arguments a case does not use left out, the lse taken from ``return_attn_probs``); the NumPy
reference kernel conforms on every variant clause; functions with the issue's bugs, called through
the very same signature, fail with a message naming the variant; and the command line does it with
no adapter code (an in-process pytest run on the variant clauses), refusing ``--signature`` where it
has no meaning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conformance import oracle_variants
from conformance.harness.calls import registry, signatures
from conformance.harness.cases.build import random_case
from implementations.flash_attn_function import (
    FLASH_ATTN_DEFAULTS,
    FLASH_ATTN_VARLEN_DEFAULTS,
    FlashAttnFunctionAdapter,
    FlashAttnVarlenFunctionAdapter,
)
from implementations.numpy_flash import flash_attn_func, flash_attn_varlen_func
from tests.clause_runner import dtypes_for, run_clause

pytest_plugins = ["pytester"]

VARIANT_CLAUSES = str(Path(__file__).resolve().parents[1] / "conformance" / "clauses" / "test_variants.py")
LSE_CLAUSES = str(Path(VARIANT_CLAUSES).with_name("test_lse.py"))
REFERENCE = "implementations.numpy_flash:flash_attn_func"


def _catalog():
    from tests.clause_runner import load_clauses

    mods = ("test_variants", "test_lse", "test_varlen", "test_kvcache", "test_sinks")
    return {cid: info for cid, info in load_clauses().items() if info.module.endswith(mods)}


class Spy:
    """Records how the adapter calls the function, and answers with the reference kernel."""

    def __init__(self):
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, q, k, v, **kwargs):
        self.calls.append(((q, k, v), kwargs))
        return flash_attn_func(q, k, v, **kwargs)


def test_the_adapter_only_translates():
    spy = Spy()
    adapter = FlashAttnFunctionAdapter(spy, "spy")
    case = random_case(1, B=2, Hq=6, Hkv=2, T=3, S=5, Dk=8, Dv=4, dtype="float16")
    adapter.forward(case)
    (q, k, v), kwargs = spy.calls[-1]
    assert tuple(q.shape) == (2, 3, 6, 8) and tuple(k.shape) == (2, 5, 2, 8) and tuple(v.shape) == (2, 5, 2, 4)
    assert q.is_contiguous() and q.dtype == torch.float16
    assert np.array_equal(q.float().numpy(), np.swapaxes(case.query, 1, 2).astype(np.float32))
    assert kwargs == {"softmax_scale": None, "causal": False}  # nothing the case does not use
    sl = oracle_variants.alibi_slopes_for(6).astype(np.float32)
    adapter.forward_with_lse(case.replace(window=(2, 0), softcap=3.0, alibi_slopes=sl, is_causal=True, scale=0.5))
    _, kwargs = spy.calls[-1]
    assert kwargs["window_size"] == (2, 0) and kwargs["softcap"] == 3.0 and kwargs["causal"] is True
    assert kwargs["softmax_scale"] == 0.5 and kwargs["return_attn_probs"] is True
    assert kwargs["alibi_slopes"].dtype == torch.float32 and np.array_equal(kwargs["alibi_slopes"].numpy(), sl)


def test_a_mask_has_no_argument_to_go_to():
    from conformance.contract import NotApplicable

    adapter = FlashAttnFunctionAdapter(flash_attn_func, "ref")
    case = random_case(2, B=1, Hq=2, T=3, S=4, Dk=8, mask=np.zeros((3, 4), dtype=bool))
    assert adapter.declaration.not_supported_reasons(case)  # the declaration says so first
    with pytest.raises(NotApplicable):
        adapter.forward(case)


def test_the_kvcache_adapter_lowers_to_shuffled_pages():
    from conformance.contract import CacheForm
    from implementations.flash_attn_kvcache import lowered_cache
    from tests.mutants_kvcache import gather

    sk = np.array([7, 1, 12])
    case = random_case(4, B=3, Hq=2, Hkv=2, T=1, S=12, Dk=8, dtype="float32").replace(seqlens_k=sk)
    for page in (1, 5, 16):
        parts = lowered_cache(case, CacheForm(page_size=page, append=1, seed=page))
        table, kc = parts["block_table"], parts["k_cache"]
        assert table.dtype == np.int32 and kc.shape[1] == page
        assert np.array_equal(parts["cache_seqlens"], (sk - 1).astype(np.int32))
        used = [int(table[b, p]) for b in range(3) for p in range(-(-int(sk[b]) // page))]
        assert 0 not in used and len(set(used)) == len(used)  # the null block is nobody's; no page shared
        assert np.abs(kc[0]).max() > 10  # the null block holds filler, never keys
        for b in range(3):
            cached = gather(kc, table, b, int(sk[b]) - 1, page)
            assert np.array_equal(cached, np.swapaxes(case.key[b], 0, 1)[: sk[b] - 1])
            assert np.array_equal(parts["k"][b, 0], case.key[b, :, sk[b] - 1])
        in_order = 1 + np.arange(3)[:, None] * table.shape[1] + np.arange(table.shape[1])[None, :]
        assert not np.array_equal(table, in_order)  # shuffled: a kernel that ignores the table reads wrong pages


def test_the_defaults_are_flash_attention_2s_conventions():
    d = FLASH_ATTN_DEFAULTS
    assert d.causal_alignment == "bottom-right" and d.gqa and not d.bool_mask and not d.float_mask
    assert d.window and d.softcap and d.alibi and d.returns_lse and d.lse_base == "e"


def _references():
    """The NumPy references of each signature, and the dense NumPy kernel (the padded + mask form of
    a varlen batch, VARLEN-PADDED-05, is for kernels that take a mask and no lengths)."""
    from implementations.numpy_flash import NumpyFlashKVCacheAdapter
    from implementations.numpy_kernel import NumpyAdapter

    return (
        FlashAttnFunctionAdapter(
            flash_attn_func, "numpy-flash-attn", FLASH_ATTN_DEFAULTS.replace(grad=False, sinks=True)
        ),
        FlashAttnVarlenFunctionAdapter(
            flash_attn_varlen_func, "numpy-flash-attn-varlen", FLASH_ATTN_VARLEN_DEFAULTS.replace(grad=False)
        ),
        NumpyFlashKVCacheAdapter(),
        NumpyAdapter(),
    )


@pytest.mark.parametrize("clause_id", sorted(_catalog()))
def test_the_numpy_references_conform_on_every_variant_clause(clause_id):
    """Each reference passes every variant clause its declaration covers, and some reference runs each."""
    info = _catalog()[clause_id]
    verdicts = {(a.name, d): run_clause(info, a, d) for a in _references() for d in dtypes_for(info)}
    failed = {k: v for k, v in verdicts.items() if not v.startswith(("passed", "skipped: not applicable"))}
    assert not failed, failed
    assert any(v == "passed" for v in verdicts.values()), verdicts


def test_the_varlen_adapter_packs_and_unpacks():
    calls = []

    def spy(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        calls.append((q, k, v, cu_q, cu_k, max_q, max_k, kw))
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    adapter = FlashAttnVarlenFunctionAdapter(spy, "spy")
    case = random_case(3, B=3, Hq=4, Hkv=2, T=5, S=7, Dk=8, dtype="float32").replace(
        seqlens_q=np.array([5, 0, 2]), seqlens_k=np.array([7, 3, 1]), is_causal=True
    )
    out = adapter.forward(case)
    q, k, _, cu_q, cu_k, max_q, max_k, kw = calls[-1]
    assert tuple(q.shape) == (7, 4, 8) and tuple(k.shape) == (11, 2, 8)
    assert cu_q.dtype == torch.int32 and cu_q.tolist() == [0, 5, 5, 7] and cu_k.tolist() == [0, 7, 10, 11]
    assert (max_q, max_k) == (5, 7) and kw == {"softmax_scale": None, "causal": True}
    assert np.array_equal(q[5:7].numpy(), np.swapaxes(case.query[2, :, :2], 0, 1))
    assert (out[1] == 0).all() and (out[2, :, 2:] == 0).all()  # padded rows come back as 0


# -- the bugs, as functions with the flash-attn signature ----------------------------------
def window_as_w_w(q, k, v, window_size=(-1, -1), **kw):
    """Forwards the left size for both sides."""
    return flash_attn_func(q, k, v, window_size=(window_size[0], window_size[0]), **kw)


def window_off_by_one(q, k, v, window_size=(-1, -1), **kw):
    """Shrinks the left side by one key (an exclusive left edge)."""
    left, right = window_size
    return flash_attn_func(q, k, v, window_size=(left - 1 if left > 0 else left, right), **kw)


def softcap_ignored(q, k, v, softcap=0.0, **kw):
    return flash_attn_func(q, k, v, **kw)


def alibi_recomputed_pow2(q, k, v, alibi_slopes=None, **kw):
    """Ignores the slopes it is given and uses 2^(-8 (h + 1) / H), right for powers of two only."""
    if alibi_slopes is not None:
        h = q.shape[2]
        alibi_slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=torch.float32)
    return flash_attn_func(q, k, v, alibi_slopes=alibi_slopes, **kw)


def lse_base2(q, k, v, **kw):
    res = flash_attn_func(q, k, v, **kw)
    if kw.get("return_attn_probs"):
        return res[0], res[1] / float(np.log(2.0)), res[2]
    return res


def lse_kv_major(q, k, v, **kw):
    res = flash_attn_func(q, k, v, **kw)
    if kw.get("return_attn_probs"):
        lse = res[1]
        b, h, t = lse.shape
        g = h // k.shape[2]
        return res[0], lse.reshape(b, k.shape[2], g, t).transpose(1, 2).reshape(b, h, t), res[2]
    return res


def varlen_reads_max_seqlen_k(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    """Each sequence reads max_seqlen_k keys from its start: past its end, into the next sequence."""
    ends = [min(int(cu_k[b]) + max_k, k.shape[0]) for b in range(len(cu_k) - 1)]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        res = flash_attn_func(
            q[None, int(cu_q[b]) : int(cu_q[b + 1])],
            k[None, int(cu_k[b]) : ends[b]],
            v[None, int(cu_k[b]) : ends[b]],
            return_attn_probs=True,
            **{n: x for n, x in kw.items() if n != "return_attn_probs"},
        )
        outs.append(res[0][0])
        lses.append(res[1][0])
    out = torch.cat(outs, dim=0)
    return (out, torch.cat(lses, dim=1), None) if kw.get("return_attn_probs") else out


BUGGY = [
    (window_as_w_w, "WINDOW-01", "window (2, 0)"),
    (window_off_by_one, "WINDOW-01", "window (2, 0)"),
    (softcap_ignored, "SOFTCAP-01", "softcap 1"),
    (alibi_recomputed_pow2, "ALIBI-01", "ALiBi slopes [6]"),
    (lse_base2, "LSE-01", "base 2"),
    (lse_kv_major, "LSE-GQA-02", "kv-major order"),
    (varlen_reads_max_seqlen_k, "VARLEN-01", "sequences that differ: b=0 (T_b=5, S_b=9)"),
]


@pytest.mark.parametrize("fn,clause_id,words", BUGGY, ids=[f.__name__ for f, _, _ in BUGGY])
def test_a_buggy_function_fails_naming_the_variant(fn, clause_id, words):
    adapter = FlashAttnFunctionAdapter(fn, fn.__name__, FLASH_ATTN_DEFAULTS.replace(grad=False))
    if clause_id.startswith("VARLEN"):
        adapter = FlashAttnVarlenFunctionAdapter(fn, fn.__name__, FLASH_ATTN_VARLEN_DEFAULTS.replace(grad=False))
    verdict = run_clause(_catalog()[clause_id], adapter, "float32")
    assert verdict.startswith("failed:"), verdict
    assert words in verdict, verdict


# -- the command line ------------------------------------------------------------------------------
def test_signature_names_resolve_to_their_adapters():
    res = registry.resolve(REFERENCE, {"grad": False}, "flash-attn")
    assert isinstance(res.adapter, FlashAttnFunctionAdapter) and res.usable
    assert res.adapter.declaration.grad is False and res.adapter.declaration.causal_alignment == "bottom-right"
    assert type(registry.resolve(REFERENCE).adapter).__name__ == "FunctionAdapter"  # sdpa stays the default
    with pytest.raises(ValueError, match="unknown signature"):
        signatures.adapter_class("flash-attn-9")


def test_signature_for_an_adapter_is_a_usage_error():
    with pytest.raises(registry.ImplSpecError, match="describes a plain function"):
        registry.resolve("numpy", None, "flash-attn")


@pytest.mark.usefixtures("restore_hypothesis_profile")
def test_command_line_certifies_the_reference_on_the_variant_clauses(pytester):
    result = pytester.runpytest_inprocess(
        VARIANT_CLAUSES,
        LSE_CLAUSES,
        f"--impl={REFERENCE}",
        "--signature=flash-attn",
        "--declare=grad=false",
        "--allow-partial",
        "-p",
        "no:cacheprovider",
        "-q",
    )
    out = result.stdout.str()
    assert result.ret == 0, out
    assert f"{REFERENCE}: PARTIAL" in out and "failed" not in out.split("sdpa-conformance summary")[-1], out


@pytest.mark.usefixtures("restore_hypothesis_profile")
def test_command_line_fails_a_buggy_function(pytester):
    result = pytester.runpytest_inprocess(
        VARIANT_CLAUSES,
        "--impl=tests.test_flash_signature:window_as_w_w",
        "--signature=flash-attn",
        "--declare=grad=false",
        "-k",
        "window_square",
        "-p",
        "no:cacheprovider",
        "-q",
    )
    out = result.stdout.str()
    assert result.ret == 1, out
    assert "WINDOW-01" in out and "window (2, 0)" in out and "DOES NOT CONFORM" in out, out


@pytest.mark.usefixtures("restore_hypothesis_profile")
def test_signature_without_impl_is_a_usage_error(pytester):
    result = pytester.runpytest_inprocess(VARIANT_CLAUSES, "--signature=flash-attn", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any("--signature needs --impl" in ln for ln in result.errlines), result.errlines


@pytest.mark.usefixtures("restore_hypothesis_profile")
def test_command_line_certifies_the_kvcache_reference(pytester):
    kv = str(Path(VARIANT_CLAUSES).with_name("test_kvcache.py"))
    result = pytester.runpytest_inprocess(
        kv,
        "--impl=implementations.numpy_flash:flash_attn_with_kvcache",
        "--signature=flash-attn-kvcache",
        "--allow-partial",
        "-p",
        "no:cacheprovider",
        "-q",
    )
    out = result.stdout.str()
    assert result.ret == 0 and "16 passed" in out, out

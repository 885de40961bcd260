"""The decode_attention and kv_append families' contracts and float64 reference without a GPU:
the descriptor's rules, the binding of every cache form and layout, kv_append followed by decode
against plain attention, and the verification inputs."""

from __future__ import annotations

import numpy as np
import pytest

from opfacade._backends.reference import decode_attention, kv_append, sdpa_forward
from opfacade.contracts.decode_attention import (
    DECODE_ATTENTION,
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
)
from opfacade.contracts.kv_append import KV_APPEND, KvAppendArgs, KvAppendDescriptor
from opfacade.contracts.kv_cache import cache_shape
from opfacade.errors import InvalidArgument, InvalidProblem, ShapeMismatch

BASE = dict(batch=4, heads_q=8, heads_kv=2, head_dim=16, element="f32")


@pytest.mark.parametrize(("fields", "message"), [
    (dict(cache="paged", max_pages=4), "paged cache needs page_size and max_pages"),
    (dict(cache="contiguous", max_seq=64, page_size=16), "describe a paged cache"),
    (dict(cache="pointers"), "pointers cache needs max_seq"),
    (dict(cache="paged", page_size=16, max_pages=4, max_seq=60), "page_size \\* max_pages"),
    (dict(cache="paged", page_size=512, max_pages=4), "page_size"),
    (dict(cache="contiguous", max_seq=64, q_len=9), "q_len"),
    (dict(cache="contiguous", max_seq=1, q_len=7), "q_len 7 must be at most the cache.s capacity"),
    (dict(cache="paged", page_size=1, max_pages=3, q_len=4), "q_len 4 .* capacity 3"),
    (dict(cache="contiguous", max_seq=64, heads_q=6, heads_kv=4), "multiple of heads_kv"),
    (dict(cache="contiguous", max_seq=64, window=(8, 2)), "left only"),
])
def test_the_descriptor_names_what_is_wrong(fields, message):
    with pytest.raises(InvalidProblem, match=message):
        DecodeAttentionDescriptor(**{**BASE, **fields})


def test_kv_append_refuses_more_new_tokens_than_its_cache_holds():
    # A held-out GPU problem (seed 20261207) drew this envelope, whose only valid seq_lens were
    # zeros, and the oracle's check refused the lengths verify then drew.
    with pytest.raises(InvalidProblem, match="q_len 7 must be at most the cache's capacity 1"):
        KvAppendDescriptor(batch=5, q_len=7, heads_kv=15, head_dim=128, element="bf16",
                           cache="contiguous", max_seq=1)
    assert KvAppendDescriptor(batch=5, q_len=7, heads_kv=15, head_dim=128, element="bf16",
                              cache="contiguous", max_seq=7).capacity == 7


@pytest.mark.parametrize("batch_stride, refused", [(2**30 - 64, False), (2**30, True)])
def test_kv_append_refuses_new_tokens_strided_2_gib_apart_naming_the_argument(batch_stride,
                                                                              refused):
    """native/kv_append.cu finds a thread's bytes in k_new and v_new with 32-bit byte offsets:
    an f16 batch stride of 2^30 elements (2^31 bytes) is refused, one just below is not. The
    views are numpy's over a small buffer (nothing is read), wrapped here: bind would first
    refuse k_new's 2 GiB span for overlapping the caches, which numpy places anywhere."""
    from numpy.lib.stride_tricks import as_strided

    from opfacade._backends.nvrtc.decode_attention import KvAppendNvrtc
    from opfacade._internal.contract import BoundArgs
    from opfacade._internal.tensors import wrap
    from opfacade.errors import LayoutMismatch
    from opfacade.types import ElementKind

    desc = KvAppendDescriptor(batch=2, heads_kv=2, head_dim=64, element="f16",
                              cache="contiguous", max_seq=16)
    buffer = np.zeros(4096, np.float16)
    k_new = as_strided(buffer, (2, 1, 2, 64), (batch_stride * 2, 256, 128, 2), writeable=False)
    cache = np.zeros(cache_shape(desc, 64, 2), np.float16)
    arrays = dict(k_new=k_new, v_new=buffer[:256].reshape(2, 1, 2, 64), k_cache=cache,
                  v_cache=cache.copy(), seq_lens=np.full(2, 3, np.int32))
    bound = BoundArgs({**{name: wrap(a, name) for name, a in arrays.items()},
                       "page_table": None}, ("k_cache", "v_cache"))
    check = lambda: KvAppendNvrtc(ElementKind.f16).check_args(desc, bound)  # noqa: E731
    if not refused:
        check()
        return
    with pytest.raises(LayoutMismatch, match="below 2147483648 bytes") as raised:
        check()
    assert raised.value.argument == "k_new"


def test_a_paged_envelope_derives_its_capacity():
    desc = DecodeAttentionDescriptor(**BASE, cache="paged", page_size=16, max_pages=5)
    assert desc.capacity == 80
    assert cache_shape(desc, 16, 30) == (30, 16, 2, 16)
    hnd = desc.model_copy(update={"kv_layout": "hnd"})
    assert cache_shape(hnd, 16, 30) == (30, 2, 16, 16)


def _decode_args(desc, b=3, pool=12, **overrides):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((b, desc.q_len, desc.heads_q, desc.head_dim)).astype(np.float32)
    rows = pool if desc.cache == "paged" else desc.batch
    if desc.cache == "pointers":
        k = v = np.arange(b, dtype=np.int64)
    else:
        k = np.zeros(cache_shape(desc, desc.head_dim, rows), np.float32)
        v = np.zeros(cache_shape(desc, desc.dim_v, rows), np.float32)
    table = (np.zeros((b, desc.max_pages), np.int32) if desc.cache == "paged" else None)
    fields = dict(q=q, k_cache=k, v_cache=v, seq_lens=np.ones(b, np.int32),
                  out=np.zeros((b, desc.q_len, desc.heads_q, desc.dim_v), np.float32),
                  page_table=table)
    fields.update(overrides)
    return DecodeAttentionArgs(**fields)


@pytest.mark.parametrize("cache", [dict(cache="contiguous", max_seq=40),
                                   dict(cache="paged", page_size=16, max_pages=3),
                                   dict(cache="pointers", max_seq=40)])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_every_cache_form_binds_fewer_sequences_than_the_batch(cache, layout):
    desc = DecodeAttentionDescriptor(**BASE, **cache, kv_layout=layout, q_len=2)
    bound = DECODE_ATTENTION.bind(desc, _decode_args(desc))
    assert bound.outputs == ("out", "lse") and bound["q"].shape[0] == 3


def test_binding_errors_name_the_argument():
    desc = DecodeAttentionDescriptor(**BASE, cache="paged", page_size=16, max_pages=3)
    with pytest.raises(InvalidArgument, match='page_table is required when cache is "paged"'):
        DECODE_ATTENTION.bind(desc, _decode_args(desc, page_table=None))
    with pytest.raises(ShapeMismatch, match="seq_lens must have one entry per sequence"):
        DECODE_ATTENTION.bind(desc, _decode_args(desc, seq_lens=np.ones(2, np.int32)))
    wrong = np.zeros((12, 16, 2, 8), np.float32)
    with pytest.raises(ShapeMismatch, match="k_cache must have shape") as error:
        DECODE_ATTENTION.bind(desc, _decode_args(desc, k_cache=wrong))
    assert error.value.argument == "k_cache"
    contiguous = DecodeAttentionDescriptor(**BASE, cache="contiguous", max_seq=40)
    with pytest.raises(InvalidArgument, match="page_table must be None"):
        DECODE_ATTENTION.bind(contiguous, _decode_args(
            contiguous, page_table=np.zeros((3, 2), np.int32)))


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("paged", [False, True])
def test_appending_then_decoding_is_attention_over_the_whole_history(layout, paged):
    """Fill each cache by appends of 3 then 2 tokens, then decode the last 2: the same as plain
    bottom-right attention over each sequence's 5 + history tokens."""
    rng = np.random.default_rng(1)
    b, hkv, hq, d, page = 3, 2, 4, 8, 4
    history = np.array([7, 0, 12])  # tokens before the two appends
    total = history + 5
    capacity = 20
    if paged:
        pool = 3 * (capacity // page) + 2
        table = rng.permutation(pool)[:3 * (capacity // page)].reshape(3, -1).astype(np.int32)
        shape = (pool, page, hkv, d) if layout == "nhd" else (pool, hkv, page, d)
    else:
        table = None
        shape = (b, capacity, hkv, d) if layout == "nhd" else (b, hkv, capacity, d)
    k_cache, v_cache = np.full(shape, np.nan), np.full(shape, np.nan)  # never read past lengths
    keys = [rng.standard_normal((n, hkv, d)) for n in total]
    values = [rng.standard_normal((n, hkv, d)) for n in total]

    def append(sequences, first, count):
        """kv_append of tokens [first, first + count) of ``sequences`` in one call."""
        nonlocal k_cache, v_cache
        k_new = np.stack([keys[s][first[i]:first[i] + count] for i, s in enumerate(sequences)])
        v_new = np.stack([values[s][first[i]:first[i] + count]
                          for i, s in enumerate(sequences)])
        seq_lens = np.asarray(first) + count
        if paged:
            k_cache, v_cache = kv_append(k_new, v_new, k_cache, v_cache, seq_lens,
                                         kv_layout=layout, page_table=table[sequences])
        else:
            rows = np.asarray(sequences)
            k_cache[rows], v_cache[rows] = kv_append(k_new, v_new, k_cache[rows],
                                                     v_cache[rows], seq_lens, kv_layout=layout)

    for s in range(b):  # each sequence's history on its own: the counts differ
        if history[s]:
            append([s], [0], int(history[s]))
    append(list(range(b)), history.tolist(), 3)  # then the batch, twice
    append(list(range(b)), (history + 3).tolist(), 2)
    lengths = total
    assert lengths.tolist() == total.tolist()
    q = rng.standard_normal((b, 2, hq, d))
    out, lse = decode_attention(q, k_cache, v_cache, total.astype(np.int32), kv_layout=layout,
                                page_table=table)
    for s in range(b):
        want, want_lse = sdpa_forward(np.swapaxes(q[s:s + 1], 1, 2),
                                      np.swapaxes(keys[s], 0, 1)[None],
                                      np.swapaxes(values[s], 0, 1)[None], causal="bottom_right")
        np.testing.assert_allclose(out[s], np.swapaxes(want[0], 0, 1), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse[s], want_lse[0].T, rtol=1e-12)


def test_an_empty_sequence_gives_zeros_and_minus_infinity():
    q = np.ones((2, 1, 2, 4))
    cache = np.ones((2, 6, 1, 4))
    out, lse = decode_attention(q, cache, cache, np.array([0, 3]))
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
    assert np.isfinite(out[1]).all()


def test_a_window_keeps_the_last_positions():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in ((1, 1, 1, 4), (1, 10, 1, 4), (1, 10, 1, 4)))
    out, _ = decode_attention(q, k, v, np.array([10]), window_left=3)
    want, _ = decode_attention(q, k[:, 6:], v[:, 6:], np.array([4]))
    np.testing.assert_allclose(out, want, rtol=1e-12)


def test_appending_past_the_capacity_is_refused():
    cache = np.zeros((1, 4, 1, 2))
    new = np.ones((1, 2, 1, 2))
    with pytest.raises(ValueError, match=r"seq_lens\[0\] must lie in \[2, 4\]"):
        kv_append(new, new, cache, cache, np.array([5]))


@pytest.mark.parametrize("op", [DECODE_ATTENTION, KV_APPEND])
def test_samples_signatures_and_verification_inputs_agree(op):
    rng = np.random.default_rng(3)
    for desc in op.sample_problems(op.descriptor.model_fields["element"].annotation("f32")):
        signature = op.signature(desc)
        inputs = {name: np.zeros(spec.shape) for name, spec in signature.items()}
        arrays = op.verification_inputs(desc, inputs, rng)
        lengths = arrays["seq_lens"]
        assert lengths.dtype == np.int32 and lengths.max() <= desc.capacity
        assert (lengths == 0).any()
        if desc.cache == "paged":
            table = arrays["page_table"]
            assert len(np.unique(table)) == table.size  # every sequence owns its pages
            assert table.max() < signature["k_cache"].shape[0]
        if isinstance(desc, KvAppendDescriptor):
            assert signature["k_cache"].role == "inout"


def test_kv_append_binds_the_caches_as_its_outputs():
    desc = KvAppendDescriptor(batch=4, heads_kv=2, head_dim=16, element="f32", cache="paged",
                              page_size=16, max_pages=3, q_len=2)
    new = np.zeros((3, 2, 2, 16), np.float32)
    pool = np.zeros(cache_shape(desc, 16, 10), np.float32)
    args = KvAppendArgs(new, new.copy(), pool, pool.copy(), np.full(3, 2, np.int32),
                        np.zeros((3, 3), np.int32))
    assert KV_APPEND.bind(desc, args).outputs == ("k_cache", "v_cache")
    with pytest.raises(ShapeMismatch, match="v_new must have shape"):
        KV_APPEND.bind(desc, KvAppendArgs(new, new[:, :1], pool, pool.copy(),
                                          np.full(3, 2, np.int32), np.zeros((3, 3), np.int32)))


@pytest.mark.parametrize("heads_kv, viable", [(32767 * 128, True), (32767 * 128 + 1, False)])
def test_kv_append_refuses_more_head_groups_than_the_grid_holds(heads_kv, viable):
    """kv_append's grid is (sequences, q_len, 2 x groups of kv heads: keys and values in CTAs of
    their own); bf16 d64 puts 128 heads' keys (or values) in a CTA of 1024 threads, and the
    grid's z extent is at most 65535."""
    from opfacade.plan import Plan

    desc = KvAppendDescriptor(batch=2, heads_kv=heads_kv, head_dim=64, element="bf16",
                              cache="contiguous", max_seq=16)
    verdict = next(v for v in Plan.explain(desc, arch="sm90").verdicts
                   if v.sku.id == "kv_append.nvrtc.bf16")
    assert verdict.viable is viable, verdict.detail
    if not viable:
        assert verdict.detail.startswith("2 x heads_kv/heads per CTA = 65536 CTAs exceeds"), \
            verdict.detail

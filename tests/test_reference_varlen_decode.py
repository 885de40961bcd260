"""The float64 varlen and decode oracles against loops, dense SDPA and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numeric import numeric_grad

from opfacade._backends.reference import (
    decode_forward,
    gather_kv,
    sdpa_forward,
    varlen_backward,
    varlen_forward,
)

D, DV = 3, 2

# (query lengths, key lengths, Hq, Hkv): includes an empty query sequence and a query sequence
# without keys.
VARLEN_CASES = {
    "equal": ((3, 2), (3, 2), 2, 2),
    "ragged_gqa": ((2, 4, 1), (5, 3, 2), 4, 2),
    "empty_query": ((0, 3), (2, 4), 2, 1),
    "empty_keys": ((2, 3), (0, 4), 2, 2),
}
CAUSAL = [None, "top_left", "bottom_right"]


def offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def make_packed(case, seed: int):
    lens_q, lens_kv, hq, hkv = case
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(lens_q), hq, D))
    k = rng.standard_normal((sum(lens_kv), hkv, D))
    v = rng.standard_normal((sum(lens_kv), hkv, DV))
    return q, k, v, offsets(lens_q), offsets(lens_kv)


def loop_varlen(q, k, v, cu_q, cu_kv, causal):
    """Packed attention token by token, positions counted inside each sequence."""
    heads, heads_kv = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], heads, v.shape[2]))
    lse = np.full(q.shape[:2], -np.inf)
    for b in range(len(cu_q) - 1):
        len_q, len_kv = cu_q[b + 1] - cu_q[b], cu_kv[b + 1] - cu_kv[b]
        offset = len_kv - len_q if causal == "bottom_right" else 0
        for i in range(len_q):
            row = cu_q[b] + i
            keys = [j for j in range(len_kv) if causal is None or j <= i + offset]
            for h in range(heads):
                g = h // (heads // heads_kv)
                scores = [
                    sum(q[row, h, t] * k[cu_kv[b] + j, g, t] for t in range(D)) / math.sqrt(D)
                    for j in keys
                ]
                if not scores:
                    continue
                top = max(scores)
                total = sum(math.exp(s - top) for s in scores)
                lse[row, h] = top + math.log(total)
                for j, s in zip(keys, scores, strict=True):
                    out[row, h] += math.exp(s - top) / total * v[cu_kv[b] + j, g]
    return out, lse


def pad(x: np.ndarray, cu: np.ndarray, length: int) -> np.ndarray:
    """Packed [T, H, D] -> padded dense [B, H, length, D], padding filled with noise."""
    dense = np.random.default_rng(99).standard_normal((len(cu) - 1, x.shape[1], length, x.shape[2]))
    for b in range(len(cu) - 1):
        dense[b, :, : cu[b + 1] - cu[b]] = x[cu[b] : cu[b + 1]].transpose(1, 0, 2)
    return dense


def assert_lse_equal(lse: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(lse[finite], want[finite], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("name", list(VARLEN_CASES))
def test_varlen_forward_matches_per_sequence_loops(name, causal):
    q, k, v, cu_q, cu_kv = make_packed(VARLEN_CASES[name], seed=len(name))
    out, lse = varlen_forward(q, k, v, cu_q, cu_kv, causal=causal)
    want_out, want_lse = loop_varlen(q, k, v, cu_q, cu_kv, causal)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    assert_lse_equal(lse, want_lse)


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("name", list(VARLEN_CASES))
def test_varlen_forward_matches_dense_padded_sdpa(name, causal):
    q, k, v, cu_q, cu_kv = make_packed(VARLEN_CASES[name], seed=20 + len(name))
    lens_q, lens_kv = np.diff(cu_q), np.diff(cu_kv)
    sq, skv = int(lens_q.max()) + 1, int(lens_kv.max()) + 1
    dense_out, dense_lse = sdpa_forward(
        pad(q, cu_q, sq), pad(k, cu_kv, skv), pad(v, cu_kv, skv), causal=causal,
        seq_len_q=lens_q, seq_len_kv=lens_kv,
    )
    out, lse = varlen_forward(q, k, v, cu_q, cu_kv, causal=causal)
    for b, length in enumerate(lens_q):
        rows = slice(cu_q[b], cu_q[b + 1])
        np.testing.assert_allclose(out[rows], dense_out[b, :, :length].transpose(1, 0, 2),
                                   rtol=1e-12, atol=1e-12)
        assert_lse_equal(lse[rows], dense_lse[b, :, :length].T)
        assert np.all(dense_out[b, :, length:] == 0.0)
        assert np.all(np.isneginf(dense_lse[b, :, length:]))


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("name", ["ragged_gqa", "empty_keys"])
def test_varlen_backward_matches_finite_differences(name, causal):
    q, k, v, cu_q, cu_kv = make_packed(VARLEN_CASES[name], seed=40 + len(name))
    weights = np.random.default_rng(3).standard_normal(q.shape[:2] + (DV,))
    dq, dk, dv = varlen_backward(q, k, v, weights, cu_q, cu_kv, causal=causal)
    tensors = {"q": q, "k": k, "v": v}
    for key, analytic in (("q", dq), ("k", dk), ("v", dv)):
        def loss(bumped, key=key):
            inputs = {**tensors, key: bumped}
            out, _ = varlen_forward(inputs["q"], inputs["k"], inputs["v"], cu_q, cu_kv,
                                    causal=causal)
            return float(np.sum(out * weights))

        np.testing.assert_allclose(analytic, numeric_grad(loss, tensors[key]),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "cu_q, message",
    [
        (np.array([1, 3, 5]), "must start at 0"),
        (np.array([0, 4, 3]), "never decrease"),
        (np.array([0, 2, 6]), "end at most at 5"),
        (np.array([0.0, 2.0, 5.0]), "1-D int array"),
    ],
)
def test_varlen_rejects_bad_offsets(cu_q, message):
    q, k, v, _, cu_kv = make_packed(VARLEN_CASES["equal"], seed=1)
    with pytest.raises(ValueError, match=message):
        varlen_forward(q, k, v, cu_q, cu_kv)


# Decode: (seq_lens, T new tokens, Hq, Hkv, max_seq, page_size)
DECODE_CASES = {
    "one_token": ((5, 2, 7), 1, 2, 2, 8, 2),
    "two_tokens_gqa": ((4, 6), 2, 4, 2, 7, 3),
    "mqa_full_cache": ((6, 1), 1, 3, 1, 6, 4),
    "speculative": ((3, 5), 3, 2, 1, 6, 2),
}


def make_cache(case, seed: int):
    seq_lens, tokens, hq, hkv, max_seq, _ = case
    rng = np.random.default_rng(seed)
    batch = len(seq_lens)
    q = rng.standard_normal((batch, hq, tokens, D))
    k_cache = rng.standard_normal((batch, hkv, max_seq, D))
    v_cache = rng.standard_normal((batch, hkv, max_seq, DV))
    return q, k_cache, v_cache, np.array(seq_lens)


def page(cache: np.ndarray, page_size: int, rng: np.random.Generator):
    """The same logical cache split into pages stored in a random order, with spare pages."""
    batch, heads, max_seq, dim = cache.shape
    per_seq = -(-max_seq // page_size)
    num_pages = batch * per_seq + 3
    order = rng.permutation(num_pages)[: batch * per_seq]
    table = order.reshape(batch, per_seq)
    pages = rng.standard_normal((num_pages, heads, page_size, dim))
    for b, p, slot in np.ndindex(batch, per_seq, page_size):
        if p * page_size + slot < max_seq:
            pages[table[b, p], :, slot] = cache[b, :, p * page_size + slot]
    return pages, table


def loop_decode(q, k_cache, v_cache, seq_lens):
    """Each new token over the cache positions up to its own, from the contiguous cache."""
    batch, heads, tokens, _ = q.shape
    group = heads // k_cache.shape[1]
    out = np.zeros((batch, heads, tokens, v_cache.shape[3]))
    lse = np.full((batch, heads, tokens), -np.inf)
    for b, h, t in np.ndindex(batch, heads, tokens):
        position = seq_lens[b] - tokens + t
        scores = [
            sum(q[b, h, t, d] * k_cache[b, h // group, j, d] for d in range(D)) / math.sqrt(D)
            for j in range(position + 1)
        ]
        if not scores:
            continue
        top = max(scores)
        total = sum(math.exp(s - top) for s in scores)
        lse[b, h, t] = top + math.log(total)
        for j, s in enumerate(scores):
            out[b, h, t] += math.exp(s - top) / total * v_cache[b, h // group, j]
    return out, lse


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_matches_loops(name):
    q, k_cache, v_cache, seq_lens = make_cache(DECODE_CASES[name], seed=len(name))
    out, lse = decode_forward(q, k_cache, v_cache, seq_lens)
    want_out, want_lse = loop_decode(q, k_cache, v_cache, seq_lens)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_paged_decode_matches_contiguous(name):
    case = DECODE_CASES[name]
    q, k_cache, v_cache, seq_lens = make_cache(case, seed=50 + len(name))
    rng = np.random.default_rng(7)
    k_pages, table = page(k_cache, case[-1], rng)
    v_pages, _ = page(v_cache, case[-1], np.random.default_rng(7))
    out, lse = decode_forward(q, k_cache, v_cache, seq_lens)
    paged_out, paged_lse = decode_forward(q, k_pages, v_pages, seq_lens, page_table=table)
    np.testing.assert_allclose(paged_out, out, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(paged_lse, lse, rtol=1e-14, atol=1e-14)
    keys, values = gather_kv(k_pages, v_pages, seq_lens, page_table=table)
    for b, length in enumerate(seq_lens):
        np.testing.assert_array_equal(keys[b], k_cache[b, :, :length])
        np.testing.assert_array_equal(values[b], v_cache[b, :, :length])


def test_decode_with_empty_sequence_gives_zero_and_minus_infinity():
    q, k_cache, v_cache, _ = make_cache(DECODE_CASES["one_token"], seed=3)
    seq_lens = np.array([0, 2, 7])
    out, lse = decode_forward(q, k_cache, v_cache, seq_lens)
    assert np.all(out[0] == 0.0) and np.all(np.isneginf(lse[0]))
    assert np.isfinite(out).all() and np.isfinite(lse[1:]).all()


def test_decode_rejects_out_of_range_pages_and_lengths():
    q, k_cache, v_cache, seq_lens = make_cache(DECODE_CASES["one_token"], seed=3)
    with pytest.raises(ValueError, match="seq_lens must lie in"):
        decode_forward(q, k_cache, v_cache, np.array([5, 2, 9]))
    k_pages, table = page(k_cache, 2, np.random.default_rng(0))
    table[1, 0] = k_pages.shape[0]
    with pytest.raises(ValueError, match=r"page_table\[1\] must name pages"):
        decode_forward(q, k_pages, k_pages[..., :DV], seq_lens, page_table=table)

"""Incremental (decode) attention in float64 against a contiguous or paged KV cache.

``seq_lens[b]`` counts sequence ``b``'s cached tokens, the T new ones included, so new query
token ``t`` sits at absolute position ``seq_lens[b] - T + t`` and attends to positions 0 up to
and including its own: bottom-right causal attention of T queries over ``seq_lens[b]`` keys.
A query whose position would be negative (``seq_lens[b] < T``) sees no key: out 0, lse -inf.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .sdpa import sdpa_forward

__all__ = ["decode_attention", "decode_forward", "gather_kv", "kv_append"]


def _check_lengths(seq_lens: np.ndarray, batch: int, capacity: int) -> np.ndarray:
    lengths = np.asarray(seq_lens)
    if lengths.shape != (batch,) or not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(
            f"seq_lens must be an int array of shape ({batch},), got {lengths.dtype} "
            f"{lengths.shape}"
        )
    if lengths.min(initial=0) < 0 or lengths.max(initial=0) > capacity:
        raise ValueError(f"seq_lens must lie in [0, {capacity}], got {lengths.tolist()}")
    return lengths.astype(np.int64)


def _gather_paged(k_cache, v_cache, seq_lens, page_table):
    page_table = np.asarray(page_table)
    if page_table.ndim != 2 or not np.issubdtype(page_table.dtype, np.integer):
        raise ValueError(
            f"page_table must be a 2-D int array [B, max_pages], got {page_table.dtype} "
            f"{page_table.shape}"
        )
    num_pages, _, page_size, _ = k_cache.shape
    batch, max_pages = page_table.shape
    lengths = _check_lengths(seq_lens, batch, max_pages * page_size)
    keys, values = [], []
    for b, length in enumerate(lengths):
        positions = np.arange(length)
        pages = page_table[b, positions // page_size]
        if np.any((pages < 0) | (pages >= num_pages)):
            raise ValueError(
                f"page_table[{b}] must name pages in [0, {num_pages}) for its "
                f"{length} tokens, got {pages.tolist()}"
            )
        slots = positions % page_size
        # Advanced indices on axes 0 and 2 move the token axis first: [L, Hkv, D].
        keys.append(k_cache[pages, :, slots].transpose(1, 0, 2))
        values.append(v_cache[pages, :, slots].transpose(1, 0, 2))
    return keys, values


def gather_kv(
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    seq_lens: np.ndarray,
    page_table: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each sequence's cached keys and values, in logical order and contiguous.

    Args:
        k_cache: [B, Hkv, max_seq, D] contiguous, or [num_pages, Hkv, page_size, D] paged.
        v_cache: like k_cache with Dv as the last dimension.
        seq_lens: [B] number of cached tokens per sequence.
        page_table: [B, max_pages] page ids; position p of sequence b lives in page
            ``page_table[b, p // page_size]`` at slot ``p % page_size``. None for a contiguous
            cache.

    Returns:
        ``(keys, values)``: two lists of B float64 arrays, [Hkv, seq_lens[b], D] and
        [Hkv, seq_lens[b], Dv].
    """
    k_cache = np.asarray(k_cache, dtype=np.float64)
    v_cache = np.asarray(v_cache, dtype=np.float64)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.ndim != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {x.shape}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(
            f"v_cache must have shape {k_cache.shape[:3]} + (Dv,) to match k_cache, "
            f"got {v_cache.shape}"
        )
    if page_table is not None:
        return _gather_paged(k_cache, v_cache, seq_lens, page_table)
    lengths = _check_lengths(seq_lens, k_cache.shape[0], k_cache.shape[2])
    keys = [k_cache[b, :, :length] for b, length in enumerate(lengths)]
    values = [v_cache[b, :, :length] for b, length in enumerate(lengths)]
    return keys, values


def decode_forward(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    seq_lens: np.ndarray,
    *,
    page_table: np.ndarray | None = None,
    scale: float | None = None,
    window_left: int | None = None,
    forward: Callable = sdpa_forward,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention of T new tokens per sequence over its KV cache (see the module docstring).

    Args:
        q: [B, Hq, T, D] new query tokens; Hq must be a multiple of the cache's Hkv.
        k_cache, v_cache, seq_lens, page_table: as ``gather_kv``.
        scale: score scale, default ``1 / sqrt(D)``.
        window_left: keep only keys at most this many positions before each query's own.
        forward: ``sdpa_forward``, or its magnitude twin ``sdpa_forward_magnitude``.

    Returns:
        ``(out, lse)``: out [B, Hq, T, Dv] and lse [B, Hq, T], float64.
    """
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 4:
        raise ValueError(f"q must have 4 dimensions [B, Hq, T, D], got shape {q.shape}")
    keys, values = gather_kv(k_cache, v_cache, seq_lens, page_table)
    if len(keys) != q.shape[0]:
        raise ValueError(f"q must have B={len(keys)} sequences to match seq_lens, got {q.shape[0]}")
    outs, lses = [], []
    for b, (key, value) in enumerate(zip(keys, values, strict=True)):
        window = None if window_left is None else (window_left, None)
        out, lse = forward(
            q[b : b + 1], key[None], value[None], scale=scale, causal="bottom_right",
            window=window,
        )
        outs.append(out)
        lses.append(lse)
    dv = np.asarray(v_cache).shape[3]
    if not outs:
        return np.zeros(q.shape[:3] + (dv,)), np.zeros(q.shape[:3])
    return np.concatenate(outs), np.concatenate(lses)


# -- the decode_attention family's layouts (contracts/decode_attention.py) ---------------------


def _heads_major(cache: np.ndarray, kv_layout: str) -> np.ndarray:
    """[rows, tokens, Hkv, D] ("nhd") or [rows, Hkv, tokens, D] ("hnd") as the latter."""
    if kv_layout not in ("nhd", "hnd"):
        raise ValueError(f"kv_layout must be 'nhd' or 'hnd', got {kv_layout!r}")
    cache = np.asarray(cache)
    return cache if kv_layout == "hnd" else np.swapaxes(cache, 1, 2)


def decode_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    seq_lens: np.ndarray,
    *,
    kv_layout: str = "nhd",
    page_table: np.ndarray | None = None,
    scale: float | None = None,
    window_left: int | None = None,
    forward: Callable = sdpa_forward,
) -> tuple[np.ndarray, np.ndarray]:
    """``decode_forward`` in the family's layouts: q [b, T, Hq, D]; a contiguous cache of at
    least b sequences or a page pool, token-major ("nhd") or heads-major ("hnd"). Returns out
    [b, T, Hq, Dv] and lse [b, T, Hq], float64."""
    q = np.asarray(q)
    if q.ndim != 4:
        raise ValueError(f"q must have 4 dimensions [b, T, Hq, D], got shape {q.shape}")
    keys, values = _heads_major(k_cache, kv_layout), _heads_major(v_cache, kv_layout)
    if page_table is None:  # contiguous: the first b rows are the call's sequences
        keys, values = keys[: q.shape[0]], values[: q.shape[0]]
    out, lse = decode_forward(np.swapaxes(q, 1, 2), keys, values, seq_lens,
                              page_table=page_table, scale=scale, window_left=window_left,
                              forward=forward)
    return np.swapaxes(out, 1, 2), np.swapaxes(lse, 1, 2)


def kv_append(
    k_new: np.ndarray,
    v_new: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    seq_lens: np.ndarray,
    *,
    kv_layout: str = "nhd",
    page_table: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the caches with new token t of sequence s written at position
    ``seq_lens[s] - T + t`` (k_new, v_new [b, T, Hkv, D]); the rest of each cache unchanged. A
    sequence of length 0 is an empty slot of the batch: nothing of it is written.

    Raises:
        ValueError: a sequence holds fewer than T tokens (but some) or more than its capacity,
            or a page table entry it uses is outside the pool.
    """
    k_new, v_new = np.asarray(k_new), np.asarray(v_new)
    k_out, v_out = np.array(k_cache, copy=True), np.array(v_cache, copy=True)
    sequences, new = k_new.shape[:2]
    token_axis = 1 if kv_layout == "nhd" else 2
    tokens = k_out.shape[token_axis]
    capacity = tokens * (np.asarray(page_table).shape[1] if page_table is not None else 1)
    lengths = np.asarray(seq_lens, dtype=np.int64)
    for s in range(sequences):
        if lengths[s] == 0:
            continue
        if not new <= lengths[s] <= capacity:
            raise ValueError(f"seq_lens[{s}] must lie in [{new}, {capacity}] to append {new} "
                             f"tokens, got {lengths[s]}")
        for t in range(new):
            position = lengths[s] - new + t
            row, slot = s, position
            if page_table is not None:
                row, slot = int(page_table[s, position // tokens]), position % tokens
                if not 0 <= row < k_out.shape[0]:
                    raise ValueError(f"page_table[{s}, {position // tokens}] = {row} is outside "
                                     f"the pool of {k_out.shape[0]} pages")
            for cache, values in ((k_out, k_new), (v_out, v_new)):
                if kv_layout == "nhd":
                    cache[row, slot] = values[s, t]
                else:
                    cache[row, :, slot] = values[s, t]
    return k_out, v_out

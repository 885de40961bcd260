"""The kv_append SKUs on a GPU: appending a history token by token (and a speculative step of
several tokens) then decoding equals attention over the whole history, in every element type,
cache form and layout; k_new and v_new may be slices of a fused QKV projection; positions past
a sequence's capacity are skipped unchecked and named in checked mode; nothing outside the new
tokens' slots changes."""

from __future__ import annotations

import numpy as np
import pytest
from test_decode_attention_gpu import (
    DTYPES,
    Cache,
    _descriptor,
    captured_step,
    make_problem,
    write_late,
)

from opfacade import KvAppendArgs, KvAppendDescriptor, KvAppendPlan
from opfacade.errors import InvalidArgument, LayoutMismatch

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

# Every cache form in both layouts: kv_append has a kernel for each (native/kv_append.cu).
# Pages of 24 tokens take kv_cache.cuh's division (not a power of two, and straddling decode's
# chunks); 256 is the largest page the contract allows. Pages of 16, 32 and 64 run kv_append's
# kernels with the page size compiled in (kv_cache.APPEND_PAGE_SIZES), in both layouts here.
CACHES = [Cache("contiguous"), Cache("contiguous", "hnd"), Cache("paged", "nhd", 16),
          Cache("paged", "hnd", 16), Cache("paged", "nhd", 32), Cache("paged", "hnd", 32),
          Cache("paged", "nhd", 64), Cache("paged", "hnd", 64), Cache("paged", "hnd", 24),
          Cache("paged", "nhd", 256), Cache("pointers"), Cache("pointers", "hnd")]


def _append_descriptor(decode, q_len: int) -> KvAppendDescriptor:
    fields = decode.model_dump(include={"batch", "heads_kv", "head_dim", "element", "cache",
                                        "kv_layout", "max_seq", "page_size", "max_pages",
                                        "checked"})
    return KvAppendDescriptor(**fields, q_len=q_len)


def _fused_qkv(b: int, q_len: int, heads_q: int, heads_kv: int, d: int, dtype, seed: int):
    """k_new and v_new as slices of one [b, q_len, Hq + 2 Hkv, d] projection (strided views)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.rand((b, q_len, heads_q + 2 * heads_kv, d), generator=generator,
                     device="cuda").to(dtype) * 2 - 1
    return qkv[:, :, heads_q:heads_q + heads_kv], qkv[:, :, heads_q + heads_kv:]


@pytest.mark.parametrize("element", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("cache", CACHES, ids=[c.id for c in CACHES])
def test_appending_then_decoding_is_attention_over_the_history(element, cache):
    """Start from a history, append 3 steps of one token and one of 4, then compare the cache
    (bitwise, in the sequences' slots) and the decode step with the float64 reference."""
    from opfacade import DecodeAttentionPlan

    capacity, lengths = 300, np.array([0, 5, 150, 290])
    decode = _descriptor(cache, element, capacity, 4, q_len=4)
    problem = make_problem(decode, lengths, seed=20)
    keys, values = problem.keys.copy(), problem.values.copy()
    dtype = DTYPES[element]
    for step, q_len in enumerate((1, 1, 1, 4)):
        lengths = lengths + q_len
        problem.seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        k_new, v_new = _fused_qkv(4, q_len, decode.heads_q, decode.heads_kv, decode.head_dim,
                                  dtype, seed=step)
        assert not k_new.is_contiguous()
        plan = KvAppendPlan.select(_append_descriptor(decode, q_len), device=0)
        plan.run(KvAppendArgs(k_new, v_new, problem.k_cache, problem.v_cache, problem.seq_lens,
                              problem.page_table))
        for s, length in enumerate(lengths):
            rows = slice(length - q_len, length)
            keys[s, :, rows] = k_new[s].double().cpu().numpy().transpose(1, 0, 2)
            values[s, :, rows] = v_new[s].double().cpu().numpy().transpose(1, 0, 2)
    problem.keys, problem.values, problem.lengths = keys, values, lengths
    args = problem.args()
    decoder = DecodeAttentionPlan.select(decode, device=0)
    decoder.run(args)
    out, lse = problem.expected()
    got = args.out.double().cpu().numpy()
    # The appended tokens are the caller's bits, so the only error left is the decode's.
    from opfacade._backends.reference.sdpa import sdpa_forward_magnitude
    from opfacade.testing import relative_error

    magnitude, _ = problem.expected(forward=sdpa_forward_magnitude)
    assert relative_error(got, out, magnitude) <= decoder.precision_guarantee.max_rel_error
    assert np.allclose(args.lse.double().cpu().numpy(), lse, rtol=1e-5, atol=1e-5)


def test_only_the_new_tokens_slots_change_and_overflow_is_skipped():
    decode = _descriptor(Cache("paged", "nhd", 16), "bf16", 64, 3)
    problem = make_problem(decode, [10, 64, 0], seed=21)
    before_k, before_v = problem.k_cache.clone(), problem.v_cache.clone()
    # Sequence 1 is full: a token at position 64 is past its capacity and is skipped; sequence 2
    # gets its first token.
    problem.seq_lens.copy_(torch.tensor([11, 65, 1], dtype=torch.int32))
    k_new, v_new = _fused_qkv(3, 1, decode.heads_q, decode.heads_kv, decode.head_dim,
                              torch.bfloat16, seed=3)
    plan = KvAppendPlan.select(_append_descriptor(decode, 1), device=0)
    plan.run(KvAppendArgs(k_new, v_new, problem.k_cache, problem.v_cache, problem.seq_lens,
                          problem.page_table))
    changed = (problem.k_cache.view(torch.int16) != before_k.view(torch.int16)).any(-1).any(-1)
    table = problem.page_table.cpu().numpy()
    expected = torch.zeros_like(changed)
    expected[int(table[0, 0]), 10] = True
    expected[int(table[2, 0]), 0] = True
    assert torch.equal(changed, expected)
    assert torch.equal(problem.k_cache[int(table[0, 0]), 10], k_new[0, 0])
    assert torch.equal(problem.v_cache[int(table[2, 0]), 0], v_new[2, 0])
    changed_v = (problem.v_cache.view(torch.int16) != before_v.view(torch.int16)).any(-1)
    assert torch.equal(changed_v.any(-1), expected)
    checked = _append_descriptor(decode.model_copy(update={"checked": True}), 1)
    with pytest.raises(InvalidArgument, match=r"seq_lens\[1\] = 65") as raised:
        KvAppendPlan.select(checked, device=0).run(KvAppendArgs(
            k_new, v_new, problem.k_cache, problem.v_cache, problem.seq_lens,
            problem.page_table))
    assert raised.value.argument == "seq_lens"


def test_one_captured_append_replays_for_new_positions():
    decode = _descriptor(Cache("contiguous"), "f16", 128, 4)
    problem = make_problem(decode, [1, 1, 1, 1], seed=22)
    plan = KvAppendPlan.select(_append_descriptor(decode, 1), device=0)
    k_new, v_new = _fused_qkv(4, 1, decode.heads_q, decode.heads_kv, decode.head_dim,
                              torch.float16, seed=4)
    args = KvAppendArgs(k_new, v_new, problem.k_cache, problem.v_cache, problem.seq_lens)
    graph = captured_step(plan, args, None)
    for lengths in ([5, 9, 128, 2], [100, 1, 3, 64]):
        problem.seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        k_new.copy_(torch.rand_like(k_new))
        graph.replay()
        torch.cuda.synchronize()
        for s, length in enumerate(lengths):
            assert torch.equal(problem.k_cache[s, length - 1], k_new[s, 0])
            assert torch.equal(problem.v_cache[s, length - 1], v_new[s, 0])


def test_misaligned_token_views_are_refused_naming_the_argument():
    decode = _descriptor(Cache("contiguous"), "bf16", 64, 2)
    problem = make_problem(decode, [3, 4], seed=23)
    plan = KvAppendPlan.select(_append_descriptor(decode, 1), device=0)
    flat = torch.rand(2 * 1 * 2 * 64 + 1, device="cuda").to(torch.bfloat16)
    k_new = flat[1:].view(2, 1, 2, 64)
    with pytest.raises(LayoutMismatch, match="k_new") as raised:
        plan.run(KvAppendArgs(k_new, k_new.clone(), problem.k_cache, problem.v_cache,
                              problem.seq_lens))
    assert raised.value.argument == "k_new"


# Paged caches from pages of 256 tokens to pages of one (table rows of up to 1500 entries), at
# CTAs of 32 to 512 threads: (page_size, capacity, element, head_dim, heads_kv).
ROW_CASES = [
    (16, 300, "bf16", 64, 2),
    (24, 300, "f16", 64, 2),
    (256, 1024, "bf16", 128, 4),
    (1, 129, "bf16", 64, 2),
    (1, 1024, "f32", 128, 8),
    (1, 1500, "f32", 128, 8),
]


@pytest.mark.parametrize("page_size, capacity, element, head_dim, heads_kv", ROW_CASES,
                         ids=[f"p{c[0]}-cap{c[1]}-{c[2]}-d{c[3]}-h{c[4]}" for c in ROW_CASES])
def test_a_paged_append_writes_the_page_its_table_entry_names(page_size, capacity, element,
                                                                head_dim, heads_kv):
    """Each sequence's new token lands in the page and slot its table row names, bitwise; a
    sequence whose entry is outside the pool and an empty one are skipped, and nothing else in
    the pools changes."""
    batch, q_len, max_pages = 5, 1, -(-capacity // page_size)
    rng = np.random.default_rng(24)
    pages = batch * max_pages + 3
    table = rng.permutation(pages)[: batch * max_pages].reshape(batch, max_pages)
    lengths = np.array([1, capacity, 0, rng.integers(2, capacity), capacity // 2 + 1])
    bad_page = (lengths[4] - 1) // page_size
    table[4, bad_page] = pages + 7  # outside the pool: sequence 4's token is skipped
    dtype = DTYPES[element]
    shape = (pages, page_size, heads_kv, head_dim)
    k_cache = torch.rand(shape, device="cuda").to(dtype)
    v_cache = torch.rand(shape, device="cuda").to(dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k_new = torch.rand((batch, q_len, heads_kv, head_dim), device="cuda").to(dtype)
    v_new = torch.rand_like(k_new)
    desc = KvAppendDescriptor(batch=batch, heads_kv=heads_kv, head_dim=head_dim, element=element,
                              cache="paged", page_size=page_size, max_pages=max_pages,
                              q_len=q_len)
    plan = KvAppendPlan.select(desc, device=0)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    page_table = torch.tensor(table, dtype=torch.int32, device="cuda")
    plan.run(KvAppendArgs(k_new, v_new, k_cache, v_cache, seq_lens, page_table))
    for s in (0, 1, 3):  # sequence 2 is empty, sequence 4's page is outside the pool
        position = int(lengths[s]) - 1
        page, slot = int(table[s, position // page_size]), position % page_size
        before_k[page, slot], before_v[page, slot] = k_new[s, 0], v_new[s, 0]
    assert torch.equal(k_cache.view(torch.uint8), before_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), before_v.view(torch.uint8))


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_an_unusable_cache_address_skips_its_sequence_unchecked(layout):
    """A per-sequence cache address that is null or not 16-byte aligned makes its sequence
    empty: unchecked, kv_append writes neither that sequence's key nor its value (a store
    through the null one would fault at the synchronize), and the other sequences get their
    tokens. Checked mode names the first such address."""
    decode = _descriptor(Cache("pointers", layout), "f16", 64, 4)
    problem = make_problem(decode, [5, 6, 7, 8], seed=24)
    problem.k_cache[1] = 0  # null
    problem.v_cache[2] += 4  # no longer 16-byte aligned
    before = [(k.clone(), v.clone()) for k, v in problem.keep]
    problem.seq_lens.copy_(torch.tensor([6, 7, 8, 9], dtype=torch.int32))
    k_new, v_new = _fused_qkv(4, 1, decode.heads_q, decode.heads_kv, decode.head_dim,
                              torch.float16, seed=5)
    args = KvAppendArgs(k_new, v_new, problem.k_cache, problem.v_cache, problem.seq_lens)
    KvAppendPlan.select(_append_descriptor(decode, 1), device=0).run(args)
    torch.cuda.synchronize()

    def same_bits(a, b) -> bool:  # the caches hold NaN past each length
        return torch.equal(a.view(torch.int16), b.view(torch.int16))

    for s, ((k, v), (k0, v0)) in enumerate(zip(problem.keep, before, strict=True)):
        if s in (1, 2):
            assert same_bits(k, k0) and same_bits(v, v0), s
            continue
        token = (slice(None), s + 5) if layout == "hnd" else (s + 5,)
        assert torch.equal(k[token], k_new[s, 0]) and torch.equal(v[token], v_new[s, 0]), s
        k[token], v[token] = k0[token], v0[token]
        assert same_bits(k, k0) and same_bits(v, v0), s  # nothing else changed
    checked = _append_descriptor(decode.model_copy(update={"checked": True}), 1)
    with pytest.raises(InvalidArgument, match=r"k_cache\[1\]") as raised:
        KvAppendPlan.select(checked, device=0).run(args)
    assert raised.value.argument == "k_cache"


@pytest.mark.parametrize("writer_stream", ["same", "side"])
@pytest.mark.parametrize("cache", [Cache("paged", "nhd", 16), Cache("contiguous", "hnd")],
                         ids=lambda c: c.id)
def test_an_append_waits_for_the_kernel_before_it(cache, writer_stream):
    """kv_append launches as a programmatic dependent of the stream's previous kernel (sm_90 and
    newer) and must wait for it before its first load. The kernel before it here lets it launch
    at once, then spends 20 us before writing k_new, v_new and seq_lens: an append that read
    them early would write the previous round's tokens at the previous round's positions. With
    ``writer_stream`` "side" that kernel runs on another stream, which the append's stream
    waits for (an event): the programmatic launch relaxes the order after a kernel of its own
    stream only, and a multi-stream caller's join must still hold. Its first call launches
    directly, then the whole is captured in a CUDA graph and replayed 8 times, each round with
    new tokens and new positions."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 (kv_append launches plainly)")
    b, cap = 8, 64
    desc = _descriptor(cache, "bf16", cap, b)
    problem = make_problem(desc, np.full(b, 10), seed=30)
    shape = (b, 1, desc.heads_kv, desc.head_dim)
    k_new, v_new, k_src, v_src = (torch.empty(shape, dtype=torch.bfloat16, device="cuda")
                                  for _ in range(4))
    positions = torch.empty(b, dtype=torch.int32, device="cuda")
    plan = KvAppendPlan.select(_append_descriptor(desc, 1), device=0)
    args = KvAppendArgs(k_new, v_new, problem.k_cache, problem.v_cache, problem.seq_lens,
                        problem.page_table)
    rng = np.random.default_rng(32)

    side = torch.cuda.Stream()

    def write_then_append(step) -> None:
        write_late([(k_src, k_new), (v_src, v_new), (positions, problem.seq_lens)],
                   side if writer_stream == "side" else None)
        step()

    def new_round() -> np.ndarray:
        lengths = rng.integers(1, cap, b, endpoint=True)
        positions.copy_(torch.tensor(lengths, dtype=torch.int32))
        k_src.uniform_(-1, 1)
        v_src.uniform_(-1, 1)
        return lengths

    def check(lengths: np.ndarray) -> None:
        torch.cuda.synchronize()
        for s, length in enumerate(lengths):
            k_at, v_at = _slot(problem, desc, s, int(length) - 1)
            assert torch.equal(k_at, k_src[s, 0]) and torch.equal(v_at, v_src[s, 0]), s

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step = plan.prepare(args)
        lengths = new_round()
        write_then_append(step)  # the step's first call: a direct launch
        check(lengths)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            write_then_append(step)
    for _ in range(8):
        lengths = new_round()
        graph.replay()
        check(lengths)


def _slot(problem, desc, s: int, position: int):
    """Sequence s's key and value [Hkv, D] at ``position`` in ``problem``'s caches."""
    if desc.cache == "paged":
        page = int(problem.page_table[s, position // desc.page_size])
        row, slot = page, position % desc.page_size
    else:
        row, slot = s, position
    if desc.kv_layout == "hnd":
        return problem.k_cache[row, :, slot], problem.v_cache[row, :, slot]
    return problem.k_cache[row, slot], problem.v_cache[row, slot]

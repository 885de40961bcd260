"""Drives the split-KV decode, kv_append and kv_cache_check kernels (native/decode_attention.cu,
native/decode_wg.cu, native/kv_append.cu) for compute-sanitizer: f32 and f16 (CuPy has no
bf16), every head dim and row tile (every build of the tensor-core tiles), each cache form,
windows, and unchecked runs on garbage lengths and page tables, which must stay inside the
caches and outputs. Every tensor is sized exactly, so a stray access lands outside an
allocation.
`compute-sanitizer --tool memcheck python3 tests/sanitize_decode.py`. Not a pytest file: the
sanitizer wraps the whole process."""

import cupy
import numpy as np

from opfacade import (
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
    DecodeAttentionPlan,
    KvAppendArgs,
    KvAppendDescriptor,
    KvAppendPlan,
)
from opfacade._backends.nvrtc import decode as kernels
from opfacade.errors import InvalidArgument

# CuPy has no bfloat16; bf16 runs the same code as f16 but for the 16-byte unpack.
DTYPES = {"f32": cupy.float32, "f16": cupy.float16}
rng = np.random.default_rng(0)


def tensor(shape, element):
    return cupy.random.uniform(-1, 1, shape).astype(DTYPES[element])


def run_case(element, cache, dim, heads_q, heads_kv, q_len, capacity, batch, window, garbage):
    fields = dict(batch=batch, heads_kv=heads_kv, head_dim=dim, element=element, cache=cache,
                  q_len=q_len)
    if cache == "paged":
        fields.update(page_size=16, max_pages=-(-capacity // 16))
        pages = batch * fields["max_pages"] + 1
        k = tensor((pages, 16, heads_kv, dim), element)
        v = tensor((pages, 16, heads_kv, dim), element)
        table = cupy.asarray(rng.permutation(pages)[: batch * fields["max_pages"]].reshape(
            batch, -1).astype(np.int32))
        if garbage:
            table[0, 0], table[-1, -1] = -7, 10**8
    else:
        fields["max_seq"] = capacity
        k, v = tensor((batch, capacity, heads_kv, dim), element), tensor(
            (batch, capacity, heads_kv, dim), element)
        table = None
    lengths = rng.integers(0, capacity, batch, endpoint=True).astype(np.int32)
    if garbage:
        lengths[0], lengths[-1] = -5, capacity * 3 + 1
    seq_lens = cupy.asarray(lengths)
    q = tensor((batch, q_len, heads_q, dim), element)
    out = tensor((batch, q_len, heads_q, dim), element)
    lse = cupy.empty((batch, q_len, heads_q), cupy.float32)
    desc = DecodeAttentionDescriptor(**fields, heads_q=heads_q, save_lse=True,
                                     window=None if window is None else (window, None))
    plan = DecodeAttentionPlan.select(desc, device=0)
    plan.run(DecodeAttentionArgs(q, k, v, seq_lens, out, table, lse))
    append = KvAppendPlan.select(KvAppendDescriptor(**fields), device=0)
    k_new = tensor((batch, q_len, heads_kv, dim), element)
    append.run(KvAppendArgs(k_new, k_new.copy(), k, v, seq_lens, table))
    checked = DecodeAttentionPlan.select(desc.model_copy(update={"checked": True}), device=0)
    try:
        checked.run(DecodeAttentionArgs(q, k, v, seq_lens, out, table, lse))
    except InvalidArgument as error:
        assert garbage, error
    cupy.cuda.runtime.deviceSynchronize()


for element in ("f32", "f16"):
    for dim in (64, 128, 256):
        run_case(element, "contiguous", dim, 8, 2, 1, 300, 3, None, False)
run_case("f16", "paged", 128, 32, 8, 4, 700, 5, None, False)   # two row tiles of 8
run_case("f32", "paged", 64, 4, 4, 1, 520, 4, 100, False)
run_case("f16", "contiguous", 64, 6, 2, 3, 260, 4, 40, False)
run_case("f16", "paged", 128, 8, 2, 2, 400, 6, None, True)     # garbage lengths and pages
run_case("f32", "contiguous", 128, 8, 1, 1, 333, 5, None, True)
run_case("f16", "paged", 128, 16, 2, 1, 1500, 3, 300, True)     # 8 rows, a window, garbage
# Long caches: the merge's 512- and 1024-thread builds (decode.MERGE_THREADS).
run_case("f16", "contiguous", 64, 4, 1, 1, 20000, 2, None, True)
run_case("f32", "paged", 128, 2, 1, 1, 40000, 2, 500, False)
# A paged cache of 1250 pages a sequence on garbage lengths and pages.
run_case("f16", "paged", 64, 4, 1, 1, 20000, 2, None, True)
# The kq tile's 4-row build (K in whole lines) on garbage lengths and pages, at 4 and 3 rows.
run_case("f16", "paged", 128, 8, 2, 1, 400, 6, None, True)
run_case("f16", "contiguous", 128, 6, 2, 1, 700, 3, 100, True)
# The kq tile's 3-CTA build and the 16-row tile's staged build, which grids as small as these
# never pick (decode.KQ_FEW_WAVES, MMA_FEW_WAVES).
kernels.KQ_FEW_WAVES, kernels.MMA_FEW_WAVES = 0, 0
run_case("f16", "contiguous", 128, 8, 2, 1, 300, 3, None, False)
run_case("f16", "paged", 128, 8, 2, 1, 400, 6, None, True)
run_case("f16", "paged", 128, 8, 2, 2, 400, 6, None, True)
run_case("f16", "paged", 128, 16, 2, 1, 1500, 3, 300, True)
run_case("f16", "paged", 128, 32, 8, 4, 700, 5, None, False)
run_case("f16", "contiguous", 64, 6, 2, 3, 260, 4, 40, False)
run_case("f16", "paged", 64, 16, 2, 2, 900, 4, None, True)
# The 16-row tile's batch in two halves (decode.splits_batch) on garbage lengths, contiguous
# (each half's cache rows moved) and paged (its table rows), and an odd batch.
kernels.MMA_FEW_WAVES, kernels.SPLIT_WAVES = 4, 0
run_case("f16", "contiguous", 128, 16, 2, 2, 300, 5, None, True)
run_case("f16", "paged", 128, 16, 2, 2, 600, 7, 100, True)
# The wgmma tiles (what sm_90 devices run for kv heads of more than 8 rows at D 128) on partial
# tiles (12 and 15 of 16 rows, 20 of 32), windows and garbage; then the 16-row mma.sync tile at
# D 128, which those devices no longer pick (decode.WG_DIMS), split and whole.
kernels.SPLIT_WAVES = 8
run_case("f16", "contiguous", 128, 24, 2, 1, 1100, 3, 200, True)
run_case("f16", "paged", 128, 30, 2, 1, 700, 4, None, True)
run_case("f16", "contiguous", 128, 32, 1, 1, 900, 3, None, True)  # 32 rows: the 32-row tile
run_case("f16", "paged", 128, 8, 2, 5, 700, 4, 100, True)          # 20 rows of 32
# The wgmma tiles' spans (decode.wg_span: a CTA over several chunks, its ring running on into
# the next), forced on these small grids, on garbage lengths and pages and windows.
wg_span = kernels.wg_span
kernels.wg_span = lambda rows, *grid: 3 if rows == 16 else 2
run_case("f16", "contiguous", 128, 24, 2, 1, 1700, 3, 200, True)
run_case("f16", "paged", 128, 32, 1, 1, 2100, 3, None, True)
run_case("f16", "paged", 128, 8, 2, 4, 1600, 4, 300, True)
kernels.wg_span = wg_span
kernels.WG_DIMS = ()
run_case("f16", "paged", 128, 32, 8, 4, 700, 5, None, False)
run_case("f16", "contiguous", 128, 16, 2, 2, 300, 5, None, True)
print("sanitize_decode: done")

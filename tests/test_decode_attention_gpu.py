"""The split-KV decode attention SKUs on a GPU: against the float64 reference over every cache
form and layout, with NaN past the lengths and in pages no sequence owns, batch invariance
(a sequence alone and inside batches, at other positions, bitwise), one captured CUDA graph
replayed for new lengths, page tables and batch compositions, per-sequence caches against their
contiguous twin, checked mode, and bad input. Every SKU's bound on every input distribution is
tests/test_precision_gpu.py's; kv_append's GPU tests are tests/test_kv_append_gpu.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from opfacade import (
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
    DecodeAttentionPlan,
    PlanPreference,
)
from opfacade._backends.nvrtc.decode import CHUNK
from opfacade._backends.reference import decode_attention as reference_decode
from opfacade._backends.reference.sdpa import sdpa_forward_magnitude
from opfacade.errors import DTypeMismatch, InvalidArgument, InvalidProblem, LayoutMismatch
from opfacade.testing import relative_error

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
INVARIANT = PlanPreference(batch_invariant=True)


@dataclass(frozen=True)
class Cache:
    """One cache form for a test: contiguous, paged (page size) or per-sequence pointers."""

    form: str
    layout: str = "nhd"
    page_size: int = 0

    @property
    def id(self) -> str:
        return f"{self.form}{self.page_size or ''}-{self.layout}"


CACHES = [Cache("contiguous"), Cache("contiguous", "hnd"), Cache("paged", "nhd", 16),
          Cache("paged", "hnd", 64), Cache("paged", "nhd", 1), Cache("pointers")]


def _descriptor(cache: Cache, element: str, capacity: int, batch: int, **fields
                ) -> DecodeAttentionDescriptor:
    if cache.form == "paged":
        where = dict(page_size=cache.page_size, max_pages=-(-capacity // cache.page_size))
    else:
        where = dict(max_seq=capacity)
    return DecodeAttentionDescriptor(batch=batch, element=element, cache=cache.form,
                                     kv_layout=cache.layout, save_lse=True,
                                     **{"heads_q": 8, "heads_kv": 2, "head_dim": 64, **fields},
                                     **where)


@dataclass
class Problem:
    """A step's tensors for ``desc`` with ``lengths``: the history as the reference sees it
    (contiguous, float64) and the caches as the plan reads them, NaN wherever no sequence's
    token is."""

    desc: DecodeAttentionDescriptor
    lengths: np.ndarray
    q: object
    keys: np.ndarray  # [b, Hkv, capacity, D] float64, zeros past the lengths
    values: np.ndarray
    k_cache: object
    v_cache: object
    page_table: object
    seq_lens: object
    keep: list  # per-sequence caches behind "pointers"

    def args(self, out=None, lse=None) -> DecodeAttentionArgs:
        b, d = self.q.shape[0], self.desc
        out = torch.full((b, d.q_len, d.heads_q, d.dim_v), float("nan"), dtype=self.q.dtype,
                         device="cuda") if out is None else out
        lse = torch.full((b, d.q_len, d.heads_q), float("nan"), device="cuda") if lse is None \
            else lse
        return DecodeAttentionArgs(self.q, self.k_cache, self.v_cache, self.seq_lens, out,
                                   self.page_table, lse)

    def expected(self, forward=None):
        q = self.q.double().cpu().numpy()
        options = dict(scale=self.desc.softmax_scale,
                       window_left=None if self.desc.window is None else self.desc.window.left)
        if forward is not None:
            options["forward"] = forward
        return reference_decode(q, self.keys, self.values, self.lengths, kv_layout="hnd",
                                **options)


def _rounded(values: np.ndarray, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device="cuda")


def make_problem(desc: DecodeAttentionDescriptor, lengths, seed: int = 0,
                 history: tuple[np.ndarray, np.ndarray] | None = None) -> Problem:
    """Random (or the given) history per sequence, laid out in the descriptor's cache form."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int64)
    b, hkv, d, cap = len(lengths), desc.heads_kv, desc.head_dim, desc.capacity
    dtype = DTYPES[desc.element.value]
    q = _rounded(rng.uniform(-1, 1, (b, desc.q_len, desc.heads_q, d)), dtype)
    if history is None:
        keys = rng.uniform(-1, 1, (b, hkv, cap, d))
        values = rng.uniform(-1, 1, (b, hkv, cap, d))
    else:
        keys, values = history
    owned = np.arange(cap)[None, None, :, None] < lengths[:, None, None, None]
    keys = np.where(owned, _rounded(keys, dtype).double().cpu().numpy(), 0.0)
    values = np.where(owned, _rounded(values, dtype).double().cpu().numpy(), 0.0)
    nan_k, nan_v = np.where(owned, keys, np.nan), np.where(owned, values, np.nan)
    table, keep = None, []
    if desc.cache == "paged":
        ps, mp = desc.page_size, desc.max_pages
        pages = b * mp + 5
        order = rng.permutation(pages)[: b * mp].reshape(b, mp)
        pool_k = np.full((pages, ps, hkv, d), np.nan)
        pool_v = np.full((pages, ps, hkv, d), np.nan)
        padded_k = np.full((b, hkv, mp * ps, d), np.nan)
        padded_v = np.full((b, hkv, mp * ps, d), np.nan)
        padded_k[:, :, :cap], padded_v[:, :, :cap] = nan_k, nan_v
        for s in range(b):
            for slot in range(mp):
                rows = slice(slot * ps, (slot + 1) * ps)
                pool_k[order[s, slot]] = padded_k[s, :, rows].transpose(1, 0, 2)
                pool_v[order[s, slot]] = padded_v[s, :, rows].transpose(1, 0, 2)
        k_host, v_host = pool_k, pool_v
        table = torch.tensor(order, dtype=torch.int32, device="cuda")
    else:
        k_host, v_host = nan_k.transpose(0, 2, 1, 3), nan_v.transpose(0, 2, 1, 3)  # nhd
    if desc.kv_layout == "hnd":
        k_host, v_host = k_host.transpose(0, 2, 1, 3), v_host.transpose(0, 2, 1, 3)
    k_cache = _rounded(np.ascontiguousarray(k_host), dtype)
    v_cache = _rounded(np.ascontiguousarray(v_host), dtype)
    if desc.cache == "pointers":
        keep = [(k_cache[s].clone(), v_cache[s].clone()) for s in range(b)]
        k_cache = torch.tensor([k.data_ptr() for k, _ in keep], dtype=torch.int64, device="cuda")
        v_cache = torch.tensor([v.data_ptr() for _, v in keep], dtype=torch.int64, device="cuda")
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return Problem(desc, lengths, q, keys, values, k_cache, v_cache, table, seq_lens, keep)


def captured_step(plan, args, workspace):
    """A CUDA graph of the plan's prepared step on ``args``, captured once after a warm call
    (modules loaded, graphs built, outside the capture)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step = plan.prepare(args, workspace=workspace)
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            step()
    return graph


def load_into(problem: Problem, fresh: Problem) -> Problem:
    """Writes ``fresh``'s tensors into ``problem``'s buffers (those a captured graph reads) and
    returns ``fresh`` pointed at them, for the expected values."""
    for name in ("q", "k_cache", "v_cache", "seq_lens", "page_table"):
        if getattr(problem, name) is not None:
            getattr(problem, name).copy_(getattr(fresh, name))
    fresh.q, fresh.k_cache, fresh.v_cache = problem.q, problem.k_cache, problem.v_cache
    return fresh


def _check(problem: Problem, args: DecodeAttentionArgs, bound: float) -> None:
    out, lse = problem.expected()
    out_mag, _ = problem.expected(forward=sdpa_forward_magnitude)
    got = args.out.double().cpu().numpy()
    assert np.isfinite(got).all()
    assert relative_error(got, out, out_mag) <= bound
    got_lse = args.lse.double().cpu().numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(lse))
    finite = np.isfinite(lse)
    assert np.allclose(got_lse[finite], lse[finite], rtol=1e-5, atol=1e-5)
    empty = problem.lengths == 0
    assert (got[empty] == 0).all()


@pytest.mark.parametrize("element", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("cache", CACHES, ids=[c.id for c in CACHES])
@pytest.mark.parametrize("q_len", [1, 4])
def test_every_cache_form_matches_the_reference(element, cache, q_len):
    """Lengths: empty, shorter than q_len, inside the first chunk, across chunks, full; NaN
    everywhere no sequence's token is."""
    desc = _descriptor(cache, element, 2 * CHUNK + 88, 6, q_len=q_len)
    problem = make_problem(desc, [0, q_len - 1 if q_len > 1 else 1, 37, CHUNK, 2 * CHUNK + 88,
                                  CHUNK + 1], seed=1)
    plan = DecodeAttentionPlan.select(desc, INVARIANT, device=0)
    assert plan.precision_guarantee.batch_invariant and plan.sku.backend.value == "nvrtc"
    args = problem.args()
    plan.run(args)
    _check(problem, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize(("heads_q", "heads_kv", "head_dim", "window"), [
    (32, 8, 128, None), (32, 1, 128, None), (16, 16, 256, None), (12, 4, 64, (100, None)),
    (64, 8, 128, (300, None))])
def test_gqa_mqa_head_dims_and_windows(heads_q, heads_kv, head_dim, window):
    desc = _descriptor(Cache("paged", "nhd", 32), "bf16", 1100, 4, heads_q=heads_q,
                       heads_kv=heads_kv, head_dim=head_dim, window=window, q_len=3)
    problem = make_problem(desc, [1100, 0, 301, 555], seed=2)
    plan = DecodeAttentionPlan.select(desc, device=0)
    args = problem.args()
    plan.run(args)
    _check(problem, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("cache", [Cache("contiguous"), Cache("paged", "hnd", 16)],
                         ids=lambda c: c.id)
@pytest.mark.parametrize("q_len", [1, 4])
def test_a_sequence_is_bitwise_the_same_alone_and_in_any_batch(monkeypatch, cache, q_len):
    """Batch invariance: sequence 0's out and lse alone, then at positions 0, 5 and 15 of
    batches of 16 whose other sequences are random, repeat to the bit. At q_len 1 the kq tile
    runs these kv heads of 4 rows; its build follows the grid, so the 4-CTA build is held to
    grids of under 52 CTAs here: alone (32 CTAs) takes it, the batches of 16 (512) the 3-CTA
    build. At q_len 4 (16 rows) the wgmma tile runs them on sm_90 (the 16-row mma.sync tile
    elsewhere), and the batches of 16 split in two halves."""
    from opfacade._backends.nvrtc import decode as kernels

    monkeypatch.setattr(kernels, "KQ_FEW_WAVES", 0.1)
    monkeypatch.setattr(kernels, "SPLIT_WAVES", 0)
    capacity, rng = 2000, np.random.default_rng(3)
    desc = _descriptor(cache, "bf16", capacity, 16, heads_q=32, heads_kv=8, head_dim=128,
                       q_len=q_len)
    plan = DecodeAttentionPlan.select(desc, INVARIANT, device=0)
    hkv, d = desc.heads_kv, desc.head_dim
    mine = (rng.uniform(-1, 1, (hkv, capacity, d)), rng.uniform(-1, 1, (hkv, capacity, d)))
    q_mine = rng.uniform(-1, 1, (q_len, desc.heads_q, d))
    results = []
    for position, batch in ((0, 1), (0, 16), (5, 16), (15, 16)):
        lengths = rng.integers(0, capacity, batch, endpoint=True)
        lengths[position] = 1777
        keys = rng.uniform(-1, 1, (batch, hkv, capacity, d))
        values = rng.uniform(-1, 1, (batch, hkv, capacity, d))
        keys[position], values[position] = mine
        problem = make_problem(desc, lengths, seed=position + batch, history=(keys, values))
        problem.q[position] = _rounded(q_mine, problem.q.dtype)
        args = problem.args()
        plan.run(args)
        results.append((args.out[position].clone(), args.lse[position].clone()))
    first_out, first_lse = results[0]
    for out, lse in results[1:]:
        assert torch.equal(out, first_out) and torch.equal(lse, first_lse)


def _runs_under(monkeypatch, desc, lengths, seed, settings, kernel="decode_partial"):
    """One problem run once per (decode.py attribute, value) of ``settings``, each with a new
    out and lse (so the plan's memo builds the launches again): the problem, the plan, and each
    run's args with the ``kernel`` (the partial or the merge) that run fetched, or None."""
    from opfacade._backends.nvrtc import decode as kernels

    problem = make_problem(desc, lengths, seed=seed)
    plan = DecodeAttentionPlan.select(desc, INVARIANT, device=0)
    get_kernel, fetched = kernels.get_kernel, []
    monkeypatch.setattr(kernels, "get_kernel", lambda source, name, device: (
        fetched.append(name), get_kernel(source, name, device))[1])
    runs = []
    for attribute, value in settings:
        monkeypatch.setattr(kernels, attribute, value)
        args, start = problem.args(), len(fetched)
        plan.run(args)
        launched = [name for name in fetched[start:] if name.startswith(kernel)]
        runs.append((args, launched[-1] if launched else None))
    return problem, plan, runs


@pytest.mark.parametrize("span", [2, 3])
@pytest.mark.parametrize("cache", [Cache("contiguous"), Cache("paged", "hnd", 16),
                                   Cache("pointers")], ids=lambda c: c.id)
@pytest.mark.parametrize("window", [None, (300, None)], ids=["full", "window"])
@pytest.mark.parametrize(("element", "head_dim"), [("bf16", 64), ("f32", 128), ("f16", 256)])
def test_spans_of_chunks_give_the_one_chunk_kernels_bits(monkeypatch, span, cache, window,
                                                         element, head_dim):
    """The 4-row tiles' spans kernels (a CTA over `span` consecutive chunks), forced on a small
    grid: the same bits as one chunk a CTA, and the reference's values, across lengths that
    end inside a span, empty sequences, and windows that leave whole chunks of a span
    unseen."""
    desc = _descriptor(cache, element, 2100, 5, heads_q=8, heads_kv=2, head_dim=head_dim,
                       window=window)
    problem, plan, ((one, plain), (spans, spanned)) = _runs_under(
        monkeypatch, desc, [2100, 0, 1, 1000, 257], 7,
        [("span_for", lambda ctas, resident: 1), ("span_for", lambda ctas, resident: span)])
    assert not plain.endswith("_spans") and spanned.endswith("_spans"), (plain, spanned)
    _check(problem, spans, plan.precision_guarantee.max_rel_error)
    assert torch.equal(one.out, spans.out) and torch.equal(one.lse, spans.lse)


@pytest.mark.parametrize("cache", CACHES, ids=[c.id for c in CACHES])
@pytest.mark.parametrize("window", [None, (300, None)], ids=["full", "window"])
@pytest.mark.parametrize(("element", "q_len", "heads_q"), [("bf16", 1, 8), ("f16", 2, 8),
                                                         ("f16", 1, 6)])
def test_the_kq_tiles_builds_give_the_same_bits(monkeypatch, cache, window, element, q_len,
                                                 heads_q):
    """The kq tile (kv heads of up to 8 rows at D 128; 4, 8 and 3 here: the 4-row build, which
    reads K in whole lines, up to 4) is built for 3 and 4 CTAs an SM and for grids of one wave
    (4 groups of keys in each warp's ring), and decode.py picks one by the grid and the
    device: each forced gives the same bits and the reference's values, across lengths that end
    inside a chunk, empty sequences, sequences shorter than q_len, and windows that leave whole
    chunks unseen."""
    desc = _descriptor(cache, element, 2100, 5, heads_q=heads_q, heads_kv=2, head_dim=128,
                       window=window, q_len=q_len)
    problem, plan, runs = _runs_under(
        monkeypatch, desc, [2100, 0, 1, 1000, 257], 8,
        [("KQ_DEEP_GRIDS", ()), ("KQ_FEW_WAVES", 0), ("KQ_DEEP_GRIDS", ((0, 1e9),))])
    kernel = f"decode_partial_{element}_128_{4 if heads_q // 2 * q_len <= 4 else 8}kq"
    assert [build for _, build in runs] == [kernel + b for b in ("_b4", "_b3", "_d4")]
    first = runs[0][0]
    for args, _ in runs:
        _check(problem, args, plan.precision_guarantee.max_rel_error)
        assert torch.equal(args.out, first.out) and torch.equal(args.lse, first.lse)


@pytest.mark.parametrize("cache", CACHES, ids=[c.id for c in CACHES])
@pytest.mark.parametrize("window", [None, (300, None)], ids=["full", "window"])
@pytest.mark.parametrize(("element", "head_dim", "q_len", "heads_q"),
                         [("bf16", 128, 4, 8), ("f16", 64, 3, 10), ("bf16", 64, 6, 4)])
def test_the_16_row_tiles_staged_build_gives_its_register_builds_bits(
        monkeypatch, cache, window, element, head_dim, q_len, heads_q):
    """The 16-row tensor-core tile (kv heads of more than 8 rows, or of more than 4 off the kq
    tile's D) stages K and V through shared memory on grids of many waves: forced both ways it
    gives the same bits and the reference's values, on full and partial tiles (12 and 15 of
    16 rows here), lengths that end inside a chunk, empty sequences and windows."""
    from opfacade._backends.nvrtc import decode as kernels

    monkeypatch.setattr(kernels, "WG_DIMS", ())  # the mma.sync tile at D 128 too (sm_90 picks wg)
    desc = _descriptor(cache, element, 2100, 5, heads_q=heads_q, heads_kv=2, head_dim=head_dim,
                       window=window, q_len=q_len)
    problem, plan, ((registers, plain), (staged, ring)) = _runs_under(
        monkeypatch, desc, [2100, 0, 1, 1000, 257], 9,
        [("MMA_FEW_WAVES", 1e9), ("MMA_FEW_WAVES", 0)])
    assert (plain, ring) == (f"decode_partial_{element}_{head_dim}_16",
                             f"decode_partial_{element}_{head_dim}_16_staged")
    for args in (registers, staged):
        _check(problem, args, plan.precision_guarantee.max_rel_error)
    assert torch.equal(registers.out, staged.out) and torch.equal(registers.lse, staged.lse)


@pytest.mark.parametrize("cache", CACHES, ids=[c.id for c in CACHES])
@pytest.mark.parametrize("window", [None, (300, None), (63, None)],
                         ids=["full", "window", "window 63"])
@pytest.mark.parametrize(("element", "q_len", "heads_q", "tile"),
                         [("bf16", 4, 8, 16), ("f16", 3, 10, 16), ("bf16", 1, 30, 16),
                          ("f16", 8, 8, 32), ("bf16", 5, 8, 32), ("f16", 8, 16, 32)])
def test_the_wgmma_tile_matches_the_reference(monkeypatch, cache, window, element, q_len,
                                              heads_q, tile):
    """The wgmma tiles (sm_90: kv heads of more than 8 rows at D 128; here 16, 15 and 15 rows on
    the 16-row tile, 32, 20 and two tiles of 32 on the 32-row one) give the reference's values
    across lengths that end inside a block of 64 keys and inside a chunk, on a block's edge,
    empty sequences, sequences shorter than q_len, and windows that leave whole blocks and
    chunks unseen."""
    from opfacade._backends.nvrtc import decode as kernels

    if not kernels.wgmma_on(0):
        pytest.skip("the wgmma tile runs on sm_90 devices")
    desc = _descriptor(cache, element, 2100, 8, heads_q=heads_q, heads_kv=2, head_dim=128,
                       window=window, q_len=q_len)
    problem, plan, ((args, kernel),) = _runs_under(
        monkeypatch, desc, [2100, 0, 1, 1000, 257, 63, 64, 577], 10,
        [("SPLIT_TILES", kernels.SPLIT_TILES)])
    assert kernel == f"decode_partial_{element}_128_{tile}wg"
    _check(problem, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("span", [2, 3])
@pytest.mark.parametrize("cache", [Cache("contiguous"), Cache("paged", "nhd", 16),
                                   Cache("paged", "hnd", 1), Cache("pointers")],
                         ids=lambda c: c.id)
@pytest.mark.parametrize("window", [None, (300, None), (63, None)],
                         ids=["full", "window", "window 63"])
@pytest.mark.parametrize(("element", "q_len", "heads_q", "tile"),
                         [("bf16", 4, 8, 16), ("f16", 8, 16, 32)])
def test_the_wgmma_tiles_spans_give_one_chunks_bits(monkeypatch, span, cache, window, element,
                                                    q_len, heads_q, tile):
    """The wgmma tiles' spans kernels (a CTA over `span` consecutive chunks, its ring running on
    from one chunk into the next), forced on a small grid: the same bits as one chunk a CTA and
    the reference's values, across lengths that end inside a chunk or on its edge (so a span's
    next chunk starts at the length), empty sequences, windows that leave a span's first chunks
    unseen, and (two 32-row tiles at q_len 8) a tile whose last position leaves a span's last
    chunk unseen."""
    from opfacade._backends.nvrtc import decode as kernels

    if not kernels.wgmma_on(0):
        pytest.skip("the wgmma tile runs on sm_90 devices")
    desc = _descriptor(cache, element, 2100, 10, heads_q=heads_q, heads_kv=2, head_dim=128,
                       window=window, q_len=q_len)
    problem, plan, ((one, plain), (spans, spanned)) = _runs_under(
        monkeypatch, desc, [2100, 0, 1, 1028, 257, 1536, 2048, 577, 1024, 1029], 11,
        [("wg_span", lambda *grid: 1), ("wg_span", lambda *grid: span)])
    kernel = f"decode_partial_{element}_128_{tile}wg"
    assert (plain, spanned) == (kernel, kernel + "_spans")
    _check(problem, spans, plan.precision_guarantee.max_rel_error)
    assert torch.equal(one.out, spans.out) and torch.equal(one.lse, spans.lse)


@pytest.mark.parametrize(("capacity", "threads"),
                         [(8192, 64), (9000, 256), (20000, 512), (40000, 1024)])
@pytest.mark.parametrize(("element", "head_dim", "heads_q"), [("bf16", 128, 8), ("f32", 64, 2)])
def test_each_merge_width_matches_the_reference(monkeypatch, capacity, threads, element,
                                                head_dim, heads_q):
    """The merge's threads follow the capacity's chunks (decode.MERGE_THREADS): 64, 256, 512
    and 1024, whose slices take 1 to 20 chunks each (early loads, then the loop after them),
    match the reference on lengths that fill the capacity, end inside a chunk, or are 1 or 0."""
    from opfacade._backends.nvrtc import decode as kernels

    desc = _descriptor(Cache("contiguous"), element, capacity, 4, heads_q=heads_q, heads_kv=2,
                       head_dim=head_dim)
    problem = make_problem(desc, [capacity, capacity - 300, 1, 0], seed=11)
    plan = DecodeAttentionPlan.select(desc, INVARIANT, device=0)
    get_kernel, fetched = kernels.get_kernel, []
    monkeypatch.setattr(kernels, "get_kernel", lambda source, name, device: (
        fetched.append(name), get_kernel(source, name, device))[1])
    args = problem.args()
    plan.run(args)
    assert f"decode_merge_{element}_{threads}" in fetched  # 8192: 16 chunks, past rows
    _check(problem, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize(("element", "head_dim", "q_len", "batch"),
                         [("f32", 64, 1, 5), ("bf16", 128, 3, 7), ("f16", 256, 2, 3),
                          ("bf16", 128, 1, 300)])
def test_the_rows_merge_gives_the_64_thread_merges_bits(monkeypatch, element, head_dim, q_len,
                                                        batch):
    """Caches of up to 4 chunks merge in rows (several a CTA, decode.MERGE_ROWS) with the
    64-thread merge's sums: the same bits for out and lse at Dv 64, 128 and 256 (4, 2 and 1 of
    that merge's slices), with lengths of 0, 1, inside a chunk and full, and a batch whose rows
    leave a CTA part-empty."""
    from opfacade._backends.nvrtc import decode as kernels

    capacity = kernels.ROWS_CHUNKS * CHUNK
    desc = _descriptor(Cache("paged", "nhd", 16), element, capacity, batch, heads_q=6,
                       heads_kv=2, head_dim=head_dim, q_len=q_len)
    lengths = np.random.default_rng(batch).integers(0, capacity, batch, endpoint=True)
    lengths[:3] = [capacity, 0, 1][:batch]
    problem, plan, ((rows, in_rows), (whole, per_row)) = _runs_under(
        monkeypatch, desc, lengths, batch, [("MERGE_ROWS", True), ("MERGE_ROWS", False)],
        kernel="decode_merge")
    assert (in_rows, per_row) == (f"decode_merge_{element}_rows", f"decode_merge_{element}_64")
    assert torch.equal(rows.out, whole.out) and torch.equal(rows.lse, whole.lse)
    _check(problem, rows, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("cache", CACHES, ids=[c.id for c in CACHES])
@pytest.mark.parametrize(("element", "head_dim", "q_len", "heads_q", "batch"),
                         [("bf16", 128, 4, 8, 6), ("f16", 64, 3, 10, 5)])
def test_a_split_batch_gives_the_whole_grids_bits(monkeypatch, cache, element, head_dim, q_len,
                                                  heads_q, batch):
    """Kv heads of the 16-row tile run the batch as two halves on two streams
    (decode.SPLIT_TILES): out and lse are the whole grid's bits and the reference's values,
    with empty sequences, sequences shorter than q_len and lengths inside a chunk in either
    half, and an odd batch."""
    from opfacade._backends.nvrtc import decode as kernels

    monkeypatch.setattr(kernels, "SPLIT_WAVES", 0)  # these grids are a few CTAs
    desc = _descriptor(cache, element, 2100, batch, heads_q=heads_q, heads_kv=2,
                       head_dim=head_dim, q_len=q_len)
    lengths = [2100, 0, 1, 1000, 257, 2][:batch]
    problem, plan, ((split, _), (whole, _)) = _runs_under(
        monkeypatch, desc, lengths, 14, [("SPLIT_TILES", ("mma", "wg")), ("SPLIT_TILES", ())])
    _check(problem, split, plan.precision_guarantee.max_rel_error)
    assert torch.equal(split.out, whole.out) and torch.equal(split.lse, whole.lse)


def test_runs_repeat_bitwise_over_streams_and_workspaces():
    from opfacade.testing import repeat_runs

    desc = _descriptor(Cache("paged", "nhd", 16), "bf16", 2048, 12, heads_q=32, heads_kv=8,
                       head_dim=128)
    lengths = np.random.default_rng(4).integers(0, 2048, 12, endpoint=True)
    problem = make_problem(desc, lengths, seed=4)
    plan = DecodeAttentionPlan.select(desc, device=0)
    result = repeat_runs(plan, problem.args(), runs=4)
    assert result.bitwise_equal, result


def test_pointer_caches_give_their_contiguous_twins_bits():
    lengths = [700, 0, 1, 299]
    contiguous = _descriptor(Cache("contiguous"), "f16", 700, 4, q_len=2)
    pointers = _descriptor(Cache("pointers"), "f16", 700, 4, q_len=2)
    a, b = make_problem(contiguous, lengths, seed=5), make_problem(pointers, lengths, seed=5)
    outputs = []
    for desc, problem in ((contiguous, a), (pointers, b)):
        args = problem.args()
        DecodeAttentionPlan.select(desc, device=0).run(args)
        outputs.append(args)
    assert torch.equal(outputs[0].out, outputs[1].out)
    assert torch.equal(outputs[0].lse, outputs[1].lse)


@pytest.mark.parametrize("q_len", [1, 2])
def test_a_query_of_unaligned_rows_gives_its_dense_twins_bits(q_len):
    """The kq tile loads Q's rows as 16-byte vectors where every row is 16-byte aligned, else
    element by element: a q whose rows start 2 bytes past that (a slice of a wider tensor,
    strides that are no multiple of 8) gives the bits of the same values in a dense q."""
    desc = _descriptor(Cache("paged", "nhd", 16), "bf16", 1100, 3, heads_q=16, heads_kv=4,
                       head_dim=128, q_len=q_len)
    problem = make_problem(desc, [1100, 0, 517], seed=9)
    plan = DecodeAttentionPlan.select(desc, device=0)
    dense = problem.args()
    plan.run(dense)
    wide = torch.zeros((*problem.q.shape[:-1], 129), dtype=problem.q.dtype, device="cuda")
    wide[..., 1:] = problem.q
    problem.q = wide[..., 1:]
    assert problem.q.data_ptr() % 16 == 2 and problem.q.stride(2) == 129
    sliced = problem.args()
    plan.run(sliced)
    assert torch.equal(dense.out, sliced.out) and torch.equal(dense.lse, sliced.lse)
    _check(problem, sliced, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("q_len", [1, 4])  # 4: a 16-row tile, its batch split on two streams
@pytest.mark.parametrize("cache", [Cache("contiguous"), Cache("paged", "nhd", 16)],
                         ids=lambda c: c.id)
def test_one_captured_graph_replays_new_lengths_tables_and_batches(monkeypatch, cache, q_len):
    """Captured once at the envelope's batch; replayed with new seq_lens and page tables written
    into the same buffers, and a batch whose tail slots are empty (length 0)."""
    from opfacade._backends.nvrtc import decode as kernels

    monkeypatch.setattr(kernels, "SPLIT_WAVES", 0)  # q_len 4 splits its batch of a few CTAs
    desc = _descriptor(cache, "bf16", 1500, 8, heads_q=32, heads_kv=8, head_dim=128,
                       q_len=q_len)
    plan = DecodeAttentionPlan.select(desc, INVARIANT, device=0)
    assert plan.precision_guarantee.capture_safe
    problem = make_problem(desc, [1500] * 8, seed=6)
    args = problem.args()
    workspace = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    graph = captured_step(plan, args, workspace)
    for seed, lengths in ((7, [1, 1500, 0, CHUNK, CHUNK + 1, 900, 13, 1499]),
                          (8, [300, 0, 0, 0, 0, 0, 0, 0]), (9, [1500, 2, 3, 4, 0, 0, 0, 0])):
        fresh = load_into(problem, make_problem(desc, lengths, seed=seed))
        args.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(fresh, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("q_len", [1, 4])  # 4: the batch split on two streams
def test_a_prepared_step_replays_as_one_graph_with_the_same_bits(monkeypatch, q_len):
    """From its second call a prepared step is one CUDA graph replay (launch host time), and
    gives the bits of its direct launches."""
    from opfacade._backends.nvrtc import decode as kernels

    monkeypatch.setattr(kernels, "SPLIT_WAVES", 0)  # q_len 4 splits its batch of a few CTAs
    desc = _descriptor(Cache("paged", "nhd", 16), "bf16", 700, 5, heads_q=32, heads_kv=8,
                       head_dim=128, q_len=q_len)
    problem = make_problem(desc, [700, 0, 5, 300, 256], seed=13)
    args = problem.args()
    step = DecodeAttentionPlan.select(desc, device=0).prepare(args)
    step()
    first = (args.out.clone(), args.lse.clone())
    for _ in range(2):
        args.out.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        assert torch.equal(args.out, first[0]) and torch.equal(args.lse, first[1])
    assert step._call._exec is not None, "the step did not become a graph"


def test_split_steps_share_their_callers_side_stream_and_keep_their_bits(monkeypatch):
    """Every split call forked from one caller's stream forks onto that stream's one side stream
    (stream_fork.SIDE_STREAMS); calls from another stream fork onto their own, and run beside
    them."""
    from opfacade._backends.nvrtc import decode as kernels
    from opfacade._internal import stream_fork

    monkeypatch.setattr(kernels, "SPLIT_WAVES", 0)  # q_len 4 splits its batch of a few CTAs
    monkeypatch.setattr(stream_fork, "SIDE_STREAMS", stream_fork.BuildOnceLRU("test sides", 16))
    desc = _descriptor(Cache("contiguous"), "bf16", 700, 4, heads_q=32, heads_kv=8,
                       head_dim=128, q_len=4)
    plan = DecodeAttentionPlan.select(desc, device=0)
    problems = [make_problem(desc, lengths, seed=seed)
                for seed, lengths in ((20, [700, 3, 512, 1]), (21, [0, 699, 64, 300]))]
    args = [problem.args() for problem in problems]
    caller = torch.cuda.current_stream().cuda_stream
    plan.run(args[0])
    side = stream_fork.SIDE_STREAMS.peek((0, caller))
    assert side is not None, "the q_len 4 call did not fork"
    plan.run(args[1])  # new addresses: a call prepared again, on the same side stream
    assert stream_fork.SIDE_STREAMS.peek((0, caller)) is side
    torch.cuda.synchronize()
    for problem, call in zip(problems, args, strict=True):
        _check(problem, call, plan.precision_guarantee.max_rel_error)
    expected = [(call.out.clone(), call.lse.clone()) for call in args]
    other = torch.cuda.Stream()
    steps = [plan.prepare(args[0]), plan.prepare(args[1], stream=other)]
    for _ in range(3):  # direct launches, then graph replays, the two streams side by side
        for call in args:
            call.out.fill_(float("nan"))
        torch.cuda.synchronize()
        for step in steps:
            step()
        torch.cuda.synchronize()
        for call, (out, lse) in zip(args, expected, strict=True):
            assert torch.equal(call.out, out) and torch.equal(call.lse, lse)
    assert stream_fork.SIDE_STREAMS.peek((0, other.cuda_stream)) not in (None, side)


# A kernel that lets its programmatic dependents launch at once, spins for spin_ns, then copies
# each source buffer into its destination (int4 vectors; a pair with no vectors is skipped): a
# kernel after it that read a destination before waiting for it (as a programmatic dependent
# that skipped griddepcontrol.wait would) reads it unwritten.
LATE_WRITER = r"""
extern "C" __global__ void write_late(const int4* a_src, int4* a_dst, long long a_vectors,
                                      const int4* b_src, int4* b_dst, long long b_vectors,
                                      const int4* c_src, int4* c_dst, long long c_vectors,
                                      unsigned long long spin_ns) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < spin_ns);
    for (long long i = threadIdx.x; i < a_vectors; i += blockDim.x) a_dst[i] = a_src[i];
    for (long long i = threadIdx.x; i < b_vectors; i += blockDim.x) b_dst[i] = b_src[i];
    for (long long i = threadIdx.x; i < c_vectors; i += blockDim.x) c_dst[i] = c_src[i];
}
"""


def write_late(pairs, side=None, spin_ns: int = 20_000) -> None:
    """Launches LATE_WRITER for up to three (source, destination) tensor pairs of whole 16-byte
    vectors on the current stream, or with ``side`` on that stream, joined to the current one
    both ways (events): a multi-stream caller's order."""
    import cupy

    from opfacade._internal.streams import cupy_stream

    writer = cupy.RawModule(code=LATE_WRITER, options=("-arch=sm_90",)).get_function("write_late")
    args = []
    for source, destination in [*pairs, *[(None, None)] * (3 - len(pairs))]:
        if source is None:
            args += [np.uint64(0), np.uint64(0), np.int64(0)]
            continue
        assert source.nbytes == destination.nbytes and source.nbytes % 16 == 0
        args += [np.uint64(source.data_ptr()), np.uint64(destination.data_ptr()),
                 np.int64(source.nbytes // 16)]
    caller = torch.cuda.current_stream()
    if side is not None:
        side.wait_stream(caller)
    on = side or caller
    writer((1,), (256,), (*args, np.uint64(spin_ns)), stream=cupy_stream(on.cuda_stream, 0))
    if side is not None:
        caller.wait_stream(side)


@pytest.mark.parametrize("writer_stream", ["same", "side"])
@pytest.mark.parametrize("q_len", [1, 4])  # 4 heads a kv head: the kq tile; 16 rows: wgmma's
@pytest.mark.parametrize("cache", [Cache("paged", "nhd", 16), Cache("contiguous", "hnd")],
                         ids=lambda c: c.id)
def test_a_decode_step_waits_for_the_kernel_before_it(cache, q_len, writer_stream):
    """The partial kernel launches as a programmatic dependent of the stream's previous kernel
    (sm_90 and newer), and the merge reads seq_lens before its own wait: both must read after
    that kernel. The kernel before the step here lets it launch at once, then spends 20 us
    before writing q, the seq_lens (new lengths every round) and the page table: a step that
    read any of them early would attend with last round's query over last round's keys. The
    writer runs on the step's stream or on a side stream joined by events. The step's first
    call launches directly; then the writer and the step are captured in a CUDA graph and
    replayed 8 times. Each round's output must be bitwise what the same plan gives when run
    alone after a synchronize."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 (decode launches plainly)")
    b, cap = 8, 3 * CHUNK + 40
    desc = _descriptor(cache, "bf16", cap, b, heads_q=32, heads_kv=8, head_dim=128, q_len=q_len)
    plan = DecodeAttentionPlan.select(desc, INVARIANT, device=0)
    problem = make_problem(desc, [cap] * b, seed=40)
    args = problem.args()
    q_src, len_src = torch.empty_like(problem.q), torch.empty_like(problem.seq_lens)
    table_src = None if problem.page_table is None else torch.empty_like(problem.page_table)
    pairs = [(q_src, problem.q), (len_src, problem.seq_lens)]
    if table_src is not None:
        pairs.append((table_src, problem.page_table))
    side = torch.cuda.Stream()
    rng = np.random.default_rng(41)

    def new_round() -> None:
        lengths = rng.integers(0, cap, b, endpoint=True)
        lengths[rng.integers(b)] = cap  # one full sequence: every chunk of the cache
        len_src.copy_(torch.tensor(lengths, dtype=torch.int32))
        q_src.uniform_(-1, 1)
        if table_src is not None:  # the sequences' rows, in another order
            table_src.copy_(problem.page_table[torch.tensor(rng.permutation(b), device="cuda")])

    def write_then_step(step) -> None:
        write_late(pairs, side if writer_stream == "side" else None)
        step()

    def check() -> None:
        torch.cuda.synchronize()
        out, lse = args.out.clone(), args.lse.clone()
        args.out.fill_(float("nan"))
        plan.run(args)  # q, seq_lens and the table now hold this round's values
        torch.cuda.synchronize()
        assert torch.equal(out, args.out) and torch.equal(lse, args.lse)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step = plan.prepare(args)
        new_round()
        write_then_step(step)  # the step's first call: a direct launch
        check()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            write_then_step(step)
    for _ in range(8):
        new_round()
        graph.replay()
        check()


@pytest.mark.parametrize(("cache", "lengths", "table_fix", "argument", "message"), [
    (Cache("contiguous"), [5, 9000, 3], None, "seq_lens", r"seq_lens\[1\] = 9000"),
    (Cache("contiguous"), [5, -2, 3], None, "seq_lens", r"seq_lens\[1\] = -2"),
    (Cache("contiguous", "nhd"), [0, 5, 2], None, "seq_lens", r"seq_lens\[2\] = 2"),
    (Cache("paged", "nhd", 16), [40, 20, 3], (1, 1, 10**6), "page_table",
     r"page_table\[1, 1\] = 1000000"),
    (Cache("paged", "nhd", 16), [40, 20, 3], (2, 0, -1), "page_table", r"page_table\[2, 0\] = -1"),
])
def test_checked_mode_names_the_first_bad_entry(cache, lengths, table_fix, argument, message):
    desc = _descriptor(cache, "bf16", 512, 3, checked=True, q_len=3)
    good = [min(max(n, 3), 512) for n in lengths]
    problem = make_problem(desc, good, seed=10)
    problem.seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
    if table_fix is not None:
        s, slot, value = table_fix
        problem.page_table[s, slot] = value
    plan = DecodeAttentionPlan.select(desc, device=0)
    with pytest.raises(InvalidArgument, match=message) as raised:
        plan.run(problem.args())
    assert raised.value.argument == argument
    unchecked = DecodeAttentionPlan.select(desc.model_copy(update={"checked": False}), device=0)
    unchecked.run(problem.args())  # garbage in, but no fault (memcheck: tests/sanitize_decode.py)
    torch.cuda.synchronize()


def test_checked_mode_passes_good_data_and_refuses_bad_pointers():
    desc = _descriptor(Cache("pointers"), "f32", 300, 3, checked=True)
    problem = make_problem(desc, [300, 0, 17], seed=11)
    args = problem.args()
    DecodeAttentionPlan.select(desc, device=0).run(args)
    _check(problem, args, 5e-6)
    problem.k_cache[2] += 4  # no longer 16-byte aligned
    with pytest.raises(InvalidArgument, match=r"k_cache\[2\]") as raised:
        DecodeAttentionPlan.select(desc, device=0).run(problem.args())
    assert raised.value.argument == "k_cache"


def test_bad_input_gets_typed_errors_naming_the_argument():
    desc = _descriptor(Cache("paged", "nhd", 16), "bf16", 256, 4)
    problem = make_problem(desc, [10, 20, 30, 40], seed=12)
    plan = DecodeAttentionPlan.select(desc, device=0)
    args = problem.args()
    with pytest.raises(DTypeMismatch, match="page_table") as raised:
        plan.run(DecodeAttentionArgs(args.q, args.k_cache, args.v_cache, args.seq_lens,
                                     args.out, problem.page_table.long(), args.lse))
    assert raised.value.argument == "page_table"
    with pytest.raises(InvalidArgument, match="page_table"):
        plan.run(DecodeAttentionArgs(args.q, args.k_cache, args.v_cache, args.seq_lens,
                                     args.out, problem.page_table[:, :3], args.lse))
    with pytest.raises(DTypeMismatch, match="seq_lens"):
        plan.run(DecodeAttentionArgs(args.q, args.k_cache, args.v_cache, args.seq_lens.long(),
                                     args.out, problem.page_table, args.lse))
    misaligned = torch.empty(problem.k_cache.numel() + 8, dtype=problem.k_cache.dtype,
                             device="cuda")[1:1 + problem.k_cache.numel()].view(
                                 problem.k_cache.shape)
    with pytest.raises(LayoutMismatch, match="k_cache") as raised:
        plan.run(DecodeAttentionArgs(args.q, misaligned, args.v_cache, args.seq_lens, args.out,
                                     problem.page_table, args.lse))
    assert raised.value.argument == "k_cache"
    with pytest.raises(InvalidProblem, match="multiple of heads_kv"):
        _descriptor(Cache("contiguous"), "bf16", 64, 2, heads_q=6, heads_kv=4)
    with pytest.raises(InvalidProblem, match="q_len"):
        _descriptor(Cache("contiguous"), "bf16", 64, 2, q_len=9)
    odd = _descriptor(Cache("contiguous"), "bf16", 64, 2, head_dim=96)
    report = DecodeAttentionPlan.explain(odd, device=0)
    assert "head_dim" in str(report)


# =================================================================================================
# The cuDNN decode SKUs (decode_attention.cudnn.{f16,bf16}, _backends/cudnn/decode.py), selected
# with PlanPreference(backends={"cudnn"}): q_len 1, paged or contiguous caches, the envelope's
# whole batch. GQA is tested explicitly: cuDNN's release notes list wrong results for decode with a
# causal mask and Hq != Hkv, which these SKUs never declare.
# =================================================================================================

CUDNN = PlanPreference(backends={"cudnn"})
CUDNN_CACHES = [Cache("paged", "nhd", 16), Cache("paged", "hnd", 64), Cache("contiguous"),
                Cache("contiguous", "hnd")]


def _cudnn_problem(desc: DecodeAttentionDescriptor, lengths, seed: int) -> Problem:
    """make_problem's step under the precondition explain states for cuDNN: a cache is finite
    past each sequence's length, and so are the pages a table lists (cuDNN may weigh masked
    slots by 0, and 0 * NaN is NaN). Pages no table lists stay NaN and must never reach an
    output."""
    problem = make_problem(desc, lengths, seed=seed)
    if desc.cache == "contiguous":
        for cache in (problem.k_cache, problem.v_cache):
            cache.copy_(torch.nan_to_num(cache, nan=0.25))
        return problem
    listed = problem.page_table.flatten().long().unique()
    unlisted = torch.ones(problem.k_cache.shape[0], dtype=torch.bool, device="cuda")
    unlisted[listed] = False
    for cache in (problem.k_cache, problem.v_cache):
        cache[listed] = torch.nan_to_num(cache[listed], nan=0.25)
        assert unlisted.any() and cache[unlisted].isnan().all()
    return problem


def _cudnn_plan(desc: DecodeAttentionDescriptor) -> DecodeAttentionPlan:
    plan = DecodeAttentionPlan.select(desc, CUDNN, device=0)
    assert plan.sku.id == f"decode_attention.cudnn.{desc.element.value}"
    return plan


@pytest.mark.parametrize("element", ["f16", "bf16"])
@pytest.mark.parametrize("cache", CUDNN_CACHES, ids=[c.id for c in CUDNN_CACHES])
@pytest.mark.parametrize(("heads_q", "heads_kv"), [(32, 8), (8, 8)], ids=["gqa", "mha"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_cudnn_decode_matches_the_reference(element, cache, heads_q, heads_kv, head_dim):
    """Lengths 0, 1, inside a page, across pages, full; NaN in the pages no table lists."""
    desc = _descriptor(cache, element, 600, 6, heads_q=heads_q, heads_kv=heads_kv,
                       head_dim=head_dim)
    problem = _cudnn_problem(desc, [0, 1, 37, 257, 600, 513], seed=21)
    plan = _cudnn_plan(desc)
    assert not plan.precision_guarantee.batch_invariant
    args = problem.args()
    plan.run(args)
    _check(problem, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("cache", [Cache("paged", "hnd", 16), Cache("paged", "nhd", 64)],
                         ids=lambda c: c.id)
def test_cudnn_paged_decode_other_page_sizes_and_layouts(cache):
    desc = _descriptor(cache, "bf16", 1100, 4, heads_q=32, heads_kv=8, head_dim=128)
    problem = _cudnn_problem(desc, [1100, 0, 1, 555], seed=22)
    plan = _cudnn_plan(desc)
    args = problem.args()
    plan.run(args)
    _check(problem, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("cache", [Cache("contiguous"), Cache("paged", "nhd", 16)],
                         ids=lambda c: c.id)
@pytest.mark.parametrize(("heads_q", "heads_kv"), [(32, 1), (128, 8)], ids=["mqa", "gqa16"])
def test_cudnn_decode_of_many_query_heads_a_kv_head(cache, heads_q, heads_kv):
    """MQA and groups of 16, where the NVRTC SKU runs two or more 16-row tiles a kv head."""
    desc = _descriptor(cache, "bf16", 700, 5, heads_q=heads_q, heads_kv=heads_kv, head_dim=128)
    problem = _cudnn_problem(desc, [700, 0, 1, 333, 512], seed=31)
    plan = _cudnn_plan(desc)
    args = problem.args()
    plan.run(args)
    _check(problem, args, plan.precision_guarantee.max_rel_error)


def test_cudnn_paged_decode_without_lse_writes_out_alone():
    with_lse = _descriptor(Cache("paged", "hnd", 16), "f16", 300, 4, heads_q=16, heads_kv=4)
    desc = DecodeAttentionDescriptor(**{**with_lse.model_dump(), "save_lse": False})
    problem = _cudnn_problem(desc, [300, 0, 1, 77], seed=23)
    plan = _cudnn_plan(desc)
    full = problem.args()
    args = DecodeAttentionArgs(full.q, full.k_cache, full.v_cache, full.seq_lens, full.out,
                               full.page_table)
    plan.run(args)
    out, _ = problem.expected()
    out_mag, _ = problem.expected(forward=sdpa_forward_magnitude)
    got = args.out.double().cpu().numpy()
    assert np.isfinite(got).all() and (got[problem.lengths == 0] == 0).all()
    assert relative_error(got, out, out_mag) <= plan.precision_guarantee.max_rel_error


@pytest.mark.parametrize("cache", CUDNN_CACHES, ids=[c.id for c in CUDNN_CACHES])
def test_cudnn_one_captured_graph_replays_new_lengths_and_tables(cache):
    """Captured once at the envelope's batch (the ones of seq_len_q are a memset in the graph);
    replayed with new seq_lens and page tables written into the same buffers, and batches whose
    tail sequences are empty (length 0)."""
    desc = _descriptor(cache, "bf16", 1500, 8, heads_q=32, heads_kv=8, head_dim=128)
    plan = _cudnn_plan(desc)
    assert plan.precision_guarantee.capture_safe
    problem = _cudnn_problem(desc, [1500] * 8, seed=24)
    args = problem.args()
    workspace = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    graph = captured_step(plan, args, workspace)  # the graph for this pool built when warm
    for seed, lengths in ((25, [1, 1500, 0, 256, 257, 900, 13, 1499]),
                          (26, [300, 0, 0, 0, 0, 0, 0, 0]), (27, [1500, 2, 3, 4, 0, 0, 0, 0])):
        fresh = load_into(problem, _cudnn_problem(desc, lengths, seed=seed))
        workspace.fill_(0xFF)  # the ones must come from the replay itself
        args.out.fill_(float("nan"))
        args.lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(fresh, args, plan.precision_guarantee.max_rel_error)


@pytest.mark.parametrize("cache", [Cache("paged", "nhd", 16), Cache("contiguous", "hnd")],
                         ids=lambda c: c.id)
def test_cudnn_checked_mode_names_a_bad_page_index_and_a_bad_length(cache):
    desc = _descriptor(cache, "bf16", 512, 3, heads_q=32, heads_kv=8, head_dim=128,
                       checked=True)
    problem = _cudnn_problem(desc, [40, 20, 3], seed=28)
    plan = _cudnn_plan(desc)
    args = problem.args()
    plan.run(args)
    torch.cuda.synchronize()
    _check(problem, args, plan.precision_guarantee.max_rel_error)
    if cache.form == "paged":
        good = problem.page_table[1, 1].item()
        problem.page_table[1, 1] = 10**6
        with pytest.raises(InvalidArgument, match=r"page_table\[1, 1\] = 1000000") as raised:
            plan.run(problem.args())
        assert raised.value.argument == "page_table"
        problem.page_table[1, 1] = good
    problem.seq_lens[2] = 9000
    with pytest.raises(InvalidArgument, match=r"seq_lens\[2\] = 9000") as raised:
        plan.run(problem.args())
    assert raised.value.argument == "seq_lens"


def test_cudnn_runs_the_envelopes_batch_and_refuses_fewer_sequences():
    from opfacade.errors import ShapeMismatch

    desc = _descriptor(Cache("paged", "nhd", 16), "bf16", 256, 4, heads_q=32, heads_kv=8,
                       head_dim=128)
    plan = _cudnn_plan(desc)
    short = _cudnn_problem(desc, [10, 0, 30], seed=29)
    with pytest.raises(ShapeMismatch, match="pad the batch with seq_len 0 sequences") as raised:
        plan.run(short.args())
    assert raised.value.argument == "q"
    padded = _cudnn_problem(desc, [10, 0, 30, 0], seed=29)
    args = padded.args()
    plan.run(args)
    _check(padded, args, plan.precision_guarantee.max_rel_error)

"""The split-KV decode and kv_append kernels (native/decode_attention.cu) without a GPU: every
kernel compiles for sm_90, the launcher packs exactly the parameters each declares, grids, row
tiles and the workspace follow the envelope, and the shared memory stays under the default
48 KiB (the staged builds: their CTAs an SM fit); a float64 step-for-step model of the
algorithm is attention. tests/test_decode_attention_gpu.py runs them."""

from __future__ import annotations

import re

import pytest
from ptx import assert_packed_like_declared, kernel_parameters, kernel_ptx, kernel_sass, nvdisasm

from opfacade._backends.nvrtc import compiler, kv_cache
from opfacade._backends.nvrtc import decode as kernels
from opfacade._backends.nvrtc import launch as launching
from opfacade.contracts.decode_attention import DecodeAttentionDescriptor
from opfacade.contracts.kv_append import KvAppendDescriptor
from opfacade.errors import InvalidArgument
from opfacade.types import ArchSku, ElementKind, PlanPreference

# Compute capability 9.0 (CUDA C++ Programming Guide): shared memory an SM has, and what the
# system reserves of it for each resident CTA.
SHARED_PER_SM_SM90 = 228 << 10
RESERVED_PER_CTA = 1 << 10

ELEMENTS = ("f32", "f16", "bf16")


@pytest.fixture(scope="module")
def signatures() -> dict[str, list[str]]:
    """Every kernel of the three sources (their names do not overlap)."""
    return {**kernel_parameters(kernels.SOURCE), **kernel_parameters(kv_cache.APPEND_SOURCE),
            **kernel_parameters(kernels.WG_SOURCE)}


def test_every_kernel_compiles_for_sm90(signatures):
    for source in (kernels.SOURCE, kv_cache.APPEND_SOURCE, kernels.WG_SOURCE):
        cubin = compiler.compile_cubin(source, ArchSku.sm90, use_cache=False).cubin
        assert cubin[:4] == b"\x7fELF"
    partials = {f"decode_partial_{e}_{d}_{r}" for e in ELEMENTS for d in kernels.DIMS
                for r in kernels.TILES}
    partials |= {f"decode_partial_{e}_{d}_{kernels.MMA_TILE}{build}" for e in ("f16", "bf16")
                 for d in kernels.MMA_DIMS for build in ("", "_staged")}
    partials |= {f"decode_partial_{e}_{d}_{kernels.TILES[0]}_spans" for e in ELEMENTS
                 for d in kernels.DIMS}
    partials |= {f"decode_partial_{e}_{d}_{rows}kq_{build}" for e in ("f16", "bf16")
                 for d in kernels.KQ_DIMS for rows in (kernels.KQ_LINE_ROWS, kernels.KQ_ROWS)
                 for build in ("b3", "b4", "d4")}
    partials |= {f"decode_partial_{e}_{d}_{rows}wg{build}" for e in ("f16", "bf16")
                 for d in kernels.WG_DIMS for rows in kernels.WG_STAGES
                 for build in ("", "_spans")}
    merges = {f"decode_merge_{e}_{threads}" for e in ELEMENTS
              for _, threads in kernels.MERGE_THREADS}
    merges |= {f"decode_merge_{e}_rows" for e in ELEMENTS}
    appends = set(kv_cache.append_kernel_names(map(ElementKind, ELEMENTS)))
    assert set(signatures) == partials | merges | appends | {"kv_cache_check"}
    for element in (ElementKind.f32, ElementKind.bf16):
        for dim in kernels.DIMS:
            for rows in kernels.TILES:
                assert kernels.shared_bytes(element, dim, kernels.Tile(rows)) <= 48 << 10
    for dim in kernels.MMA_DIMS:
        tile = kernels.Tile(kernels.MMA_TILE, "mma")
        assert kernels.shared_bytes(ElementKind.bf16, dim, tile) <= 48 << 10
        staged = kernels.shared_bytes(ElementKind.bf16, dim, tile, "_staged")
        assert 3 * staged <= SHARED_PER_SM_SM90 - 3 * RESERVED_PER_CTA  # its 3 CTAs an SM fit
    for dim in kernels.KQ_DIMS:
        for rows in (kernels.KQ_LINE_ROWS, kernels.KQ_ROWS):
            tile = kernels.Tile(rows, "kq")
            assert kernels.shared_bytes(ElementKind.bf16, dim, tile) <= 48 << 10
    for dim in kernels.WG_DIMS:  # __launch_bounds__(128, 2): its 2 CTAs an SM fit
        for rows in kernels.WG_STAGES:
            wg = kernels.shared_bytes(ElementKind.bf16, dim, kernels.Tile(rows, "wg"))
            assert 2 * wg <= SHARED_PER_SM_SM90 - 2 * RESERVED_PER_CTA


def _record(monkeypatch) -> list[tuple]:
    """Launches as (kernel name, grid, block, args, shared bytes, overlaps the previous
    kernel), in the order they run, on an sm_90 device."""
    from opfacade.types import ArchSku

    launched = []

    def record(kernel, grid, block, args, stream, device, shared=0, overlap_previous=False):
        launched.append((kernel, grid, block, args, shared, overlap_previous))

    monkeypatch.setattr(kernels, "device_arch", lambda device: ArchSku.sm90)
    monkeypatch.setattr(launching, "device_arch", lambda device: ArchSku.sm90)  # programmatic
    # An H100's 132 multiprocessors, five partial CTAs each.
    monkeypatch.setattr(kernels, "device_sm_count", lambda device: 132)
    monkeypatch.setattr(kernels, "resident_blocks", lambda function, threads, shared, device: 5)
    monkeypatch.setattr(kernels, "get_kernel", lambda source, name, device: name)
    monkeypatch.setattr(kernels, "allow_shared", lambda kernel, name, device, shared: kernel)
    monkeypatch.setattr(kernels, "launcher", lambda *a, **k: lambda: record(*a, **k))
    monkeypatch.setattr(kernels, "steps", lambda make, stream, device: lambda: [
        launch() for launch in make(stream)])
    # kv_append and the checked mode's kernel (kv_cache.py).
    monkeypatch.setattr(kv_cache, "get_kernel", lambda source, name, device: name)
    monkeypatch.setattr(kv_cache, "launch", record)
    monkeypatch.setattr(kv_cache, "PackedLaunch", lambda *a, **k: lambda: record(*a, **k))
    monkeypatch.setattr(kv_cache, "GraphedLaunches", lambda make, stream, device: lambda: [
        launch() for launch in make(stream)])
    # A split batch's second half runs on stream 0x5ide, between a fork and a join.
    monkeypatch.setattr(kernels, "forked", lambda on, device: (0x51DE, [
        lambda: launched.append(("fork", on))], [lambda: launched.append(("join", on))]))
    return launched


def test_no_merge_reads_a_partial_on_the_non_coherent_path():
    """A merge kernel launches while the partial kernel runs (programmatic dependent launch) and
    waits in the kernel (griddepcontrol.wait) before it reads a partial. A partial read on the
    non-coherent path (ld.global.nc, from a const __restrict__ pointer) is a load the compiler
    may treat as invariant: ptxas hoisted such loads of a rows merge above the wait (nvdisasm,
    thirty-second session), and it merged stale partials on an H200. The wait itself is kept."""
    merges = {name: body for name, (_, body) in kernel_ptx(kernels.SOURCE).items()
              if name.startswith("decode_merge_")}
    assert len(merges) == len(ELEMENTS) * (len(kernels.MERGE_THREADS) + 1)  # and the rows merge
    for name, body in merges.items():
        assert "griddepcontrol.wait" in body, name
        assert not re.findall(r"ld\.global\.nc\S*\.f32", body), name


@pytest.mark.parametrize(("page_size", "form"), [(16, "paged16"), (32, "paged32"),
                                               (64, "paged64"), (24, "paged"), (1, "paged"),
                                               (256, "paged")])
def test_kv_append_takes_the_kernel_with_its_page_size_compiled_in(page_size, form):
    cache = kv_cache.DecodeCache("paged", True, 4096, 8, 128, 128, page_size,
                                 4096 // page_size + 1, 100)
    assert kv_cache.append_kernel(ElementKind.f16, cache) == f"kv_append_f16_{form}_hnd"
    contiguous = kv_cache.DecodeCache("contiguous", False, 4096, 8, 128, 128)
    assert kv_cache.append_kernel(ElementKind.bf16, contiguous) == "kv_append_bf16_contiguous_nhd"
    names = kv_cache.append_kernel_names(map(ElementKind, ELEMENTS))
    assert kv_cache.append_kernel(ElementKind.f32, cache) in names


@pytest.mark.skipif(nvdisasm() is None, reason="needs nvdisasm (nvidia-cuda-nvdisasm)")
def test_kv_append_loads_the_token_before_testing_its_length():
    """kv_append's store waits on the token's 16 bytes and on its position (from the length, and
    for a paged cache the table): the token's load must be in flight while the length's is, not
    issued after a test of the length. Written with early returns, ptxas placed it after the
    test's EXIT (nvdisasm, forty-ninth session), so the kernel waited on the two loads one after
    the other; the store is now predicated. No EXIT may lie between the kernel's first global
    load and the token's (the 128-bit one)."""
    appends = {name: sass for name, sass in kernel_sass(kv_cache.APPEND_SOURCE).items()
               if name.startswith("kv_append_")}
    assert sorted(appends) == sorted(kv_cache.append_kernel_names(map(ElementKind, ELEMENTS)))
    for name, sass in appends.items():
        loads = [i for i, op in enumerate(sass) if re.match(r"LDG\b", op)]
        token = next(i for i in loads if re.match(r"LDG\S*\.128\b", sass[i]))
        between = sass[loads[0]:token]
        assert not [op for op in between if re.search(r"\bEXIT\b|\bBRA\b", op)], (name, between)


def _followers(source: str) -> set[str]:
    """The kernels of ``source`` that launch as programmatic dependents of the stream's previous
    kernel: kv_append's, and every decode partial kernel."""
    if source == kv_cache.APPEND_SOURCE:
        return set(kv_cache.append_kernel_names(map(ElementKind, ELEMENTS)))
    return {name for name in kernel_parameters(source) if name.startswith("decode_partial_")}


@pytest.mark.skipif(nvdisasm() is None, reason="needs nvdisasm (nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("source", [kv_cache.APPEND_SOURCE, kernels.SOURCE, kernels.WG_SOURCE])
def test_a_follower_waits_for_the_previous_kernel_before_touching_memory(source):
    """kv_append and the decode partial kernels launch as programmatic dependents of the
    stream's previous kernel, which may still be writing their inputs (q, k_new, seq_lens, the
    table, the caches) or reading what they write: no global load, copy or store may come
    before the kernel's griddepcontrol.wait (SASS ACQBULK). ptxas has hoisted non-coherent
    loads above that wait before (test_no_merge_reads_a_partial_...), and these kernels' inputs
    are const __restrict__. The next kernel (the merge, or whatever follows kv_append) may
    launch once the kernel has waited (PREEXIT, griddepcontrol.launch_dependents, after
    ACQBULK): the merge reads seq_lens before its own wait, sound only in that order."""
    expected = _followers(source)
    followers = {name: sass for name, sass in kernel_sass(source).items() if name in expected}
    assert sorted(followers) == sorted(expected)
    for name, sass in followers.items():
        [wait] = [i for i, op in enumerate(sass) if op.startswith("ACQBULK")]
        [let_go] = [i for i, op in enumerate(sass) if op.startswith("PREEXIT")]
        memory = [i for i, op in enumerate(sass)
                  if re.match(r"(LDG|LDGSTS|STG|ATOM|RED|LD|ST|UTMALDG|UBLKCP)\b", op)]
        assert wait < let_go < memory[0], (name, sass[:memory[0] + 1])


@pytest.mark.parametrize("element", [ElementKind.f32, ElementKind.f16, ElementKind.bf16])
def test_a_paged_step_packs_each_kernels_parameters(monkeypatch, signatures, element):
    launched = _record(monkeypatch)
    monkeypatch.setattr(kernels, "SPLIT_TILES", ())  # the whole batch in one grid (split: below)
    desc = DecodeAttentionDescriptor(batch=8, heads_q=32, heads_kv=8, head_dim=128,
                                     element=element, cache="paged", page_size=16,
                                     max_pages=64, q_len=4, save_lse=True)
    cache = kv_cache.DecodeCache.of(desc, pages=600)
    strides = (4 * 32 * 128, 32 * 128, 128)
    kernels.decode_call(element, 0, cache, 5, 32, 4, 0.088, None, 0x1000, strides, 0x2000,
                        0x3000, 0x4000, 0x5000, 0x6000, strides, 0x7000, 0x100000, 7)()
    kv_cache.append_call(element, 0, cache, 5, 4, 0x8000, (4 * 8 * 128, 8 * 128, 128), 0x9000,
                        (4 * 8 * 128, 8 * 128, 128), 0x2000, 0x3000, 0x4000, 0x5000, 7)()
    names = [name for name, *_ in launched]
    # 16 rows (4 heads x 4 tokens): one wgmma tile for the half types (an sm_90 device), two
    # of 8 for f32.
    tile = kernels.Tile(8) if element == ElementKind.f32 else kernels.Tile(16, "wg")
    assert names == [tile.kernel(element, 128),
                     f"decode_merge_{element.value}_rows",
                     f"kv_append_{element.value}_paged16_nhd"]
    per_head = 128 * element.itemsize // 16  # 16 bytes a thread of a head's key (or value)
    blocks = {"merge": (kernels.ROWS_THREADS,), "partial": (kernels.THREADS,),
              "kv_append": (per_head, min(8, 1024 // per_head))}
    for name, _, block, args, *_ in launched:
        assert block == next(b for part, b in blocks.items() if part in name)
        assert_packed_like_declared(name, args, signatures)
    # 8 kv heads x 16 rows' tiles; 1024 tokens in chunks.
    assert launched[0][1] == (8 * (16 // tile.rows), 1024 // kernels.CHUNK, 5)
    assert launched[0][4] == kernels.shared_bytes(element, 128, tile)
    # The rows merge (in place of the 64-thread one, up to 16 chunks): 5 x 32 x 4 rows, 4 a CTA
    # at Dv 128.
    assert launched[1][1] == (5 * 32 * 4 // 4, 1, 1)
    # Each launches while the kernel before it ends: the partial kernel the stream's previous
    # one, the merge the partial kernel, kv_append the merge.
    assert [overlaps for *_, overlaps in launched] == [True, True, True]
    # A CTA per (sequence, new token, group of kv heads, key or value): 8 heads fit 1024
    # threads at d 128.
    assert launched[2][1] == (5, 4, 2)


@pytest.mark.parametrize(("form", "layout"), [("contiguous", "nhd"), ("contiguous", "hnd"),
                                            ("paged", "nhd"), ("pointers", "nhd")])
def test_a_split_batch_runs_each_half_from_its_own_sequences(monkeypatch, signatures, form,
                                                             layout):
    """Kv heads of the 16-row tile run the batch as two halves (decode.splits_batch): the first
    on the caller's stream, the second on a forked one, each a partial grid and its merge whose
    pointers start at the half's first sequence and whose partials lie apart in the
    workspace."""
    launched, streams = _record(monkeypatch), []
    monkeypatch.setattr(kernels, "SPLIT_WAVES", 0)  # a grid of any waves splits here
    recording = kernels.launcher
    monkeypatch.setattr(kernels, "launcher", lambda function, grid, block, args, stream, *a, **k: (
        streams.append(stream), recording(function, grid, block, args, stream, *a, **k))[1])
    where = dict(page_size=16, max_pages=64) if form == "paged" else dict(max_seq=1024)
    desc = DecodeAttentionDescriptor(batch=8, heads_q=32, heads_kv=8, head_dim=128,
                                     element="bf16", cache=form, kv_layout=layout, q_len=4,
                                     save_lse=True, **where)
    cache = kv_cache.DecodeCache.of(desc, pages=600)
    strides = (4 * 32 * 128, 32 * 128, 128)
    workspace = 0x100000
    kernels.decode_call(ElementKind.bf16, 0, cache, 5, 32, 4, 0.088, None, 0x1000, strides,
                        0x2000, 0x3000, 0x4000 if form == "paged" else 0, 0x5000, 0x6000,
                        strides, 0x7000, workspace, 7)()
    names = [entry[0] for entry in launched]
    partial, merge = "decode_partial_bf16_128_16wg", "decode_merge_bf16_rows"
    assert names == ["fork", partial, merge, partial, merge, "join"]
    assert streams == [7, 7, 0x51DE, 0x51DE]
    (_, grid_a, _, first, *_), (_, _, _, first_merge, *_) = launched[1], launched[2]
    (_, grid_b, _, second, *_), (_, _, _, second_merge, *_) = launched[3], launched[4]
    for name, args in ((partial, first), (merge, first_merge), (partial, second),
                       (merge, second_merge)):
        assert_packed_like_declared(name, args, signatures)
    assert (grid_a[2], grid_b[2]) == (3, 2)  # sequences 0-2, then 3-4
    moved = lambda a, b: int(b) - int(a)  # noqa: E731
    # The partial's q, k, v, table, seq_lens and partials (acc, then (m, l)).
    row = {"contiguous": 1024 * 8 * 128 * 2, "paged": 0, "pointers": 8}[form]
    assert [moved(first[i], second[i]) for i in (0, 4, 5, 6, 16)] == [
        3 * strides[0] * 2, 3 * row, 3 * row, 3 * 64 * 4 if form == "paged" else 0, 3 * 4]
    partials = kernels.workspace_bytes(3, 32, 4, 1024, 128, halves=False)
    assert moved(first[17], second[17]) == partials and int(first[17]) == workspace
    # The merge's out and lse; its partials are the partial kernel's.
    assert moved(first_merge[0], second_merge[0]) == 3 * strides[0] * 2
    assert moved(first_merge[4], second_merge[4]) == 3 * 4 * 32 * 4
    assert (second_merge[5], second_merge[6]) == (second[17], second[18])
    # The second half's (m, l) end inside the envelope's workspace.
    rows = 2 * 32 * 4 * kernels.chunks(1024)
    assert int(second[18]) + rows * 2 * 4 <= workspace + kernels.workspace_bytes(8, 32, 4, 1024,
                                                                                  128)


@pytest.mark.parametrize(("rows", "element", "sequences", "waves", "split"), [
    (16, "bf16", 64, 10.3, True), (16, "bf16", 64, 8, True), (16, "bf16", 32, 5.2, False),
    (16, "bf16", 1, 20, False), (4, "bf16", 64, 20, False), (16, "f32", 64, 20, False)])
def test_only_the_16_row_tiles_batches_of_many_waves_split(rows, element, sequences, waves,
                                                          split):
    """B64 S4096 q_len 4 is 10.3 waves of the 16-row tile on an H200, B32 5.2 (where the
    halves lost: decode.SPLIT_WAVES)."""
    tile = kernels.row_tile(rows, ElementKind(element), 128)
    assert kernels.splits_batch(tile, sequences, round(waves * 396), lambda: 396) == split


def test_the_wgmma_tiles_batches_split_at_any_grid():
    """decode.SPLIT_WAVES_WG: the wgmma tile's batches of two sequences or more split whatever
    their waves, as they did while the occupancy query answered 0 for it."""
    tile = kernels.Tile(kernels.WG_TILE, "wg")
    assert kernels.splits_batch(tile, 2, 100, lambda: 264)
    assert not kernels.splits_batch(tile, 1, 10_000, lambda: 264)


@pytest.mark.parametrize(("rows", "n_chunks", "windowed", "waves", "span"), [
    (32, 64, False, 15.5, 4), (32, 16, False, 4, 4), (32, 64, True, 15.5, 1),
    (32, 8, False, 15.5, 1), (32, 64, False, 3.9, 1), (16, 64, False, 15.5, 1)])
def test_the_32_row_tile_runs_spans_without_a_window_on_long_caches_of_many_waves(
        rows, n_chunks, windowed, waves, span):
    """decode.wg_span: MQA B64 S32768 (64 chunks, 15.5 waves of one-chunk CTAs on an H200) runs
    4 chunks a CTA; a window, caches of 8 chunks, grids of a few waves and the 16-row tile, one."""
    assert kernels.wg_span(rows, n_chunks, windowed, round(waves * 264), 264) == span


def test_the_check_kernel_gets_its_parameters(monkeypatch, signatures):
    pytest.importorskip("cupy")
    launched = _record(monkeypatch)
    monkeypatch.setattr("cupy.zeros", lambda *a, **k: type("V", (), {"data": type(
        "P", (), {"ptr": 0x42})()})())
    desc = DecodeAttentionDescriptor(batch=8, heads_q=8, heads_kv=8, head_dim=64,
                                     element="f16", cache="pointers", max_seq=100)
    cache = kv_cache.DecodeCache.of(desc)
    monkeypatch.setattr("cupy.cuda.Device", lambda device: __import__("contextlib").nullcontext())
    call = kv_cache.check_call(0, cache, 8, 1, 0x10, 0x20, 0, 0x30, 0, lambda: None)
    import ctypes

    import numpy as np

    passed = np.array([-1, 0, 0, 0], np.int32)  # the verdict of a clean check
    monkeypatch.setattr("cupy.cuda.runtime.memcpyAsync", lambda dst, src, size, kind, stream:
                        ctypes.memmove(dst, passed.ctypes.data, size))
    monkeypatch.setattr("cupy.cuda.runtime.streamSynchronize", lambda *a: None)
    call()
    name, grid, block, args, *_ = launched[0]
    assert (name, grid, block) == ("kv_cache_check", (1,), (kv_cache.CHECK_THREADS,))
    assert_packed_like_declared(name, args, signatures)


@pytest.mark.parametrize(("rows", "element", "dim", "tile", "tiles"), [
    # up to 8 rows of the half types at d 128: the kq tile, its 4-row build up to 4
    (1, "bf16", 128, (4, "kq"), 1), (4, "f16", 128, (4, "kq"), 1), (5, "bf16", 128, (8, "kq"), 1),
    (8, "f16", 128, (8, "kq"), 1),
    (4, "f32", 64, (4, "cuda"), 1), (4, "bf16", 64, (4, "cuda"), 1),
    (5, "f16", 256, (8, "cuda"), 1), (5, "bf16", 64, (16, "mma"), 1),
    (8, "f32", 64, (8, "cuda"), 1), (16, "f16", 64, (16, "mma"), 1),
    (9, "bf16", 128, (16, "mma"), 1), (64, "bf16", 128, (16, "mma"), 4),
    # no tensor-core tile for f32 (its math stays f32) or d 256: tiles of 8
    (16, "f32", 128, (8, "cuda"), 2), (64, "bf16", 256, (8, "cuda"), 8)])
def test_row_tiles_follow_the_descriptor_alone(rows, element, dim, tile, tiles):
    assert kernels.row_tile(rows, ElementKind(element), dim) == kernels.Tile(*tile)
    assert -(-rows // tile[0]) == tiles


@pytest.mark.parametrize(("rows", "element", "dim", "tile"), [
    (4, "bf16", 128, (4, "kq")), (8, "bf16", 128, (8, "kq")), (9, "bf16", 128, (16, "wg")),
    (16, "f16", 128, (16, "wg")),
    (17, "bf16", 128, (32, "wg")), (32, "f16", 128, (32, "wg")), (64, "bf16", 128, (32, "wg")),
    (16, "bf16", 64, (16, "mma")), (5, "f16", 64, (16, "mma")),
    (4, "bf16", 64, (4, "cuda")), (16, "f32", 128, (8, "cuda")), (16, "bf16", 256, (8, "cuda"))])
def test_sm90_devices_put_kv_heads_of_more_than_8_rows_at_d128_on_the_wgmma_tiles(
        rows, element, dim, tile):
    assert kernels.row_tile(rows, ElementKind(element), dim, wgmma=True) == kernels.Tile(*tile)
    assert kernels.Tile(*tile).source == (kernels.WG_SOURCE if tile[1] == "wg"
                                          else kernels.SOURCE)


@pytest.mark.parametrize(("capacity", "dim", "merge", "grid"), [
    (2048, 64, "rows", (-(-3 * 24 * 2 // 8), 1, 1)),  # 4 chunks: rows, 8 a CTA at Dv 64
    (1500, 256, "rows", (3 * 24 * 2 // 2, 1, 1)),  # 2 rows a CTA at Dv 256
    (2049, 128, "64", (3, 24, 2)),  # 5 chunks: the 64-thread merge itself
    (8193, 128, "256", (3, 24, 2))])  # 17 chunks: 256 threads
def test_short_caches_merge_in_rows(monkeypatch, capacity, dim, merge, grid):
    """Caches of up to 4 chunks take the rows merge (the 64-thread merge's sums), several
    rows a CTA; longer ones a CTA a row (sequence, query head, new token)."""
    launched = _record(monkeypatch)
    monkeypatch.setattr(kernels, "SPLIT_TILES", ())
    desc = DecodeAttentionDescriptor(batch=3, heads_q=24, heads_kv=8, head_dim=dim,
                                     element="bf16", cache="contiguous", max_seq=capacity,
                                     q_len=2)
    kernels.decode_call(ElementKind.bf16, 0, kv_cache.DecodeCache.of(desc), 3, 24, 2, 0.1, None,
                        0x1000, (0, 0, 0), 0x2000, 0x3000, 0, 0x5000, 0x6000, (0, 0, 0), None,
                        0x100000, 0)()
    name, merge_grid, block, *_ = launched[1]
    assert name == f"decode_merge_bf16_{merge}" and merge_grid == grid
    assert block == ((kernels.ROWS_THREADS,) if merge == "rows" else (int(merge),))
    monkeypatch.setattr(kernels, "MERGE_ROWS", False)  # the 64-thread merge it stands for
    kernels.decode_call(ElementKind.bf16, 0, kv_cache.DecodeCache.of(desc), 3, 24, 2, 0.1, None,
                        0x1000, (0, 0, 0), 0x2000, 0x3000, 0, 0x5000, 0x6000, (0, 0, 0), None,
                        0x100000, 0)()
    assert launched[3][0] == f"decode_merge_bf16_{'64' if merge == 'rows' else merge}"


def test_groups_wider_than_a_tile_take_several_tiles(monkeypatch):
    launched = _record(monkeypatch)
    monkeypatch.setattr(kernels, "SPLIT_TILES", ())
    desc = DecodeAttentionDescriptor(batch=2, heads_q=32, heads_kv=1, head_dim=64,
                                     element="bf16", cache="contiguous", max_seq=600, q_len=2)
    kernels.decode_call(ElementKind.bf16, 0, kv_cache.DecodeCache.of(desc), 2, 32, 2, 0.125, 16,
                        0x1000, (0, 0, 0), 0x2000, 0x3000, 0, 0x5000, 0x6000, (0, 0, 0), None,
                        0x100000, 0)()
    assert launched[0][1] == (1 * 4, 2, 2)  # 64 rows in tiles of 16; 600 tokens in 2 chunks
    assert launched[0][3][-1] == 16  # the window's left side


def test_the_workspace_holds_every_partial_of_the_envelope():
    size = kernels.workspace_bytes(batch=64, heads_q=32, q_len=1, capacity=4096, dim_v=128)
    rows = 64 * 32 * kernels.chunks(4096)  # sequences x query heads x chunks
    assert size >= rows * (128 + 2) * 4 and size % 256 == 0
    append = KvAppendDescriptor(batch=2, heads_kv=2, head_dim=64, element="f16",
                                cache="pointers", max_seq=100, kv_layout="hnd")
    cache = kv_cache.DecodeCache.of(append)
    assert (cache.kind, cache.hnd, cache.capacity, cache.page_size) == ("pointers", True, 100, 0)


@pytest.mark.parametrize(("verdict", "argument", "text"), [
    ((3, 1, 0, 5000), "seq_lens",
     "seq_lens\\[3\\] = 5000 must be 0 or within \\[q_len, capacity\\] = \\[2, 1024\\]"),
    ((0, 2, 7, 999), "page_table", "page_table\\[0, 7\\] = 999 must be a page of the pool, "
                                   "within \\[0, 600\\)"),
    ((5, 3, 0, 0), "k_cache", "k_cache\\[5\\] must be a non-null, 16-byte aligned"),
])
def test_a_verdict_becomes_an_error_naming_the_argument(verdict, argument, text):
    import numpy as np

    desc = DecodeAttentionDescriptor(batch=8, heads_q=8, heads_kv=8, head_dim=64, q_len=2,
                                     element="f16", cache="paged", page_size=16, max_pages=64)
    error = kv_cache.verdict_error(np.array(verdict), kv_cache.DecodeCache.of(desc, 600), 2)
    assert isinstance(error, InvalidArgument) and error.argument == argument
    with pytest.raises(InvalidArgument, match=text):
        raise error


def _split_kv(q, keys, values, length, q_len, scale, left):
    """decode_partial then decode_merge for one sequence and one query head, step for step in
    float64: the kernels' algorithm (chunks of CHUNK keys, masks by position, merge in chunk
    order), to hold against the reference."""
    import numpy as np

    n = -(-length // kernels.CHUNK)
    partials = []
    for chunk in range(n):
        k0 = chunk * kernels.CHUNK
        p = np.arange(k0, min(k0 + kernels.CHUNK, length))
        rows = []
        for t in range(q_len):
            pos = length - q_len + t
            seen = (p <= pos) & ((left < 0) | (p >= pos - left))
            s = np.where(seen, keys[p] @ q[t] * scale, -np.inf)
            m = s.max(initial=-np.inf)
            e = np.exp(s - (0.0 if m == -np.inf else m))
            rows.append((m, e.sum(), e @ values[p]))
        partials.append(rows)
    out, lse = [], []
    for t in range(q_len):
        if length - q_len + t < 0 or n == 0:
            out.append(np.zeros(values.shape[1]))
            lse.append(-np.inf)
            continue
        m = max(part[t][0] for part in partials)
        weights = [np.exp(part[t][0] - m) for part in partials]
        total = sum(w * part[t][1] for w, part in zip(weights, partials, strict=True))
        acc = sum(w * part[t][2] for w, part in zip(weights, partials, strict=True))
        out.append(acc / total)
        lse.append(m + np.log(total))
    return np.array(out), np.array(lse)


@pytest.mark.parametrize(("length", "q_len", "left"), [
    (700, 1, -1), (700, 4, -1), (256, 3, -1), (2, 4, -1), (0, 1, -1), (600, 2, 300),
    (513, 1, 10), (1100, 2, -1)])
def test_the_split_kv_algorithm_is_attention(length, q_len, left):
    import numpy as np

    from opfacade._backends.reference import sdpa_forward

    rng = np.random.default_rng(length + q_len)
    d = 16
    q = rng.standard_normal((q_len, d))
    keys, values = rng.standard_normal((max(length, 1), d)), rng.standard_normal((max(length, 1),
                                                                                     d))
    out, lse = _split_kv(q, keys, values, length, q_len, d ** -0.5, left)
    window = None if left < 0 else (left, None)
    want, want_lse = sdpa_forward(q[None, None], keys[None, None, :length],
                                  values[None, None, :length], causal="bottom_right",
                                  window=window)
    np.testing.assert_allclose(out, want[0, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse[0, 0], rtol=1e-12)


def _value(argument):
    """An argument of a bare driver function as the C side sees it: a ctypes object's value
    (a NULL c_void_p's None as 0), None as 0."""
    if argument is None:
        return 0
    return argument.value or 0


def test_a_packed_launch_is_one_driver_call_and_a_failure_is_typed(monkeypatch):
    """PackedLaunch packs the parameters once (each pointer in kernelParams reads the value it
    was given) and calls the driver once per launch; a failure retried under the device's
    context and failing again is LaunchFailed, never a silent skip."""
    import contextlib
    import ctypes

    import numpy as np

    from opfacade._backends.nvrtc import launch as launching
    from opfacade.errors import LaunchFailed

    calls, statuses = [], [0]

    def driver(*arguments):  # bare: ctypes objects made once (launch._made_once)
        function, gx, gy, gz, bx, by, bz, shared, stream, params, extra = map(_value, arguments)
        pointers = (ctypes.c_void_p * 3).from_address(params)
        calls.append((function, (gx, gy, gz), (bx, by, bz), shared, stream,
                      ctypes.c_uint64.from_address(pointers[0]).value,
                      ctypes.c_int32.from_address(pointers[1]).value,
                      ctypes.c_float.from_address(pointers[2]).value))
        return statuses.pop(0) if statuses else 700

    monkeypatch.setattr(launching, "_driver_launch", lambda: driver)
    monkeypatch.setattr("cupy.cuda.Device", lambda device: contextlib.nullcontext())
    function = type("F", (), {"ptr": 0xF00})()
    packed = launching.PackedLaunch(function, (3, 2), (128,), (np.uint64(0xABC), np.int32(-7),
                                    np.float32(0.5)), 0x5, 0, 1024)
    packed()
    assert calls == [(0xF00, (3, 2, 1), (128, 1, 1), 1024, 0x5, 0xABC, -7, 0.5)]
    with pytest.raises(LaunchFailed, match="CUresult 700"):
        packed()
    assert len(calls) == 3  # the failure was retried once


def test_an_overlapping_launch_passes_the_programmatic_serialization_attribute(monkeypatch):
    """overlap_previous launches through cuLaunchKernelEx with cuda.h's CUlaunchConfig: the grid,
    block, shared bytes and stream as given, and one attribute, programmatic stream
    serialization (id 6) allowed; the parameters are packed as for a plain launch."""
    import ctypes

    import numpy as np

    from opfacade._backends.nvrtc import launch as launching

    calls = []

    def driver_ex(*arguments):
        config, function, params, extra = map(_value, arguments)
        raw = (ctypes.c_uint * 7).from_address(config)
        stream, attributes = (ctypes.c_uint64 * 2).from_address(config + 32)
        count = ctypes.c_uint.from_address(config + 48).value
        attribute_id = ctypes.c_int.from_address(attributes).value
        allowed = ctypes.c_int.from_address(attributes + 8).value
        pointers = (ctypes.c_void_p * 2).from_address(params)
        calls.append((function, tuple(raw), stream, count, attribute_id, allowed,
                      ctypes.c_uint64.from_address(pointers[0]).value,
                      ctypes.c_int32.from_address(pointers[1]).value))
        return 0

    def plain(*args):
        raise AssertionError("an overlapping launch went through cuLaunchKernel")

    monkeypatch.setattr(launching, "_driver_launch_ex", lambda: driver_ex)
    monkeypatch.setattr(launching, "_driver_launch", lambda: plain)
    function = type("F", (), {"ptr": 0xF00})()
    packed = launching.PackedLaunch(function, (3, 2), (64,), (np.uint64(0xABC), np.int32(-7)),
                                    0x5, 0, 256, overlap_previous=True)
    packed()
    assert ctypes.sizeof(launching._LaunchAttribute) == 72
    assert ctypes.sizeof(launching._LaunchConfig) == 56
    assert calls == [(0xF00, (3, 2, 1, 64, 1, 1, 256), 0x5, 1, 6, 1, 0xABC, -7)]


def test_the_merge_overlaps_the_partial_kernel_from_sm90_only(monkeypatch):
    for arch, overlaps in ((ArchSku.sm80, False), (ArchSku.sm89, False), (ArchSku.sm90, True),
                           (ArchSku.sm100, True)):
        monkeypatch.setattr(launching, "device_arch", lambda device, arch=arch: arch)
        assert kernels.overlaps_merge(0) is overlaps
        assert kernels.partial_follows_previous(0) is overlaps
    monkeypatch.setattr(kernels, "OVERLAP_MERGE", False)
    assert kernels.overlaps_merge(0) is False
    monkeypatch.setattr(kernels, "PARTIAL_FOLLOWS_PREVIOUS", False)
    assert kernels.partial_follows_previous(0) is False


@pytest.mark.parametrize(("arch", "switch", "follows"), [
    (ArchSku.sm80, True, False), (ArchSku.sm89, True, False), (ArchSku.sm90, True, True),
    (ArchSku.sm100, True, True), (ArchSku.sm90, False, False)])
def test_kv_append_follows_the_previous_kernel_from_sm90_only(monkeypatch, arch, switch,
                                                               follows):
    """On sm_90 and newer kv_append launches as a programmatic dependent of the stream's previous
    kernel (its launch may overlap that kernel's end), unless APPEND_FOLLOWS_PREVIOUS is off."""
    launched = _record(monkeypatch)
    monkeypatch.setattr(launching, "device_arch", lambda device: arch)
    monkeypatch.setattr(kv_cache, "APPEND_FOLLOWS_PREVIOUS", switch)
    cache = kv_cache.DecodeCache("paged", False, 4096, 8, 128, 128, 16, 256, 512)
    kv_cache.append_call(ElementKind.bf16, 0, cache, 4, 1, 0x1000, (8192, 1024, 128), 0x2000,
                         (8192, 1024, 128), 0x3000, 0x4000, 0x5000, 0x6000, 0x7)()
    [(kernel, grid, block, args, shared, overlap)] = launched
    assert kernel == "kv_append_bf16_paged16_nhd" and overlap is follows


def test_a_capacity_past_the_kernels_int_positions_is_unfit():
    from opfacade import DecodeAttentionPlan, KvAppendDescriptor, KvAppendPlan

    wide = dict(batch=2, heads_kv=2, head_dim=64, element="bf16", cache="paged", page_size=2,
                max_pages=2**30)
    report = DecodeAttentionPlan.explain(DecodeAttentionDescriptor(**wide, heads_q=2),
                                         arch="sm90")
    assert "capacity" in str(report) and "decode_attention.nvrtc.bf16" in str(report)
    with pytest.raises(Exception, match="capacity"):
        DecodeAttentionPlan.select(DecodeAttentionDescriptor(**wide, heads_q=2),
                                   PlanPreference(backends={"nvrtc"}), arch="sm90")
    with pytest.raises(Exception, match="capacity"):
        KvAppendPlan.select(KvAppendDescriptor(**wide), arch="sm90")


def test_the_merge_threads_follow_the_capacity_alone():
    assert kernels.merge_threads_for(1) == kernels.merge_threads_for(16) == 64
    assert kernels.merge_threads_for(17) == kernels.merge_threads_for(32) == 256
    assert kernels.merge_threads_for(33) == kernels.merge_threads_for(64) == 512
    assert kernels.merge_threads_for(65) == kernels.merge_threads_for(4096) == 1024


def test_spans_turn_a_grid_of_a_few_waves_into_one():
    assert kernels.span_for(600, 660) == 1
    assert kernels.span_for(1024, 660) == 2  # B2 S32768, H32/8: 1.55 waves
    assert kernels.span_for(2048, 660) == 4
    assert kernels.span_for(8192, 660) == 1  # many waves: their CTAs' starts spread out


@pytest.mark.parametrize("batch, chunks_per_cta", [(1, 1), (2, 2), (16, 1)])
def test_a_cuda_core_partial_runs_its_span_of_chunks(monkeypatch, signatures, batch,
                                                     chunks_per_cta):
    launched = _record(monkeypatch)
    desc = DecodeAttentionDescriptor(batch=batch, heads_q=32, heads_kv=8, head_dim=64,
                                     element="bf16", cache="contiguous", max_seq=32768)
    cache = kv_cache.DecodeCache.of(desc)
    strides = (32 * 64, 32 * 64, 64)
    kernels.decode_call(ElementKind.bf16, 0, cache, batch, 32, 1, 0.125, None, 0x1000, strides,
                        0x2000, 0x3000, 0, 0x5000, 0x6000, strides, None, 0x100000, 7)()
    name, grid, _, args, *_ = launched[0]
    assert name == "decode_partial_bf16_64_4" + ("_spans" if chunks_per_cta > 1 else "")
    assert_packed_like_declared(name, args, signatures)
    if chunks_per_cta > 1:
        assert int(args[-1]) == chunks_per_cta
    assert grid == (8, kernels.chunks(32768) // chunks_per_cta, batch)


def test_the_launchers_chunk_and_threads_are_the_kernels():
    """decode.CHUNK and THREADS restate decode_common.cuh's kChunk and kThreads (the grid, the
    workspace and the shared memory are sized from them): the default build's values."""
    import re

    text = compiler.read_native("decode_common.cuh")
    chunk = re.search(r"#else\s+constexpr int kChunk = (\d+);", text)
    threads = re.search(r"constexpr int kThreads = (\d+);", text)
    assert (int(chunk.group(1)), int(threads.group(1))) == (kernels.CHUNK, kernels.THREADS)


@pytest.mark.parametrize(("q_len", "element", "batch", "max_seq", "build"), [
    (1, "bf16", 1, 32768, "_b4"), (2, "f16", 2, 32768, "_b4"), (1, "bf16", 3, 32768, "_b3"),
    (2, "f16", 64, 32768, "_b3"), (1, "bf16", 4, 1024, kernels.KQ_DEEP),
    (2, "f16", 8, 512, kernels.KQ_DEEP), (1, "bf16", 9, 512, "_b4"),
    (1, "bf16", 16, 1024, kernels.KQ_DEEP), (1, "bf16", 16, 2048, "_b4")])
def test_the_kq_tile_takes_kv_heads_of_up_to_8_rows_in_the_build_for_its_grid(
        monkeypatch, signatures, q_len, element, batch, max_seq, build):
    """A kv head of 4 rows at D 128 runs decode_partial_*_128_4kq_* (K in whole lines), one
    of 8 rows decode_partial_*_128_8kq_*: one tile a kv head, no spans, its own shared memory;
    the one-wave build on grids of at most half a CTA an SM (66) and of more than one up to two
    (133-264), the 4-CTA build on others of at most KQ_FEW_WAVES of its waves (here 132 SMs x 5
    CTAs: 1320 CTAs), the 3-CTA build above."""
    launched = _record(monkeypatch)
    desc = DecodeAttentionDescriptor(batch=batch, heads_q=32, heads_kv=8, head_dim=128,
                                     element=element, cache="contiguous", max_seq=max_seq,
                                     q_len=q_len)
    strides = (q_len * 32 * 128, 32 * 128, 128)
    kernels.decode_call(ElementKind(element), 0, kv_cache.DecodeCache.of(desc), batch, 32, q_len,
                        0.088, None, 0x1000, strides, 0x2000, 0x3000, 0, 0x5000, 0x6000, strides,
                        None, 0x100000, 7)()
    name, grid, _, args, shared, _ = launched[0]
    rows = 4 * q_len
    assert name == f"decode_partial_{element}_128_{rows}kq{build}"
    assert_packed_like_declared(name, args, signatures)
    assert grid == (8, kernels.chunks(max_seq), batch)
    assert shared == 8 * kernels.CHUNK + 4 * kernels.MMA_WARPS * rows * (2 + 128)


def test_the_kq_build_follows_the_waves_of_its_4_cta_build():
    assert kernels.kq_build(16, 528, 132) == kernels.KQ_DEEP  # B1 S1024 H32/8
    assert kernels.kq_build(66, 528, 132) == kernels.KQ_DEEP  # half a CTA an SM
    assert kernels.kq_build(67, 528, 132) == "_b4"
    assert kernels.kq_build(132, 528, 132) == "_b4"
    assert kernels.kq_build(133, 528, 132) == kernels.KQ_DEEP  # more than one, up to two
    assert kernels.kq_build(264, 528, 132) == kernels.KQ_DEEP
    assert kernels.kq_build(265, 528, 132) == "_b4"
    assert kernels.kq_build(512, 528, 132) == "_b4"  # B1 S32768 H32/8 on 132 SMs: one wave
    assert kernels.kq_build(1056, 528, 132) == "_b4"
    assert kernels.kq_build(1057, 528, 132) == "_b3"
    assert kernels.kq_build(4096, 528, 132) == "_b3"  # B64 S4096: many waves


def test_the_16_row_tile_is_staged_on_grids_of_many_waves():
    resident = 396  # 132 SMs x 3 CTAs of the register build
    assert kernels.mma_build(512, resident) == ""  # B1 S32768 q_len 4: 1.3 waves
    assert kernels.mma_build(kernels.MMA_FEW_WAVES * resident, resident) == ""
    assert kernels.mma_build(kernels.MMA_FEW_WAVES * resident + 1, resident) == "_staged"
    assert kernels.mma_build(4096, resident) == "_staged"  # B64 S4096 q_len 4: 10.3 waves

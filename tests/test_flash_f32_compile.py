"""The true-f32 flash attention without a GPU: every kernel of native/flash_f32.cu compiles for
sm_90, the launcher packs exactly the parameters each kernel declares (read from NVRTC's PTX),
sizes grids, shared memory and workspace as the kernels expect, and rejects bad input with a
ValueError naming the field. On a GPU: scripts/flash_f32_check.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from ptx import assert_packed_like_declared, kernel_parameters

from opfacade._backends.nvrtc import compiler
from opfacade._backends.nvrtc import flash_f32 as flash
from opfacade.errors import InvalidArgument, InvalidProblem, Unsupported
from opfacade.types import ArchSku

NATIVE = Path(__file__).resolve().parents[1] / "native"
SOURCE = (NATIVE / flash.SOURCE).read_text()
VARLEN = dict(batch=3, heads_q=8, heads_kv=2, head_dim=128, head_dim_v=128, max_seqlen_q=130,
              max_seqlen_kv=300, total_q=200, total_kv=500, varlen=True, scale=0.125,
              causal="bottom_right", window_left=64)
DENSE = dict(VARLEN, varlen=False, total_q=3 * 130, total_kv=3 * 300, causal=None,
             window_left=-1)
# Device addresses the checks accept (16-byte aligned); nothing is dereferenced here.
ADDRESS = {name: 0x10000 * (i + 1) for i, name in enumerate(
    ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "cu_q", "cu_kv", "workspace"))}


@pytest.fixture(scope="module")
def cubin() -> bytes:
    # No disk cache: a module fixture runs before the per-test cache directory is set.
    return compiler.compile_cubin(flash.SOURCE, ArchSku.sm90, source=SOURCE,
                                  use_cache=False).cubin


@pytest.fixture(scope="module")
def signatures() -> dict[str, list[str]]:
    return kernel_parameters(flash.SOURCE)


def test_every_instantiation_compiles_for_sm90(cubin):
    assert cubin[:4] == b"\x7fELF"
    symbols = {m.decode() for m in re.findall(rb"(?<=\0)flash_f32_\w+(?=\0)", cubin)}
    assert symbols == set(flash.kernel_names())


# Shared memory a block may opt in to: an H100's (the wide d128 forward fits) and an RTX 4090's.
SM90_SHARED, SM89_SHARED = 227 << 10, 99 << 10


def test_the_launcher_knows_each_architectures_shared_memory():
    assert flash.SHARED_PER_BLOCK[ArchSku.sm90] == SM90_SHARED
    assert flash.SHARED_PER_BLOCK[ArchSku.sm89] == SM89_SHARED


def _launches(monkeypatch, arch: ArchSku = ArchSku.sm90) -> list[tuple]:
    """Records launches (kernel name, grid, block, args, shared bytes) in place of a GPU of
    ``arch`` (its shared memory a block from flash.SHARED_PER_BLOCK)."""
    launched = []
    monkeypatch.setattr(flash, "device_arch", lambda device: arch)
    monkeypatch.setattr(flash, "_shared_per_block", lambda device: flash.SHARED_PER_BLOCK[arch])
    monkeypatch.setattr(flash, "_kernel", lambda name, device, shared: name)
    monkeypatch.setattr(flash, "launch", lambda kernel, grid, block, args, stream, device,
                        shared=0: launched.append((kernel, grid, block, args, shared)))
    return launched


def _run_both(problem: flash.FlashProblem, strides: flash.FlashStrides | None = None):
    a = ADDRESS
    strides = strides or flash.FlashStrides.contiguous(problem)
    cu = (a["cu_q"], a["cu_kv"]) if problem.varlen else (0, 0)
    flash.forward_call(problem, 0, a["q"], a["k"], a["v"], a["out"], a["lse"], *cu, strides, 7)()
    flash.backward_call(problem, 0, a["q"], a["k"], a["v"], a["out"], a["dout"], a["lse"],
                        a["dq"], a["dk"], a["dv"], *cu, a["workspace"], strides, 7)()


@pytest.mark.parametrize("arch", [ArchSku.sm90, ArchSku.sm89], ids=["sm90", "sm89"])
@pytest.mark.parametrize("fields", [VARLEN, DENSE], ids=["varlen", "dense"])
def test_packed_arguments_match_each_kernels_parameters(monkeypatch, signatures, fields, arch):
    launched = _launches(monkeypatch, arch)
    _run_both(flash.FlashProblem(**fields))
    h100 = arch is ArchSku.sm90  # both products on the FP64 tensor cores
    assert [name for name, *_ in launched] == [
        "flash_f32_fwd_dmma_d128_dv128" if h100 else "flash_f32_fwd_d128_dv128",
        "flash_f32_bwd_delta",
        "flash_f32_bwd_dkdv_mma_d128_dv128" if h100 else "flash_f32_bwd_dkdv_d128_dv128"]
    threads = {"fwd_dmma": flash.DMMA_THREADS, "fwd": flash.FORWARD_THREADS,
               "bwd_delta": flash.DELTA_THREADS, "bwd_dkdv": flash.DKDV_THREADS,
               "bwd_dkdv_mma": flash.DKDV_THREADS}
    for name, _, block, args, _ in launched:
        kind = re.match(r"flash_f32_(\w+?)(_d\d+_dv\d+)?$", name).group(1)
        assert block == (threads[kind],)
        assert_packed_like_declared(name, args, signatures)


@pytest.mark.parametrize(("arch", "kind", "rows"), [(ArchSku.sm90, "fwd_dmma", 32),
                                                   (ArchSku.sm100, "fwd_wide", 128),
                                                   (ArchSku.sm89, "fwd", 64)],
                         ids=["sm90", "sm100", "sm89"])
def test_forward_arguments_grid_and_shared_memory(monkeypatch, arch, kind, rows):
    launched = _launches(monkeypatch, arch)
    problem = flash.FlashProblem(**VARLEN)
    _run_both(problem)
    name, grid, _, args, shared = launched[0]
    assert name == f"flash_f32_{kind}_d128_dv128"
    assert grid == (8, 3, -(-130 // rows))  # heads_q, batch, query blocks (the slowest)
    assert args[0] == ADDRESS["q"] and args[1:4] == (0, 8 * 128, 128)  # varlen [T, H, D]
    assert args[16:20] == (ADDRESS["lse"], 0, 1, 200)  # lse [Hq, Tq]
    problem_args = args[20:]
    assert problem_args == (ADDRESS["cu_q"], ADDRESS["cu_kv"], 4, 130, 300, 200, 500,
                            np.float32(0.125), 2, 64, -1, 1)
    assert shared == flash._forward_launch(kind, 128, 128)[2]
    # The tiles: Q, K (then P) and V, rows of 128 + 4 floats (the wide forward's 128 rows and
    # keys, the 64-row forward's 64).
    assert flash._forward_shared(128, 128, wide=True) == 4 * 3 * 128 * 132 <= SM90_SHARED
    assert flash._forward_shared(128, 128) == 4 * 3 * 64 * 132
    # The DMMA forward's: 32 rows of Q and 64 of K of 128 + 16 floats, 64 rows of V of
    # 128 + 4, 32 of P of 64 + 8, each half's row maxima and, its P V in quarters of Dv, each
    # row's rescale (DmmaTiles); at Dv = 64 no rescales.
    assert flash._dmma_forward_shared(128, 128) == 4 * (
        96 * 144 + 64 * 132 + 32 * 72 + 3 * 32)
    assert flash._dmma_forward_shared(64, 64) == 4 * (96 * 80 + 64 * 68 + 32 * 72 + 2 * 32)


def test_each_gpu_and_head_dim_gets_its_kernels(monkeypatch):
    # The DMMA forward on sm_90 at every head-dim pair; the backward's scores on the FP64 tensor
    # cores on sm_90 only, with the FMA form's block and shared memory.
    for dims, arch, name in (((128, 128), ArchSku.sm90, "fwd_dmma"),
                             ((96, 96), ArchSku.sm90, "fwd_dmma"),
                             ((64, 64), ArchSku.sm90, "fwd_dmma"),
                             ((32, 32), ArchSku.sm90, "fwd_dmma"),
                             ((128, 64), ArchSku.sm90, "fwd_dmma"),
                             ((64, 128), ArchSku.sm90, "fwd_dmma"),
                             ((128, 128), ArchSku.sm100, "fwd_wide"),
                             ((64, 64), ArchSku.sm100, "fwd"),
                             ((128, 128), ArchSku.sm80, "fwd"),
                             ((64, 64), ArchSku.sm80, "fwd")):
        problem = flash.FlashProblem(**dict(DENSE, head_dim=dims[0], head_dim_v=dims[1]))
        launched = _launches(monkeypatch, arch)
        _run_both(problem)
        assert launched[0][0] == f"flash_f32_{name}_d{dims[0]}_dv{dims[1]}"
        assert launched[0][2] == (flash._forward_launch(name, *dims)[1],)
        assert launched[0][4] == flash._forward_launch(name, *dims)[2]
        dkdv = "bwd_dkdv_mma" if arch is ArchSku.sm90 else "bwd_dkdv"
        assert launched[-1][0] == f"flash_f32_{dkdv}_d{dims[0]}_dv{dims[1]}"
        assert launched[-1][2:5:2] == ((flash.DKDV_THREADS,), flash._dkdv_shared(*dims))


def test_backward_grids_workspace_and_delta_layout(monkeypatch):
    launched = _launches(monkeypatch)
    problem = flash.FlashProblem(**DENSE)
    _run_both(problem)
    (_, delta_grid, _, delta_args, _), (_, dkdv_grid, _, dkdv_args, _) = launched[1:]
    assert delta_grid == (3, 8, 3) and dkdv_grid == (2, 3, 5)
    # Delta [B, Hq, Sq] right after out and dout, as (pointer, batch, token, head).
    assert delta_args[8:12] == (ADDRESS["workspace"], 8 * 130, 1, 130)
    # Each part rounded up to 256 bytes: one f32 per query row and head (dense B*Sq rows,
    # varlen Tq), then one int32 turn counter per sequence, query head and 32-row block.
    delta_bytes = -(-4 * 8 * 3 * 130 // 256) * 256
    turn_bytes = -(-4 * 3 * 8 * 5 // 256) * 256
    assert flash.backward_workspace_bytes(problem) == delta_bytes + turn_bytes
    # Both kernels find the turn counters right after Delta.
    assert delta_args[16] == dkdv_args[36] == ADDRESS["workspace"] + delta_bytes
    varlen = flash.FlashProblem(**VARLEN)
    assert flash.backward_workspace_bytes(varlen) == -(-4 * 8 * 200 // 256) * 256 + turn_bytes


def test_an_odd_stride_turns_the_vector_copies_off(monkeypatch):
    launched = _launches(monkeypatch)
    problem = flash.FlashProblem(**DENSE)
    standard = flash.FlashStrides.contiguous(problem)
    odd = flash.FlashStrides(q=standard.q, k=standard.k, v=standard.v, out=standard.out,
                             lse=standard.lse, dk=(3 * 300 * 129, 129, 300 * 129))
    _run_both(problem, odd)
    vec = [args[-1] if name != "flash_f32_bwd_delta" else args[-3]
           for name, _, _, args, _ in launched]
    assert vec == [1, 0, 0]  # the forward never touches dk


def test_empty_extents_launch_only_what_writes_rows(monkeypatch):
    launched = _launches(monkeypatch)
    _run_both(flash.FlashProblem(**dict(VARLEN, max_seqlen_q=0, total_q=0)))
    assert [name for name, *_ in launched] == ["flash_f32_bwd_dkdv_mma_d128_dv128"]


def test_two_ctas_share_an_sm_at_head_dim_128():
    # sm_90: 228 KiB of shared memory per SM, 1 KiB of it reserved per CTA.
    for size in (flash._forward_shared(128, 128), flash._dmma_forward_shared(128, 128),
                 flash._dkdv_shared(128, 128)):
        assert 2 * (size + 1024) <= 228 * 1024
    # The DMMA forward asks ptxas for three CTAs an SM at head dims up to 64 (dmma_ctas in
    # flash_f32_dmma.cuh): their tiles must fit three times too.
    for d in (32, 64):
        assert 3 * (flash._dmma_forward_shared(d, d) + 1024) <= 228 * 1024


@pytest.mark.parametrize(("length", "total", "blocks", "size", "words"), [
    ("max_seqlen_q", "total_q", flash.query_blocks, 32, "blocks of 32 rows"),
    ("max_seqlen_kv", "total_kv", flash.key_blocks, 64, "blocks of 64 keys")],
    ids=["query", "key"])
def test_supported_rejects_more_blocks_than_the_grid_holds(length, total, blocks, size, words):
    # The forward grid is (heads_q, batch, query blocks), its blocks of 32 rows at the smallest
    # (the DMMA forward's), and the dK/dV grid (heads_kv, batch, key blocks): 65535 at most in z.
    fits = flash.FlashProblem(**dict(VARLEN, **{length: 65535 * size, total: 65535 * size}))
    assert blocks(fits) == 65535 and flash.supported(fits) is None
    over = flash.FlashProblem(**dict(VARLEN, **{length: 65535 * size + 1,
                                                total: 65535 * size + 1}))
    assert f"65536 {words}" in flash.supported(over)


@pytest.mark.parametrize("dims", [(80, 80), (32, 64), (256, 256)])
def test_supported_rejects_head_dims_without_kernels(dims):
    problem = flash.FlashProblem(**dict(VARLEN, head_dim=dims[0], head_dim_v=dims[1]))
    reason = flash.supported(problem)
    assert reason is not None and "head_dim" in reason
    with pytest.raises(Unsupported, match="head_dim"):
        flash.forward_call(problem, 0, *[ADDRESS[n] for n in ("q", "k", "v", "out", "lse")],
                           ADDRESS["cu_q"], ADDRESS["cu_kv"],
                           flash.FlashStrides.contiguous(problem), 0)


def test_supported_accepts_every_built_pair_and_bounds_the_grid():
    for d, dv in flash.HEAD_DIMS:
        problem = flash.FlashProblem(**dict(VARLEN, head_dim=d, head_dim_v=dv))
        assert flash.supported(problem) is None
    many = flash.FlashProblem(**dict(VARLEN, heads_q=70000, heads_kv=1))
    assert "heads_q" in flash.supported(many)


@pytest.mark.parametrize(("field", "value"), [
    ("batch", 0), ("heads_q", 7), ("head_dim", -1), ("max_seqlen_q", -1),
    ("total_kv", 2**31), ("window_left", -2), ("window_right", 1.5), ("scale", float("nan")),
    ("causal", "diagonal"), ("varlen", 1),
])
def test_problem_fields_are_validated(field, value):
    with pytest.raises(ValueError, match=field) as caught:
        flash.FlashProblem(**dict(VARLEN, **{field: value}))
    assert isinstance(caught.value, InvalidProblem) and caught.value.field == field


def test_dense_totals_must_be_batch_times_length():
    with pytest.raises(ValueError, match="total_q") as caught:
        flash.FlashProblem(**dict(DENSE, total_q=7))
    assert caught.value.field == "total_q"


@pytest.mark.parametrize(("argument", "change"), [
    ("q", dict(q=ADDRESS["q"] + 2)),
    ("k", dict(k=0)),
    ("lse", dict(lse=-4)),
    ("cu_seqlens_kv", dict(cu_kv=0)),
    ("strides", dict(strides=(1, 2, 3))),
    ("stream", dict(stream=-1)),
])
def test_forward_arguments_are_validated(argument, change):
    problem = flash.FlashProblem(**VARLEN)
    call = dict(q=ADDRESS["q"], k=ADDRESS["k"], v=ADDRESS["v"], out=ADDRESS["out"],
                lse=ADDRESS["lse"], cu_q=ADDRESS["cu_q"], cu_kv=ADDRESS["cu_kv"],
                strides=flash.FlashStrides.contiguous(problem), stream=0)
    with pytest.raises(ValueError, match=argument) as caught:
        flash.forward_call(problem, 0, **dict(call, **change))
    assert isinstance(caught.value, InvalidArgument) and caught.value.argument == argument


@pytest.mark.parametrize(("argument", "change"), [
    ("workspace_ptr", dict(workspace_ptr=0)),
    ("cu_seqlens_q", dict(cu_q=ADDRESS["cu_q"])),  # given for a dense problem
    ("dv", dict(dv=ADDRESS["dv"] + 1)),
])
def test_backward_arguments_are_validated(argument, change):
    problem = flash.FlashProblem(**DENSE)
    names = ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv")
    call = dict({n: ADDRESS[n] for n in names}, cu_q=0, cu_kv=0,
                workspace_ptr=ADDRESS["workspace"],
                strides=flash.FlashStrides.contiguous(problem), stream=0)
    with pytest.raises(ValueError, match=argument) as caught:
        flash.backward_call(problem, 0, **dict(call, **change))
    assert isinstance(caught.value, InvalidArgument) and caught.value.argument == argument


def test_strides_must_be_three_ints():
    with pytest.raises(ValueError, match=r"strides\.dq") as caught:
        flash.FlashStrides(q=(0, 1, 2), k=(0, 1, 2), v=(0, 1, 2), out=(0, 1, 2),
                           lse=(0, 1, 2), dq=(0, 1))
    assert caught.value.argument == "strides.dq"
    given = flash.FlashStrides(q=[0, 1, 2], k=(0, 1, 2), v=(0, 1, 2), out=(0, 5, 6),
                               lse=(0, 1, 2))
    assert given.q == (0, 1, 2) and given.of("dout") == (0, 5, 6)

"""Why the bench's B1 S32768 decode row reads below what the same step reads alone (74.4-74.8%
of a copy in the bench, 77-80% in scripts/decode_variants.py and decode_burst_probe.py): the
bench's own problem, our run() and the torch peer (``opfacade._bench.decode_attention``), timed
by the bench's time_interleaved with different neighbours:

- ``alone``: ours only;
- ``torch peer``: ours and the torch peer, as the bench row runs them;
- ``idle neighbour``: ours and a kernel that spins for about the torch peer's time and reads
  nothing (torch.cuda._sleep): a neighbour that leaves the memory idle;
- ``copy neighbour``: ours and a device copy of the same bytes: a neighbour that streams as
  hard as ours;
- ``write neighbour`` and ``read neighbour`` (with ``--rw``): a memset of those bytes (writes
  only) and a sum over them (reads only), to tell which half of the copy clears the state the
  torch peer and the spinning kernel leave (twenty-ninth session: 42.0-42.5 us beside those,
  40.5-41.1 alone after a copy; catalog/probes/decode_b1_neighbours_H200.json).

With ``--l2``, the sets run in an order that tells which neighbour sets the slow state and
which clears it (thirtieth session: the torch peer's burst slows ours by 3.4% for as long as
only ours, the peer or the spinning kernel run after it; a burst of a copy, a memset or a sum
of another 134 MB clears it): each neighbour follows a clearing copy, and three kernels read
another 134 MB with an L2 eviction policy each (``evict-last reader``, ``normal reader``,
``evict-first reader``: createpolicy and ld.global.L2::cache_hint), to test whether lines the
peer leaves marked evict-last are the state; ``reset persisting`` calls the driver's
cuCtxResetPersistingL2Cache between bursts, which turns persisting lines back into normal ones.

With ``--which``, each of these after a clearing copy, then ours alone: the torch peer, torch's
SDPA forced onto each of its backends (flash, efficient, cuDNN, math) on the peer's inputs, and
a 4096^3 bf16 GEMM: which kernels leave the state. ``--clearers``: after the peer, memsets of
256 KiB to 128 MiB, a 4 MiB copy and torch's sum over 134 MB, each then ours alone: what clears
it. ``--hints``: our kernels built with each load hint (last-use, evict-first, none,
last-use with a 256-byte L2 fetch, L1::no_allocate, an L2 evict-first policy with
L1::no_allocate), each after a copy and after the peer. ``--promotion``:
readers of another 134 MB with an L2 prefetch size (128 or 256 bytes), each after a copy.
``--settle``: ours and the peer timed as the bench times them, without and with its settle;
``--carveout``: with the preferred shared memory carveout set on our kernels.

Each again with the prepared step (a graph replay) in place of run(). The bench's 1 GiB
copy is timed too, so each figure is given against both copies. Each set runs ROUNDS times in
turn; with --clocks, nvidia-smi (run by the caller) samples the SM clock, and each set's start
and end times are printed to line up with it.

    python3 scripts/decode_b1_neighbours_probe.py [out.json] [--rounds N] [--case B,S[,Q]]
        [--rw | --l2 | --carveout | --settle | --which
        | --clearers | --hints | --promotion]

To see whether the driver reports a reason, sample the clocks' event reasons beside it:
``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,clocks_event_reasons.active
--format=csv,noheader -lms 20``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from decode_builds import load_build, use_module  # scripts/decode_builds.py, beside this script

from opfacade._bench import decode_attention as bench
from opfacade._bench.common import settle_by_copying, time_interleaved
from opfacade._bench.cudnn_peers import RawCudnn

ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
REPS = 20


# --l2: each neighbour after a clearing copy; the peer then the driver's reset of persisting lines.
# --promotion: readers of another 134 MB with an L2 prefetch size (ld.global.L2::128B, ::256B,
# as cp.async and TMA loads may carry), each after a clearing copy, then the peer.
PROMOTION_ORDER = ["copy neighbour", "L2 128B reader", "alone", "copy neighbour",
                   "L2 256B reader", "alone", "copy neighbour", "torch peer", "alone"]
L2_ORDER = ["copy neighbour", "idle neighbour", "alone", "copy neighbour", "evict-last reader",
            "alone", "copy neighbour", "normal reader", "alone", "copy neighbour",
            "evict-first reader", "alone", "copy neighbour", "torch peer", "alone",
            "reset persisting", "alone", "torch peer", "copy neighbour", "alone"]

READER = r"""
extern "C" __global__ void read_with_policy(const uint4* p, long long n, int policy_kind,
                                            unsigned* sink) {
    unsigned long long policy;
    if (policy_kind >= 3) {  // plain loads with an L2 prefetch size: 128 or 256 bytes
        unsigned folded = 0;
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x) {
            unsigned a, b, c, d;
            if (policy_kind == 3) {
                asm volatile("ld.global.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p + i));
            } else {
                asm volatile("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p + i));
            }
            folded ^= a ^ b ^ c ^ d;
        }
        if (folded == 0x9e3779b9u) sink[0] = folded;
        return;
    }
    if (policy_kind == 0) {
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    } else if (policy_kind == 1) {
        asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
    } else {
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    }
    unsigned folded = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned a, b, c, d;
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p + i), "l"(policy));
        folded ^= a ^ b ^ c ^ d;
    }
    if (folded == 0x9e3779b9u) sink[0] = folded;  // keeps the loads; never true for zeros
}
"""


# --which: which kernels set the state, each after a clearing copy: torch's SDPA forced onto
# each of its backends on the peer's own inputs, and a bf16 GEMM (cuBLAS).
def which_neighbours(p, peer) -> dict[str, Callable[[], object]]:
    """The --which neighbours on the bench problem ``p`` (a backend that refuses is left out,
    and printed)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q = p.q.transpose(1, 2)
    k, v = (x[:, :max(p.lengths)].transpose(1, 2) for x in (p.peer_k, p.peer_v))
    found: dict[str, Callable[[], object]] = {"torch sdpa": peer}
    for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa math", SDPBackend.MATH)):
        def call(backend=backend):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=True)
        try:
            call()
            found[name] = call
        except RuntimeError as error:
            print(f"{name}: refused ({str(error).splitlines()[0][:120]})")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    found["bf16 gemm"] = lambda: a @ a
    return found


# --clearers: which neighbours clear the state, each after the peer's burst sets it: memsets of
# growing sizes, a small copy, and torch's sum over the copy's 134 MB source.
CLEARER_BYTES = (1 << 18, 1 << 22, 1 << 25, 1 << 27)


def clearers(src) -> dict[str, Callable[[], object]]:
    scratch = torch.empty(CLEARER_BYTES[-1], dtype=torch.uint8, device="cuda")
    small = torch.empty(2 << 22, dtype=torch.uint8, device="cuda")
    found = {f"memset {n >> 10} KiB": scratch[:n].zero_ for n in CLEARER_BYTES}
    found["copy 4 MiB"] = lambda: small[:1 << 22].copy_(small[1 << 22:])
    words = src.view(torch.int32)
    found["sum of 134 MB"] = words.sum
    return found


# --hints: our kernels built with each load hint (common.cuh's load16): last-use (the default),
# evict-first, and none (decode_attention.cu with OPFACADE_STREAMING 0, which the caller puts
# at .scratch/decode_attention_plain.cu), each after a copy and after the peer.
HINT_BUILDS = {"last-use": (), "evict-first": ("-DOPFACADE_STREAMING_EVICT_FIRST",),
               "no hint": ("source=.scratch/decode_attention_plain.cu",),
               "last-use 256B": ("-DOPFACADE_STREAMING_LU_L2_256",),
               "L1 no-allocate": ("-DOPFACADE_STREAMING_NO_ALLOCATE",),
               "policy evict-first": ("-DOPFACADE_STREAMING_POLICY_EVICT_FIRST",)}
HINT_ORDER = ["copy neighbour", "alone", "torch peer", "alone"]


def use_build(options: tuple[str, ...]) -> None:
    """Makes the decode plans launch decode_attention.cu built with ``options``."""
    use_module(load_build(options))


def l2_neighbours(nbytes: int) -> dict[str, dict]:
    """The --l2 neighbours: readers of another ``nbytes`` with an L2 eviction policy each, and
    the driver's reset of persisting L2 lines between bursts (cuCtxResetPersistingL2Cache)."""
    import cupy
    from cuda.bindings import driver

    buffer = cupy.zeros(nbytes // 16 * 4, dtype=cupy.uint32)
    sink = cupy.zeros(1, dtype=cupy.uint32)
    kernel = cupy.RawKernel(READER, "read_with_policy", options=("-arch=sm_90",))
    blocks = 132 * 8

    def reader(kind: int):
        return lambda: kernel((blocks,), (256,), (buffer, np.int64(nbytes // 16), np.int32(kind),
                                                  sink))

    def reset() -> None:
        (status,) = driver.cuCtxResetPersistingL2Cache()
        assert status == driver.CUresult.CUDA_SUCCESS, status

    return {"L2 128B reader": {"ours": None, "l2_128": reader(3)},
            "L2 256B reader": {"ours": None, "l2_256": reader(4)},
            "evict-last reader": {"ours": None, "evict_last": reader(0)},
            "normal reader": {"ours": None, "evict_normal": reader(1)},
            "evict-first reader": {"ours": None, "evict_first": reader(2)},
            "reset persisting": {"ours": None, "reset": reset}}


# --carveout: the preferred shared memory carveout (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_
# CARVEOUT, percent of the most shared memory an SM has; -1: none, the driver's choice) set on
# every decode kernel loaded, each with a fresh prepared step, beside the peer and after a copy.
CARVEOUTS = (-1, 0, 40, 100)
CARVEOUT_ORDER = ["copy neighbour", "alone", "torch peer", "alone", "copy neighbour", "alone"]
_CARVEOUT_ATTRIBUTE = 9  # cuda.h's CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def set_carveout(percent: int) -> list[str]:
    """Sets ``percent`` on every loaded kernel of native/decode_attention.cu; their names."""
    import cupy

    from opfacade._backends.nvrtc.launch import KERNELS

    names = []
    for (source, name, _device), function in KERNELS._functions.items():
        if source.startswith("decode_attention"):
            cupy.cuda.driver.funcSetAttribute(function.ptr, _CARVEOUT_ATTRIBUTE, percent)
            names.append(name)
    return names


def main() -> int:
    # --case B,S[,Q]: B sequences of S tokens, Q new tokens each (contiguous; torch sdpa's rows)
    shape = ([int(x) for x in sys.argv[sys.argv.index("--case") + 1].split(",")]
             if "--case" in sys.argv else [1, 32768])
    case = bench.DecodeCase(shape[0], shape[1], q_len=shape[2] if len(shape) > 2 else 1)
    p = bench.decode_problem(torch, case)
    notes: list[str] = []
    run_call, step = bench._ours(torch, p, notes)
    peers = bench._peers(torch, RawCudnn(torch), p, notes)
    peer = peers["torch sdpa"].call
    moved = bench.kv_bytes(p.lengths)
    src = torch.empty(moved, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_interleaved({"copy": lambda: dst.copy_(src)}, REPS)["copy"]
    copy_rate = 2 * moved / copy_ms / 1e9
    # The bench's own denominator: a 1 GiB copy (bench.COPY_BYTES), timed the bench's way.
    big = torch.empty(bench.COPY_BYTES, dtype=torch.uint8, device="cuda")
    big_out = torch.empty_like(big)
    gib_rate = bench.copy_tbps(bench.COPY_BYTES, time_interleaved(
        {"copy": lambda: big_out.copy_(big)}, REPS)["copy"])
    peer_ms = time_interleaved({"peer": peer}, REPS)["peer"]
    # torch.cuda._sleep spins for a number of cycles: about the peer's time at ~1.7 GHz.
    cycles = int(peer_ms * 1e-3 * 1.7e9)
    sets = {
        "alone": {"ours": run_call},
        "torch peer": {"ours": run_call, "torch sdpa": peer},
        "idle neighbour": {"ours": run_call, "sleep": lambda: torch.cuda._sleep(cycles)},
        "copy neighbour": {"ours": run_call, "copy": lambda: dst.copy_(src)},
        "alone, prepared step": {"ours": step},
        "torch peer, prepared step": {"ours": step, "torch sdpa": peer},
        "idle neighbour, prepared step": {"ours": step,
                                          "sleep": lambda: torch.cuda._sleep(cycles)},
        "copy neighbour, prepared step": {"ours": step, "copy": lambda: dst.copy_(src)},
    }
    if "--rw" in sys.argv:
        words = src.view(torch.int32)
        sets["write neighbour"] = {"ours": run_call, "memset": lambda: dst.zero_()}
        sets["read neighbour"] = {"ours": run_call, "sum": lambda: words.sum()}
    order = list(sets)
    if "--settle" in sys.argv:
        return settle_sets(run_call, peer, moved, copy_rate, gib_rate, peer_ms, notes)
    if "--hints" in sys.argv or "--carveout" in sys.argv:
        setups, order = (
            ({build: lambda o=options: use_build(o) for build, options in HINT_BUILDS.items()},
             HINT_ORDER) if "--hints" in sys.argv else
            ({f"carveout {percent}": lambda c=percent: set_carveout(c) for percent in CARVEOUTS},
             CARVEOUT_ORDER))
        return setup_sets(p, peer, dst, src, moved, copy_rate, gib_rate, peer_ms, notes, setups,
                          order)
    if "--clearers" in sys.argv:
        order = []
        sets["torch peer"] = {"ours": run_call, "torch sdpa": peer}
        sets["alone"] = {"ours": run_call}
        for name, call in clearers(src).items():
            sets[name] = {"ours": run_call, name: call}
            order += ["torch peer", name, "alone"]
    if "--which" in sys.argv:
        order = []
        for name, call in which_neighbours(p, peer).items():
            sets[name] = {"ours": run_call, name: call}
            order += ["copy neighbour", name, "alone"]
    if "--l2" in sys.argv or "--promotion" in sys.argv:
        for name, fns in l2_neighbours(src.numel()).items():
            sets[name] = {**fns, "ours": run_call}
        sets["alone"] = {"ours": run_call}
        order = L2_ORDER if "--l2" in sys.argv else PROMOTION_ORDER
    found: dict[str, list[dict]] = {name: [] for name in order}
    for round_ in range(ROUNDS):
        for at, name in enumerate(order):
            fns = sets[name]
            began = time.time()
            ms = time_interleaved(fns, REPS)
            found[name].append({"ms": ms, "ours_of_copy": moved / ms["ours"] / 1e9 / copy_rate,
                                "ours_of_gib_copy": moved / ms["ours"] / 1e9 / gib_rate,
                                "after": order[at - 1] if at else "the previous round's last",
                                "began": began, "ended": time.time()})
            print(f"round {round_} {name:16} ours {ms['ours']:.4f} ms "
                  f"{moved / ms['ours'] / 1e9 / copy_rate:.1%} of copy  "
                  + "  ".join(f"{k} {v:.4f}" for k, v in ms.items() if k != "ours")
                  + f"  [{began:.2f} - {time.time():.2f}]"
                  + f"  {moved / ms['ours'] / 1e9 / gib_rate:.1%} of the 1 GiB copy")
    save({"copy_tbps": copy_rate, "gib_copy_tbps": gib_rate, "peer_ms": peer_ms,
          "notes": notes, "sets": found})
    return 0


def save(record: dict) -> None:
    for path in (a for a in sys.argv[1:] if a.endswith(".json")):
        with open(path, "w") as f:
            json.dump(record, f, indent=2)


def settle_sets(run_call, peer, moved, copy_rate, gib_rate, peer_ms, notes) -> int:
    """The --settle mode: ours and the torch peer as the bench times them, with and without
    the bench's settle (a 128 MiB copy before every burst), in turn."""
    settle = settle_by_copying(torch)
    found: dict[str, list[dict]] = {}
    for round_ in range(ROUNDS):
        for name, how in (("unsettled", None), ("settled", settle)):
            ms = time_interleaved({"ours": run_call, "torch sdpa": peer}, REPS, settle=how)
            found.setdefault(name, []).append(
                {"ms": ms, "ours_of_copy": moved / ms["ours"] / 1e9 / copy_rate,
                 "ours_of_gib_copy": moved / ms["ours"] / 1e9 / gib_rate,
                 "peer_over_ours": ms["torch sdpa"] / ms["ours"]})
            print(f"round {round_} {name:10} ours {ms['ours']:.4f} ms "
                  f"{moved / ms['ours'] / 1e9 / copy_rate:.1%} of copy, "
                  f"{moved / ms['ours'] / 1e9 / gib_rate:.1%} of the 1 GiB copy; torch sdpa "
                  f"{ms['torch sdpa']:.4f} ms ({ms['torch sdpa'] / ms['ours']:.3f}x)")
    save({"copy_tbps": copy_rate, "gib_copy_tbps": gib_rate, "peer_ms": peer_ms,
          "notes": notes, "sets": found})
    return 0


def setup_sets(p, peer, dst, src, moved, copy_rate, gib_rate, peer_ms, notes,
               setups: dict[str, Callable[[], object]], order: list[str]) -> int:
    """The --hints and --carveout modes: after each of ``setups`` (a build of our kernels, a
    carveout set on them), a fresh prepared step of ours timed in ``order``'s sets."""
    found: dict[str, list[dict]] = {}
    for round_ in range(ROUNDS):
        for label, setup in setups.items():
            setup()
            _, step = bench._ours(torch, p, notes)
            sets = {"alone": {"ours": step}, "torch peer": {"ours": step, "torch sdpa": peer},
                    "copy neighbour": {"ours": step, "copy": lambda: dst.copy_(src)}}
            for at, name in enumerate(order):
                ms = time_interleaved(sets[name], REPS)
                found.setdefault(f"{label}: {name}", []).append(
                    {"ms": ms, "ours_of_copy": moved / ms["ours"] / 1e9 / copy_rate,
                     "ours_of_gib_copy": moved / ms["ours"] / 1e9 / gib_rate,
                     "after": order[at - 1] if at else "the previous setup's last"})
                print(f"round {round_} {label:16} {name:16} ours {ms['ours']:.4f} ms "
                      f"{moved / ms['ours'] / 1e9 / copy_rate:.1%} of copy, "
                      f"{moved / ms['ours'] / 1e9 / gib_rate:.1%} of the 1 GiB copy")
    save({"copy_tbps": copy_rate, "gib_copy_tbps": gib_rate, "peer_ms": peer_ms,
          "notes": notes, "sets": found})
    return 0

if __name__ == "__main__":
    sys.exit(main())

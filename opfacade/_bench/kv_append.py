"""kv_append benchmark (issue 13): a decode step's new keys and values written into the KV caches,
against torch writing the same tokens in one run. Every row's op is "kv_append".

bf16, Hkv 8, d 128: one new token per sequence at B64 and B256, four (speculative decoding) at
B64, each into a contiguous cache of 4096 tokens a sequence and into paged caches of 16 tokens a
page (a pool of exactly every table's pages, the tables a random permutation of it, fixed seed).
Sequence lengths (the new tokens counted) are drawn uniformly from [q_len, 4096] by
``numpy.random.default_rng(13)``, so the writes land all over the caches. The new tokens are
random; the caches are outputs, left unfilled (a write's speed does not depend on what it
overwrites).

Peer: "torch index_put", torch's advanced-index assignment of the same tokens, k and v
(``k_cache[batch, position] = k_new``, or ``k_pool[page, slot] = k_new``), with the indices made
ahead of the timed calls (as a serving loop makes its slot mapping once a step for every layer).

Ours launches as a programmatic dependent of the stream's previous kernel (sm_90), so from CUDA
graphs each of our calls may start while the one before it ends, which the copy's calls cannot;
"ours, plain launch" (our plan with that off) is timed beside it and taken out of the row, its
fraction of the copy in the figure's parentheses.

The figure is the bytes the step writes (k and v of the new tokens) per second, and as a fraction
of a device-to-device copy of exactly those bytes timed in the same row: timed beside the
contestants, in the same interleaved rounds (and from the same CUDA-graph replays where bursts
time the host), then taken out of the row. (Timed on its own before the contestants, as until
the forty-ninth session, the same 262 KB copy read 0.98 us in one row and 1.16 us in the next,
while the bench's clock recovered from its warm-up's power cap.) Notes carry our SKU and
workspace, the host microseconds per call of run() and of the prepared step(), the copy's time,
and whether ours wrote every new token where it belongs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .._backends.nvrtc import kv_cache
from ..ops.kv_append import KvAppendArgs, KvAppendDescriptor, KvAppendPlan
from .common import BenchRow, Timings, step_host_note, time_contestants
from .cudnn_peers import first_line
from .decode_attention import CacheShape, our_calls, page_order, peers_only_row
from .host_floor import replay_floor

OP = "kv_append"
HEADS_KV, HEAD_DIM, ITEMSIZE = 8, 128, 2  # bf16
CAPACITY, QUICK_CAPACITY = 4096, 1024
PAGE_SIZE = 16
LENGTHS_SEED = 13
SPECULATIVE = 4
REPS, QUICK_REPS = 20, 5
PEER_NAMES = ("torch index_put",)


@dataclass(frozen=True)
class AppendCase(CacheShape):
    """One row's problem: ``batch`` sequences in caches of ``capacity`` tokens, contiguous or
    paged, ``q_len`` new tokens each."""

    batch: int
    cache: str = "contiguous"
    q_len: int = 1
    capacity: int = CAPACITY
    page_size: int | None = None

    def lengths(self) -> np.ndarray:
        """seq_lens with the new tokens counted, uniform in [q_len, capacity]."""
        rng = np.random.default_rng(LENGTHS_SEED)
        return rng.integers(self.q_len, self.capacity, self.batch, endpoint=True)

    def written_bytes(self) -> int:
        """Bytes the step writes: k and v of every new token."""
        return self.batch * self.q_len * HEADS_KV * HEAD_DIM * 2 * ITEMSIZE

    def descriptor(self) -> KvAppendDescriptor:
        return KvAppendDescriptor(batch=self.batch, q_len=self.q_len, heads_kv=HEADS_KV,
                                  head_dim=HEAD_DIM, element="bf16", **self.cache_fields())

    @property
    def label(self) -> str:
        cache = f"paged{self.page_size}" if self.paged else "contiguous"
        return (f"bf16 Hkv{HEADS_KV} d{HEAD_DIM} B{self.batch} q_len{self.q_len} {cache} "
                f"cap{self.capacity}")


def cases(quick: bool = False) -> list[AppendCase]:
    """The rows' problems in order; quick: one small batch, contiguous and paged."""
    if quick:
        return [AppendCase(8, capacity=QUICK_CAPACITY),
                AppendCase(8, "paged", capacity=QUICK_CAPACITY, page_size=PAGE_SIZE)]
    forms = [dict(cache="contiguous"), dict(cache="paged", page_size=PAGE_SIZE)]
    rows = [AppendCase(batch, **form) for batch in (64, 256) for form in forms]
    return rows + [AppendCase(64, q_len=SPECULATIVE, **form) for form in forms]


def destinations(case: AppendCase, lengths: np.ndarray, table: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Where each new token goes, as two [b, q_len] index arrays into the cache's first two
    dims: (sequence, position) for a contiguous cache, (page, slot) for a paged one. New token t
    of sequence s sits at position ``seq_lens[s] - q_len + t``."""
    positions = np.asarray(lengths)[:, None] - case.q_len + np.arange(case.q_len)[None, :]
    if not case.paged:
        return np.broadcast_to(np.arange(case.batch)[:, None], positions.shape), positions
    rows = np.arange(case.batch)[:, None]
    return table[rows, positions // case.page_size], positions % case.page_size


# ----------------------------------------------------------------------------- problems


@dataclass
class AppendProblem:
    """One case's tensors: k_new, v_new [b, q_len, Hkv, D] (random), the caches, seq_lens int32
    [b], the page table int32 [b, max_pages] when paged, and the destinations as long tensors."""

    case: AppendCase
    k_new: object
    v_new: object
    k_cache: object
    v_cache: object
    seq_lens: object
    table: object
    index: tuple


def append_problem(torch, case: AppendCase, device: str = "cuda") -> AppendProblem:
    """Random new tokens in [-1, 1) for ``case`` on ``device``, unfilled caches."""
    gen = torch.Generator(device=device).manual_seed(0)
    b = case.batch
    shape = (b, case.q_len, HEADS_KV, HEAD_DIM)
    k_new, v_new = (torch.rand(shape, device=device, dtype=torch.bfloat16, generator=gen)
                    .mul_(2).sub_(1) for _ in range(2))
    rows, tokens = ((b * case.max_pages, case.page_size) if case.paged
                    else (b, case.capacity))
    k_cache, v_cache = (torch.empty((rows, tokens, HEADS_KV, HEAD_DIM), device=device,
                                    dtype=torch.bfloat16) for _ in range(2))
    lengths = case.lengths()
    table = page_order(b, case.max_pages) if case.paged else None
    index = tuple(torch.from_numpy(np.array(i, dtype=np.int64)).to(device)
                  for i in destinations(case, lengths, table))
    return AppendProblem(case, k_new, v_new, k_cache, v_cache,
                         torch.tensor(lengths, dtype=torch.int32, device=device),
                         None if table is None else torch.from_numpy(table).to(device), index)


def torch_index_put(p: AppendProblem):
    """torch's advanced-index assignment of the new tokens into both caches, run once."""
    def call() -> None:
        p.k_cache.index_put_(p.index, p.k_new)
        p.v_cache.index_put_(p.index, p.v_new)

    call()
    return call


def wrote_every_token(torch, p: AppendProblem) -> bool:
    """Whether the caches hold k_new and v_new at the destinations (bit for bit)."""
    return all(bool(torch.equal(cache[p.index], new))
               for cache, new in ((p.k_cache, p.k_new), (p.v_cache, p.v_new)))


# ----------------------------------------------------------------------------- rows


COPY = "device copy"  # the row's yardstick, timed among the contestants and then taken out


def _copy_call(torch, nbytes: int):
    """A device-to-device copy of ``nbytes``, on torch's current stream."""
    src = torch.rand(nbytes // ITEMSIZE, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def take_out(timings: Timings, name: str) -> tuple[Timings, float, str]:
    """``timings`` without contestant ``name`` (the COPY, or PLAIN), its GPU ms (from the graph
    replays when the row has them) and how it was timed."""
    def without(times: dict) -> dict:
        return {other: value for other, value in times.items() if other != name}

    ms, how = ((timings.graph_ms[name], "from a CUDA graph") if name in timings.graph_ms
               else (timings.gpu_ms[name], "in bursts"))
    rest = replace(timings, gpu_ms=without(timings.gpu_ms), host_ms=without(timings.host_ms),
                   graph_ms=without(timings.graph_ms),
                   host_bound=[other for other in timings.host_bound if other != name])
    return rest, ms, how


def _ours(torch, p: AppendProblem, notes: list[str]):
    """our_calls on ``p``, its first run checked against the tokens it should have written."""
    args = KvAppendArgs(p.k_new, p.v_new, p.k_cache, p.v_cache, p.seq_lens, p.table)
    calls = our_calls(torch, KvAppendPlan, p.case.descriptor(), args, notes)
    if calls is not None and not wrote_every_token(torch, p):
        notes.append("ours: the caches do not hold k_new and v_new at the new positions")
    return calls


PLAIN = "ours, plain launch"  # ours without the programmatic launch, timed beside it


def _plain_run(torch, p: AppendProblem):
    """run() of a second plan for ``p`` whose launches are plain: each of its calls runs with
    kv_cache.APPEND_FOLLOWS_PREVIOUS off, since a plan makes a launch whenever it meets a new
    stream (the graph-timed rounds capture on one of their own). Ours launches as a programmatic
    dependent of the stream's previous kernel, which overlaps only inside a CUDA graph or a
    stream of direct launches (the graph-timed rounds; a replay of our own graph starts after
    the one before it ends); the device copy never does. This contestant is ours without it."""
    plan = KvAppendPlan.select(p.case.descriptor(), device=0)
    args = KvAppendArgs(p.k_new, p.v_new, p.k_cache, p.v_cache, p.seq_lens, p.table)

    def call() -> None:
        follows = kv_cache.APPEND_FOLLOWS_PREVIOUS
        kv_cache.APPEND_FOLLOWS_PREVIOUS = False
        try:
            plan.run(args)
        finally:
            kv_cache.APPEND_FOLLOWS_PREVIOUS = follows

    call()
    return call


def _row(torch, case: AppendCase, reps: int) -> BenchRow:
    p = append_problem(torch, case)
    notes: list[str] = []
    ours = _ours(torch, p, notes)  # before the peer, which writes the same tokens
    fns = {} if ours is None else {PLAIN: _plain_run(torch, p)}
    try:
        fns["torch index_put"] = torch_index_put(p)
        notes.append("torch index_put: indices made ahead of the timed calls")
    except Exception as error:  # a failing peer is a note, never a crash
        notes.append(f"torch index_put: {first_line(error)}")
    written = case.written_bytes()
    if ours is None:
        return peers_only_row(OP, case.label, fns, reps,
                              lambda ms: f"{written / ms / 1e6:.0f} GB/s written", notes)
    run_call, step = ours
    notes.append(step_host_note(run_call, step, replay_floor(torch)))
    timings, copy_ms, how = take_out(time_contestants(
        {"ours": run_call, **fns, COPY: _copy_call(torch, written)}, reps), COPY)
    timings, plain_ms, plain_how = take_out(timings, PLAIN)
    notes.append(f"copy of {written} B: {copy_ms * 1e3:.2f} us per call {how}, timed beside "
                 "the contestants")
    notes.append(f"ours launches as a programmatic dependent of the stream's previous kernel, "
                 f"which a CUDA graph of our calls overlaps (the copy's calls never): launched "
                 f"plainly, {plain_ms * 1e3:.2f} us per call {plain_how}")

    def figure(ms: float) -> str:
        return (f"{written / ms / 1e6:.0f} GB/s written, {copy_ms / ms:.1%} of copy "
                f"({copy_ms / plain_ms:.1%} launched plainly)")

    return timings.row(OP, case.label, figure, "; ".join(notes))


def run(quick: bool = False) -> list[BenchRow]:
    import torch

    reps = QUICK_REPS if quick else REPS
    rows = []
    for case in cases(quick):
        rows.append(_row(torch, case, reps))
        torch.cuda.empty_cache()  # this case's caches, before the next case's
    return rows

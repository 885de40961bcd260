"""decode_attention benchmark (issue 13): one decode step over KV caches, against its peers in one
run on the same values. Every row's op is "decode_attention".

bf16, Hq 32, Hkv 8, d 128, one new token per sequence, at B64 S4096, B8 S32768, B256 S1024,
B1 S32768 (every sequence full) and 64 sequences of lengths
``numpy.random.default_rng(13).integers(1, 8192, 64, endpoint=True)`` in caches of 8192; each
over a contiguous cache and over paged caches of 16 and 64 tokens a page (the pool just holds
every table, the tables a random permutation of it, fixed seed). Four new tokens per sequence
(speculative decoding) at B64 S4096, contiguous and paged 16. Caches hold random values; the
positions past each sequence's length hold NaN in our caches (the kernel must never read them),
and the peers read their own finite copy (``decode_peers.py`` says why).

Peers: "torch sdpa" on the contiguous rows (with a mask for q_len > 1), "cudnn paged" on the
paged ones (q_len 1 only) (``decode_peers.py``). The figure is KV bandwidth: the bytes of K and
V the step must read (the sum over sequences of seq_len * Hkv * D * 2 tensors * 2 bytes) per
second, and as a fraction of a device-to-device copy timed once per run (bytes read +
written); the notes give it against a copy of the row's own KV bytes too. Notes carry our SKU
and workspace, the host microseconds per call of run() and of the prepared step(), each peer's
largest difference from ours, and why a peer is missing ("<peer>: <first line of its error>").
A 128 MiB device copy runs before every burst of every contestant (``settle_by_copying``): each
burst follows the other contestant's, and the torch peer's leaves a state that cost our next
bursts 2-3% on an H200 (docs/DECODE.md, "What the torch peer leaves behind").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import Unsupported
from ..ops.decode_attention import (
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
    DecodeAttentionPlan,
)
from .common import BenchRow, settle_by_copying, step_host_note, time_contestants, time_ms
from .cudnn_peers import RawCudnn, first_line
from .decode_peers import Peer, build_peers, cudnn_paged, torch_sdpa
from .host_floor import replay_floor

OP = "decode_attention"
HEADS_Q, HEADS_KV, HEAD_DIM, ITEMSIZE = 32, 8, 128, 2  # bf16
# Seed 13, the number: every run decodes the same 64 lengths in caches of 8192.
LENGTHS_SEED = 13
VARIED_BATCH, VARIED_CAPACITY = 64, 8192
PAGES_SEED = 1313  # the order of the pool's pages in the page tables
FULL_SHAPES = ((64, 4096), (8, 32768), (256, 1024), (1, 32768))  # (batch, seq), all full
PAGE_SIZES = (16, 64)
SPECULATIVE = 4  # new tokens per sequence in the speculative rows
# The device copy the figure is a fraction of: large enough that its launch is noise.
COPY_BYTES, QUICK_COPY_BYTES = 1 << 30, 1 << 26
REPS, QUICK_REPS = 20, 5
PEER_NAMES = ("torch sdpa", "cudnn paged")


def varied_lengths(count: int = VARIED_BATCH, capacity: int = VARIED_CAPACITY,
                   seed: int = LENGTHS_SEED) -> np.ndarray:
    """The varied batch's seq_lens, drawn uniformly from [1, capacity]."""
    return np.random.default_rng(seed).integers(1, capacity, count, endpoint=True)


def kv_bytes(lengths, heads_kv: int = HEADS_KV, head_dim: int = HEAD_DIM,
             itemsize: int = ITEMSIZE) -> int:
    """Bytes of K and V a step must read: every sequence's tokens, both tensors."""
    return int(np.sum(lengths, dtype=np.int64)) * heads_kv * head_dim * 2 * itemsize


def page_order(batch: int, max_pages: int, seed: int = PAGES_SEED) -> np.ndarray:
    """The page tables int32 [batch, max_pages]: a random permutation of a pool of exactly
    batch * max_pages pages, so tables point all over it."""
    pool = np.random.default_rng(seed).permutation(batch * max_pages)
    return pool.reshape(batch, max_pages).astype(np.int32)


class CacheShape:
    """What a bench case's ``cache``, ``capacity`` and ``page_size`` say about its cache (the
    decode and kv_append cases share it)."""

    cache: str
    capacity: int
    page_size: int | None

    @property
    def paged(self) -> bool:
        return self.cache == "paged"

    @property
    def max_pages(self) -> int:
        return self.capacity // self.page_size if self.paged else 0

    def cache_fields(self) -> dict:
        """The descriptor's cache fields."""
        where = (dict(page_size=self.page_size, max_pages=self.max_pages) if self.paged
                 else dict(max_seq=self.capacity))
        return dict(cache=self.cache, **where)


@dataclass(frozen=True)
class DecodeCase(CacheShape):
    """One row's problem: ``batch`` sequences in caches of ``capacity`` tokens, contiguous or
    paged, every sequence full unless ``varied``; ``q_len`` new tokens each."""

    batch: int
    capacity: int
    cache: str = "contiguous"
    page_size: int | None = None
    q_len: int = 1
    varied: bool = False

    def lengths(self) -> np.ndarray:
        if self.varied:
            return varied_lengths(self.batch, self.capacity)
        return np.full(self.batch, self.capacity, np.int64)

    def descriptor(self) -> DecodeAttentionDescriptor:
        return DecodeAttentionDescriptor(batch=self.batch, q_len=self.q_len, heads_q=HEADS_Q,
                                         heads_kv=HEADS_KV, head_dim=HEAD_DIM, element="bf16",
                                         **self.cache_fields())

    @property
    def peers(self) -> tuple[str, ...]:
        """The peers this row runs: torch on contiguous caches (several new tokens through its
        mask), cuDNN on paged ones (one query per sequence: its paged graphs here)."""
        if not self.paged:
            return ("torch sdpa",)
        return ("cudnn paged",) if self.q_len == 1 else ()

    @property
    def label(self) -> str:
        size = (f"{self.batch} seqs 1-{self.capacity} (seed {LENGTHS_SEED})" if self.varied
                else f"B{self.batch} S{self.capacity}")
        cache = f"paged{self.page_size}" if self.paged else "contiguous"
        tokens = f" q_len{self.q_len}" if self.q_len > 1 else ""
        return f"bf16 H{HEADS_Q}/{HEADS_KV} d{HEAD_DIM} {size} {cache}{tokens}"


def _forms(batch: int, capacity: int, varied: bool = False) -> list[DecodeCase]:
    return [DecodeCase(batch, capacity, varied=varied)] + [
        DecodeCase(batch, capacity, "paged", size, varied=varied) for size in PAGE_SIZES]


def cases(quick: bool = False) -> list[DecodeCase]:
    """The rows' problems in order; quick: a small full batch, contiguous and paged 16, and a
    small varied batch."""
    if quick:
        return [DecodeCase(8, 1024), DecodeCase(8, 1024, "paged", 16),
                DecodeCase(8, 1024, varied=True)]
    rows = [case for batch, seq in FULL_SHAPES for case in _forms(batch, seq)]
    rows += _forms(VARIED_BATCH, VARIED_CAPACITY, varied=True)
    rows += [DecodeCase(64, 4096, q_len=SPECULATIVE),
             DecodeCase(64, 4096, "paged", 16, q_len=SPECULATIVE)]
    return rows


# ----------------------------------------------------------------------------- problems


@dataclass
class DecodeProblem:
    """One case's tensors: q [b, q_len, Hq, D]; our caches (NaN past each length) and the peers'
    finite ones (the same tensors when no sequence has padding); seq_lens int32 [b]; our out;
    the page table int32 [b, max_pages] when paged."""

    case: DecodeCase
    lengths: list[int]
    q: object
    k: object
    v: object
    seq_lens: object
    out: object
    table: object = None
    peer_k: object = None
    peer_v: object = None


def decode_problem(torch, case: DecodeCase, device: str = "cuda") -> DecodeProblem:
    """Random values in [-1, 1) for ``case`` on ``device``; NaN past each length in ours."""
    gen = torch.Generator(device=device).manual_seed(0)

    def uniform(*shape):  # made in place: the caches are gigabytes
        return torch.rand(shape, device=device, dtype=torch.bfloat16, generator=gen).mul_(
            2).sub_(1)

    b, lengths = case.batch, case.lengths()
    rows, tokens = ((b * case.max_pages, case.page_size) if case.paged
                    else (b, case.capacity))
    q = uniform(b, case.q_len, HEADS_Q, HEAD_DIM)
    k, v = uniform(rows, tokens, HEADS_KV, HEAD_DIM), uniform(rows, tokens, HEADS_KV, HEAD_DIM)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    table = None
    if case.paged:
        table = torch.from_numpy(page_order(b, case.max_pages)).to(device)
    p = DecodeProblem(case, [int(n) for n in lengths], q, k, v, seq_lens, torch.empty_like(q),
                      table, k, v)
    if min(p.lengths) < case.capacity:
        if case.peers:
            p.peer_k, p.peer_v = k.clone(), v.clone()
        _fill_padding(torch, p, float("nan"))
    return p


def _fill_padding(torch, p: DecodeProblem, value: float) -> None:
    """Writes ``value`` at every cache position past its sequence's length (paged: through the
    page table, into the pages each sequence owns)."""
    case = p.case
    positions = torch.arange(case.capacity, device=p.seq_lens.device)
    past = positions[None, :] >= p.seq_lens[:, None].long()  # [b, capacity]
    for cache in (p.k, p.v):
        if case.paged:
            pages = p.table.long()[:, positions // case.page_size]
            slots = (positions % case.page_size).expand_as(pages)
            cache[pages[past], slots[past]] = value
        else:
            cache[past] = value


# ----------------------------------------------------------------------------- rows


def _peers(torch, raw: RawCudnn, p: DecodeProblem, notes: list[str]) -> dict[str, Peer]:
    """The peers ``p``'s case names, on the finite caches; a failing one is a note."""
    builders = {
        "torch sdpa": lambda: torch_sdpa(torch, p.q, p.peer_k, p.peer_v, p.lengths, p.seq_lens),
        "cudnn paged": lambda: cudnn_paged(raw, p.q, p.peer_k, p.peer_v, p.table, p.seq_lens),
    }
    if not p.case.peers:
        notes.append(f"no peer at q_len {p.case.q_len} on a paged cache: cudnn paged runs one "
                     "query per sequence here")
    return build_peers({name: builders[name] for name in p.case.peers}, notes)


def our_calls(torch, plan_class, desc, args, notes: list[str]):
    """(run(), prepared step()) of our plan for ``desc`` on ``args``, run once, both launching on
    torch's current stream (so a host-bound row can be captured); None with the reason in
    ``notes`` where no SKU serves. Any other error is ours to fix. The decode and kv_append
    rows share it."""
    try:
        plan = plan_class.select(desc, device=0)
    except Unsupported as error:
        notes.append(f"ours: no SKU: {first_line(error)}")
        return None
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    plan.run(args, workspace=ws)
    notes.append(f"ours {plan.sku.id}, workspace {plan.workspace_size} B")
    return (lambda: plan.run(args, workspace=ws)), plan.prepare(args, workspace=ws)


def _ours(torch, p: DecodeProblem, notes: list[str]):
    """our_calls on ``p``; NaN or inf in out is noted."""
    args = DecodeAttentionArgs(p.q, p.k, p.v, p.seq_lens, p.out, p.table)
    calls = our_calls(torch, DecodeAttentionPlan, p.case.descriptor(), args, notes)
    if calls is not None and not bool(torch.isfinite(p.out).all()):
        notes.append("ours: out holds NaN or inf (the padding reached it)")
    return calls


def _differences(p: DecodeProblem, peers: dict[str, Peer]) -> list[str]:
    """Each peer's largest difference from our out (a wrongly told peer shows here)."""
    return [f"max |ours - {name}| {float((p.out.float() - peer.out.float()).abs().max()):.2e}"
            for name, peer in peers.items()]


def _figure(moved: int, copy_rate: float) -> Callable[[float], str]:
    """KV bytes read per second, and as a fraction of the copy's TB/s."""
    def figure(ms: float) -> str:
        tbps = moved / ms / 1e9
        return f"{tbps:.2f} TB/s, {tbps / copy_rate:.1%} of copy"

    return figure


def _row(torch, raw: RawCudnn, case: DecodeCase, copy_rate: float, reps: int,
         settle: Callable[[], object]) -> BenchRow:
    p = decode_problem(torch, case)
    notes: list[str] = []
    ours = _ours(torch, p, notes)
    peers = _peers(torch, raw, p, notes)
    torch.cuda.synchronize()
    figure = _figure(kv_bytes(p.lengths), copy_rate)
    fns = {name: peer.call for name, peer in peers.items()}
    if ours is None:
        return peers_only_row(OP, case.label, fns, reps, figure, notes, settle)
    run_call, step = ours
    notes += _differences(p, peers)
    notes.append(step_host_note(run_call, step, replay_floor(torch)))
    timings = time_contestants({"ours": run_call, **fns}, reps, settle=settle)
    notes.append(_against_same_bytes(torch, kv_bytes(p.lengths), timings.gpu_ms["ours"], reps))
    return timings.row(OP, case.label, figure, "; ".join(notes))


def _against_same_bytes(torch, moved: int, ours_ms: float, reps: int) -> str:
    """Ours as a fraction of a copy of the step's own KV bytes, timed here: a small cache's
    copy pays its launch and tail as the step does (B1 S32768's 134 MB copied at 2.92 TB/s on
    an H100, where the run's 1 GiB copy reads 3.01, docs/DECODE.md)."""
    rate = copy_tbps(moved, _copy_ms(torch, moved, reps))
    return (f"{moved / ours_ms / 1e9 / rate:.1%} of a copy of the same bytes ({rate:.2f} TB/s "
            f"in this row)")


def peers_only_row(op: str, label: str, fns: dict[str, Callable[[], object]], reps: int,
                   figure: Callable[[float], str], notes: list[str],
                   settle: Callable[[], object] | None = None) -> BenchRow:
    """A row without ours (no SKU): ours_ms NaN, the peers' times, the fastest peer's figure."""
    if not fns:
        return BenchRow(op, label, math.nan, "nothing ran", notes="; ".join(notes))
    timings = time_contestants(fns, reps, ours=next(iter(fns)), settle=settle)
    best = min(timings.gpu_ms, key=timings.gpu_ms.get)
    return BenchRow(op, label, math.nan, f"no ours; {best} {figure(timings.gpu_ms[best])}",
                    dict(timings.gpu_ms), "; ".join(filter(None, (*notes, timings.graph_notes))),
                    host_ms=dict(timings.host_ms), graph_ms=dict(timings.graph_ms),
                    host_bound=list(timings.host_bound))


def _copy_ms(torch, nbytes: int, reps: int) -> float:
    """GPU milliseconds of a device-to-device copy of ``nbytes``."""
    src = torch.rand(nbytes // ITEMSIZE, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return time_ms(lambda: dst.copy_(src), reps)


def _copy_row(torch, nbytes: int, reps: int) -> BenchRow:
    """A device-to-device copy of ``nbytes``, its rate counting bytes read and written."""
    ms = _copy_ms(torch, nbytes, reps)
    return BenchRow(OP, f"d2d copy {nbytes >> 20} MiB", ms, f"{copy_tbps(nbytes, ms):.2f} TB/s")


def copy_tbps(nbytes: int, ms: float) -> float:
    """A copy's rate in TB/s, counting the bytes it reads and the bytes it writes."""
    return 2 * nbytes / ms / 1e9


def run(quick: bool = False) -> list[BenchRow]:
    import torch

    reps = QUICK_REPS if quick else REPS
    nbytes = QUICK_COPY_BYTES if quick else COPY_BYTES
    copy = _copy_row(torch, nbytes, reps)
    torch.cuda.empty_cache()
    raw = RawCudnn(torch)
    settle = settle_by_copying(torch)  # before every burst: each contestant starts alike
    rows = []
    for case in cases(quick):
        rows.append(_row(torch, raw, case, copy_tbps(nbytes, copy.ours_ms), reps, settle))
        torch.cuda.empty_cache()  # this case's caches, before the next case's
    return rows + [copy]

"""The KV caches as the kernels address them (``DecodeCache``), and launching native/kv_append.cu:
``kv_append`` (a step's new tokens into the caches, issue 13 §2) and ``kv_cache_check`` (the
caches' checked mode, §6, which decode_attention's checked calls run too). Everything the kernels
read about lengths and pages is device data, so an append step replays from a CUDA graph with
new seq_lens and page tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..._internal.graph_replay import GraphedLaunches
from ...contracts.kv_cache import violation
from ...errors import InvalidArgument
from ...types import ElementKind
from .launch import PackedLaunch, get_kernel, launch, programmatic

__all__ = ["APPEND_FOLLOWS_PREVIOUS", "APPEND_PAGE_SIZES", "APPEND_SOURCE", "APPEND_STRIDE_BYTES",
           "KINDS", "DecodeCache", "append_call", "append_kernel_names", "append_shape",
           "check_call"]

APPEND_SOURCE = "kv_append.cu"  # kv_append, kv_cache_check
APPEND_THREADS = 1024  # kv_append's __launch_bounds__
# k_new's and v_new's strides, in bytes: kv_append finds a thread's 16 bytes with 32-bit byte
# strides (native/kv_append.cu).
APPEND_STRIDE_BYTES = 2**31
CHECK_THREADS = 256
KINDS = {"contiguous": 0, "paged": 1, "pointers": 2}  # native/kv_cache.cuh's Cache::kind
# kv_append launches as a programmatic dependent of the stream's previous kernel where the device
# can (launch.programmatic): its CTAs may start while that kernel ends, and wait for it before
# their first load (native/kv_append.cu's follow_previous_grid). Off: plain launches (the
# bench's and the variants script's baseline).
APPEND_FOLLOWS_PREVIOUS = True
# Page sizes whose paged kv_append kernels hold the size as a constant (native/kv_append.cu's
# OPFACADE_APPEND_FORMS); other sizes take the kernel that reads it.
APPEND_PAGE_SIZES = (16, 32, 64)


@dataclass(frozen=True)
class DecodeCache:
    """A cache as the kernels address it (native/kv_cache.cuh's Cache)."""

    kind: str
    hnd: bool
    capacity: int
    heads_kv: int
    dim: int
    dim_v: int
    page_size: int = 0
    max_pages: int = 0
    pages: int = 0

    @classmethod
    def of(cls, desc, pages: int = 0) -> DecodeCache:
        """From a decode_attention or kv_append descriptor; ``pages``: the pool's size."""
        paged = desc.cache == "paged"
        return cls(desc.cache, desc.kv_layout == "hnd", desc.capacity, desc.heads_kv,
                   desc.head_dim, desc.dim_v, desc.page_size if paged else 0,
                   desc.max_pages if paged else 0, pages)

    def args(self, k: int, v: int, table: int) -> tuple:
        return (np.uint64(k), np.uint64(v), np.uint64(table), np.int32(KINDS[self.kind]),
                np.int32(self.hnd), np.int32(self.capacity), np.int32(self.page_size),
                np.int32(self.max_pages), np.int32(self.pages), np.int32(self.heads_kv),
                np.int32(self.dim), np.int32(self.dim_v))


def append_call(element: ElementKind, device: int, cache: DecodeCache, sequences: int,
                q_len: int, k_new: int, k_strides: tuple[int, int, int], v_new: int,
                v_strides: tuple[int, int, int], k: int, v: int, table: int, seq_lens: int,
                stream: int) -> Callable[[], None]:
    """One launch writing every sequence's new tokens (strides in elements: batch, token,
    head, each below 2^31 bytes): a CTA per (sequence, token, group of kv heads, key or value),
    a thread per 16 bytes of a head's key or value (native/kv_append.cu)."""
    kernel = get_kernel(APPEND_SOURCE, append_kernel(element, cache), device)
    args = (np.uint64(k_new), *(np.int64(x) for x in k_strides), np.uint64(v_new),
            *(np.int64(x) for x in v_strides), *cache.args(k, v, table), np.uint64(seq_lens),
            np.int32(q_len))
    follows = APPEND_FOLLOWS_PREVIOUS and programmatic(device)
    return GraphedLaunches(lambda on: [PackedLaunch(
        kernel, *append_shape(cache, element, sequences, q_len), args, on, device,
        overlap_previous=follows)], stream, device)


def append_kernel(element: ElementKind, cache: DecodeCache) -> str:
    """kv_append's kernel for this element type and cache: one a form and layout, whose
    addressing is compiled in, and for the usual page sizes one with the size compiled in too
    (native/kv_append.cu)."""
    form = cache.kind
    if form == "paged" and cache.page_size in APPEND_PAGE_SIZES:
        form = f"paged{cache.page_size}"
    return _append_name(element, form, cache.hnd)


def append_kernel_names(elements: Iterable[ElementKind]) -> list[str]:
    """Every kernel append_kernel may name for these element types."""
    forms = [*KINDS, *(f"paged{size}" for size in APPEND_PAGE_SIZES)]
    return [_append_name(element, form, hnd) for element in elements for form in forms
            for hnd in (False, True)]


def _append_name(element: ElementKind, form: str, hnd: bool) -> str:
    # native/kv_append.cu's OPFACADE_APPEND_FORMS: kv_append_<T>_<form>_<layout>
    return f"kv_append_{element.value}_{form}_{'hnd' if hnd else 'nhd'}"


def append_shape(cache: DecodeCache, element: ElementKind, sequences: int, q_len: int
                 ) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """kv_append's (grid, block): threads (16-byte vectors of one head's key or value, heads),
    as many heads per CTA as 1024 threads hold; grid (sequences, q_len, 2 x head groups), the
    keys of a group in even z and its values in odd z (native/kv_append.cu)."""
    per_head = max(cache.dim, cache.dim_v) * element.itemsize // 16
    # At the head dims built (DIMS) a head's key (or value) takes at most 64 threads.
    heads = max(1, min(cache.heads_kv, APPEND_THREADS // per_head))
    return (sequences, q_len, 2 * -(-cache.heads_kv // heads)), (per_head, heads)


def verdict_error(verdict: np.ndarray, cache: DecodeCache, q_len: int) -> InvalidArgument:
    """The typed error for kv_cache_check's verdict (sequence, rule, detail, value)."""
    s, rule, detail, value = (int(x) for x in verdict)
    return violation(rule, s, detail, value, cache.capacity, q_len, cache.pages)


def check_call(device: int, cache: DecodeCache, sequences: int, q_len: int, k: int, v: int,
               table: int, seq_lens: int, stream: int, run: Callable[[], None]
               ) -> Callable[[], None]:
    """``run`` preceded by kv_cache_check: a call that synchronises the stream, reads the verdict
    and raises InvalidArgument naming the argument and its first bad index instead of
    running. Checked mode's price: a host sync per call, so it cannot be captured."""
    import cupy

    with cupy.cuda.Device(device):
        verdict = cupy.zeros(4, dtype=cupy.int32)
    kernel = get_kernel(APPEND_SOURCE, "kv_cache_check", device)
    args = (*cache.args(k, v, table), np.uint64(seq_lens), np.int32(sequences), np.int32(q_len),
            np.uint64(verdict.data.ptr))
    host = np.empty(4, dtype=np.int32)

    def check_then_run() -> None:
        launch(kernel, (1,), (CHECK_THREADS,), args, stream, device)
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, verdict.data.ptr, host.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream)
        cupy.cuda.runtime.streamSynchronize(stream)
        if host[0] >= 0:
            raise verdict_error(host, cache, q_len)
        run()

    return check_then_run

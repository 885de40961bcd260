"""The driver's runtime (``_internal/driver.py``) on a real GPU: the same answers as CuPy's runtime,
scratch from the stream-ordered allocator, a capture seen as one; and a torch user's first SDPA
forward and backward in a fresh process import no CuPy (its import alone cost 107-132 ms of that
first call on the lent H100s). (The NVRTC kernels still load and launch through CuPy, so a family
with NVRTC SKUs among its candidates, linear's backward say, imports it when it screens them.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from opfacade._internal.driver import driver_runtime

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")


def test_same_answers_as_cupys_runtime():
    runtime, theirs = driver_runtime(), cupy.cuda.runtime
    assert runtime is not None
    assert runtime.getDeviceCount() == theirs.getDeviceCount()
    for device in range(theirs.getDeviceCount()):
        ours, expected = runtime.getDeviceProperties(device), theirs.getDeviceProperties(device)
        for key in ("major", "minor", "multiProcessorCount", "name"):
            assert ours[key] == expected[key], key
    previous = theirs.getDevice()
    try:
        for device in range(theirs.getDeviceCount()):
            runtime.setDevice(device)
            assert runtime.getDevice() == theirs.getDevice() == device
            assert torch.cuda.current_device() == device
    finally:
        theirs.setDevice(previous)
    assert runtime.getDevice() == previous


def test_scratch_freed_from_a_thread_that_never_set_a_device():
    """clear_caches frees the stream scratch with cuMemFree on whichever thread calls it; a new
    thread has no context current (the runtime would make device 0's current, and so must we)."""
    import threading

    from opfacade._internal.memory import StreamScratch

    scratch = StreamScratch()
    stream = torch.cuda.current_stream().cuda_stream
    assert scratch.pointer(4096, torch.cuda.current_device(), stream)
    failures = []

    def clear():
        try:
            scratch.clear()
        except Exception as error:  # reported on the test's thread
            failures.append(error)

    worker = threading.Thread(target=clear)
    worker.start()
    worker.join()
    assert failures == [] and len(scratch) == 0
    runtime = driver_runtime()
    pointer = runtime.mallocAsync(1 << 16, stream)
    torch.cuda.synchronize()
    runtime.free(pointer)  # on the test's thread, torch's context current


def test_ops_run_from_a_thread_that_made_no_cuda_call(monkeypatch):
    """A thread whose first CUDA work is an opfacade call, with torch's caching allocator serving
    its tensors (so no runtime call there made a context current): on an H100 run()'s capture
    check raised CUDA_ERROR_INVALID_CONTEXT there (scripts/sdpa_backward_gap_probe.py
    --threads). The torch ops' forward and backward, then plan.run with a workspace past its
    graph's capture, give the main thread's bits."""
    import opfacade
    import opfacade.torch as oft
    from opfacade._internal import graph_replay

    monkeypatch.setattr(graph_replay, "LIBRARY_CAPTURE_AT", 4)  # replays within a few calls
    gen = torch.Generator(device="cuda").manual_seed(5)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = (torch.randn(2, 4, 128, 64, generator=gen, **bf16).requires_grad_()
               for _ in range(3))
    x = torch.randn(64, 96, generator=gen, **bf16).requires_grad_()
    w = torch.randn(128, 96, generator=gen, **bf16).requires_grad_()
    grad_attention = torch.randn(2, 4, 128, 64, generator=gen, **bf16)
    grad_linear = torch.randn(64, 128, generator=gen, **bf16)
    plan = opfacade.SdpaForwardPlan.cached(opfacade.SdpaDescriptor(
        batch=2, heads_q=4, heads_kv=4, seq_q=128, seq_kv=128, head_dim=64, element="bf16"))
    workspace = torch.empty(max(plan.workspace_size, 256), dtype=torch.uint8, device="cuda")
    qd, kd, vd = (t.detach() for t in (q, k, v))

    def step():
        # First the torch ops: the sdpa forward's run() (no workspace) asks whether the stream
        # is captured before anything else reaches the driver. (A cuDNN execute first would
        # have made a context current through the runtime.)
        out = oft.sdpa(q, k, v, is_causal=True, deterministic=True)
        y = oft.linear(x, w, activation="relu", deterministic=True)
        grads = torch.autograd.grad((out, y), (q, k, v, x, w), (grad_attention, grad_linear))
        planned = torch.empty_like(qd)
        for _ in range(8):
            plan.run(opfacade.SdpaArgs(qd, kd, vd, planned), workspace=workspace)
        return [out, y, *grads, planned]

    expected = [t.clone() for t in step()]  # also leaves the caching allocator warm
    for before, after in zip(expected, _on_a_fresh_thread(step), strict=True):
        assert torch.equal(before, after)


def _on_a_fresh_thread(step) -> list:
    """``step()``'s tensors (cloned there) from a new thread, after the GPU has finished; its
    error, if it raised, raised here."""
    import threading

    torch.cuda.synchronize()
    found, failures = [], []

    def work():
        try:
            found.extend(t.clone() for t in step())
        except Exception as error:  # reported on the test's thread
            failures.append(error)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    if failures:
        raise failures[0]
    return found


@pytest.mark.parametrize("first", ["kv_append", "decode_attention"])
def test_the_serving_ops_run_from_a_thread_that_made_no_cuda_call(first):
    """A serving engine's worker thread whose first CUDA work is kv_append or a decode step
    (NVRTC kernels launched through libcuda): the main thread's bits."""
    import opfacade.torch as oft

    gen = torch.Generator(device="cuda").manual_seed(6)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    caches = [torch.randn(4, 256, 2, 64, generator=gen, **bf16) for _ in range(2)]
    lens = torch.tensor([1, 2, 100, 256], dtype=torch.int32, device="cuda")
    k_new, v_new = (torch.randn(4, 1, 2, 64, generator=gen, **bf16) for _ in range(2))
    q = torch.randn(4, 1, 8, 64, generator=gen, **bf16)

    # A pair of caches for each run, made here: a clone on the thread would be CUDA work first.
    pairs = [[cache.clone() for cache in caches] for _ in range(2)]

    def step():
        k_cache, v_cache = pairs.pop()
        if first == "kv_append":
            oft.kv_append(k_new, v_new, k_cache, v_cache, lens)
        out, lse = oft.decode_attention(q, k_cache, v_cache, lens, return_lse=True)
        return [k_cache, v_cache, out, lse]

    expected = [t.clone() for t in step()]
    for before, after in zip(expected, _on_a_fresh_thread(step), strict=True):
        assert torch.equal(before, after)


def test_f32_attention_loads_and_launches_its_kernels_from_a_fresh_thread():
    """The true-f32 attention kernels go through CuPy's launch and their module loads through
    launch.on_device. Here a fresh thread is the first to run them (head dim 96, which no other
    GPU test's torch op uses), so both the loads and the launches are its first CUDA work; the
    main thread then gives the same bits."""
    import opfacade.torch as oft

    gen = torch.Generator(device="cuda").manual_seed(7)
    f32 = {"device": "cuda", "dtype": torch.float32}
    q, k, v = (torch.randn(1, 2, 72, 96, generator=gen, **f32).requires_grad_()
               for _ in range(3))
    grad_out = torch.randn(1, 2, 72, 96, generator=gen, **f32)

    def step():
        out = oft.sdpa(q, k, v, is_causal=True, deterministic=True)
        return [out, *torch.autograd.grad(out, (q, k, v), grad_out)]

    on_thread = _on_a_fresh_thread(step)
    for before, after in zip(on_thread, step(), strict=True):
        assert torch.equal(before, after)


def test_stream_ordered_scratch_and_capture():
    runtime = driver_runtime()
    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    pointer = runtime.mallocAsync(1 << 20, handle)
    assert pointer != 0 and pointer % 256 == 0
    # The block is device memory the stream's work can use: fill it and read it back.
    cupy.cuda.runtime.memsetAsync(pointer, 7, 1 << 20, handle)
    stream.synchronize()
    copy = cupy.empty(16, dtype=cupy.uint8)
    cupy.cuda.runtime.memcpy(copy.data.ptr, pointer, 16, 3)  # device to device
    assert copy.get().tobytes() == bytes([7] * 16)
    runtime.freeAsync(pointer, handle)
    stream.synchronize()
    assert not runtime.streamIsCapturing(handle)
    graph = torch.cuda.CUDAGraph()
    seen = []
    with torch.cuda.stream(stream):
        x = torch.zeros(4, device="cuda")
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            x.add_(1)
            seen.append(runtime.streamIsCapturing(handle))
    assert seen == [seen[0]] and seen[0] != 0
    assert not runtime.streamIsCapturing(handle)


FIRST_CALL = r"""
import importlib.abc, json, sys, traceback
imported_by = {}

class Watch(importlib.abc.MetaPathFinder):
    # Every search for CuPy (opfacade asks importlib.util.find_spec whether it is installed,
    # which imports nothing); reported only if CuPy ends up imported.
    def find_spec(self, name, path=None, target=None):
        if name == "cupy":
            imported_by.setdefault("cupy", []).append("".join(traceback.format_stack(limit=25)))
        return None

sys.meta_path.insert(0, Watch())
import torch
import opfacade.torch as oft
gen = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
           .requires_grad_() for _ in range(3))
out = oft.sdpa(q, k, v, is_causal=True)
out.float().sum().backward()
torch.cuda.synchronize()
searches = imported_by.get("cupy") if "cupy" in sys.modules else None
print(json.dumps({"cupy": searches and "\n".join(searches),
                  "finite": bool(out.isfinite().all())}))
"""


def test_first_torch_sdpa_imports_no_cupy(tmp_path):
    done = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "OPFACADE_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["finite"]
    assert result["cupy"] is None, f"CuPy imported by:\n{result['cupy']}"

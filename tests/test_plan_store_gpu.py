"""cuDNN's plan store on a GPU for the ragged (varlen) and paged (decode) graphs: a new process
with the cache an earlier one left deserializes the graphs and gives the same bits. (The dense
SDPA graphs' round trip is test_torch_gpu.py's warm-start test; here, dense graphs deserialized
after a run on a stream the caller has destroyed since, a process loading its own entry
again after the plan holding it was freed, and on two GPUs, one entry serving both.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

CHILD = r"""
import hashlib, json, sys
import torch
from opfacade._backends.cudnn import plan_store
loads = [0]
counted = plan_store.load
def counting(key, handle):
    graph = counted(key, handle)
    loads[0] += graph is not None
    return graph
plan_store.load = counting
generator = torch.Generator(device="cuda").manual_seed(7)

def randn(*shape):
    return torch.randn(shape, device="cuda", generator=generator).to(torch.bfloat16)

if sys.argv[1] == "varlen":
    import opfacade.torch as oft
    cu = torch.tensor([0, 100, 100, 356, 357], device="cuda", dtype=torch.int32)
    q, k, v = (randn(357, h, 64).requires_grad_() for h in (4, 2, 2))
    out = oft.varlen_attention(q, k, v, cu, cu, max_seqlen_q=256, max_seqlen_kv=256,
                               causal="bottom_right", deterministic=True)
    out.backward(randn(*out.shape))
    results = (out, q.grad, k.grad, v.grad)
elif sys.argv[1] == "streams":
    # Each plan runs on a CuPy stream of its own, destroyed after its run (as verify does): the
    # cuDNN handle then names a dead stream when the next graph is deserialized.
    import cupy
    from opfacade import Plan, PlanPreference, SdpaArgs, SdpaDescriptor
    results = []
    for element, dtype in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        desc = SdpaDescriptor(batch=1, heads_q=4, heads_kv=4, seq_q=192, seq_kv=192,
                              head_dim=64, element=element)
        plan = Plan.select(desc, PlanPreference(backends={"cudnn"}), device=0)
        q, k, v = (torch.randn(1, 4, 192, 64, device="cuda", generator=generator).to(dtype)
                   for _ in range(3))
        out = torch.empty_like(q)
        torch.cuda.synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        plan.run(SdpaArgs(q, k, v, out), stream=stream.ptr)
        stream.synchronize()
        del stream
        plan.free()
        results.append(out)
elif sys.argv[1] in ("again", "devices"):
    # One problem selected again and again, its plan freed after each run: every selection after
    # the first (a cold process) or every one (a warm process) finds the graph in the store, this
    # process's own entry, and must give the first run's bits. "again": on cuda:0, the second
    # run on a CuPy stream destroyed after it (as verify does); "devices": on cuda:0, cuda:1,
    # cuda:1 and cuda:0 with cuda:0 current throughout (the identity names the model, not the
    # index).
    import cupy
    from opfacade import Plan, PlanPreference, SdpaArgs, SdpaDescriptor
    desc = SdpaDescriptor(batch=2, heads_q=4, heads_kv=2, seq_q=200, seq_kv=328, head_dim=128,
                          element="bf16", causal="bottom_right")
    tensors = [torch.randn(shape, device="cuda", generator=generator).to(torch.bfloat16)
               for shape in ((2, 4, 200, 128), (2, 2, 328, 128), (2, 2, 328, 128))]
    steps = ([(0, False), (0, True), (0, False)] if sys.argv[1] == "again"
             else [(0, False), (1, False), (1, False), (0, False)])
    outs = []
    for device, on_a_stream_of_its_own in steps:
        stream = cupy.cuda.Stream(non_blocking=True) if on_a_stream_of_its_own else None
        plan = Plan.select(desc, PlanPreference(backends={"cudnn"}), device=device)
        q, k, v = (t.to(f"cuda:{device}") for t in tensors)
        out = torch.full_like(q, float("nan"))
        torch.cuda.synchronize(device)
        plan.run(SdpaArgs(q, k, v, out), stream=None if stream is None else stream.ptr)
        torch.cuda.synchronize(device)
        del stream
        plan.free()
        outs.append(out.cpu())
    assert torch.cuda.current_device() == 0
    assert all(torch.equal(out, outs[0]) for out in outs), "a reloaded graph changed the bits"
    results = outs[:1]
else:
    from opfacade import (DecodeAttentionArgs, DecodeAttentionDescriptor, Plan,
                          PlanPreference)
    desc = DecodeAttentionDescriptor(batch=4, element="bf16", cache="paged", kv_layout="nhd",
                                     page_size=16, max_pages=8, heads_q=8, heads_kv=2,
                                     head_dim=128)
    plan = Plan.select(desc, PlanPreference(backends={"cudnn"}), device=0)
    assert plan.sku.id == "decode_attention.cudnn.bf16", plan.sku.id
    pages = torch.randperm(32, device="cuda", generator=generator).int().view(4, 8)
    lens = torch.tensor([0, 1, 37, 128], device="cuda", dtype=torch.int32)
    q = randn(4, 1, 8, 128)
    out = torch.empty_like(q)
    plan.run(DecodeAttentionArgs(q, randn(32, 16, 2, 128), randn(32, 16, 2, 128), lens, out,
                                 pages))
    results = (out,)
torch.cuda.synchronize()
digest = hashlib.sha256()
for t in results:
    digest.update(t.detach().view(torch.int16).cpu().numpy().tobytes())
print(json.dumps({"loaded": plan_store.loaded_count(), "loads": loads[0],
                  "bits": digest.hexdigest()}))
"""


def _first_result(kind: str, cache) -> dict:
    env = {**os.environ, "OPFACADE_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", CHILD, kind], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("kind", "graphs"), [("varlen", 2), ("decode", 1)])
def test_a_new_process_deserializes_the_same_ragged_and_paged_plans(kind, graphs, tmp_path):
    pytest.importorskip("torch")
    cold = _first_result(kind, tmp_path)
    warm = _first_result(kind, tmp_path)
    assert cold["loaded"] == 0
    assert warm["loaded"] >= graphs  # the forward (and the deterministic backward)
    assert warm["bits"] == cold["bits"]


def test_a_graph_deserializes_after_a_run_on_a_stream_destroyed_since(tmp_path):
    """Found by `opfacade verify` on a warm store (H200, forty-fifth session): the handle still
    named the destroyed stream of the last run, and the frontend's deserialize of the next graph
    failed on it or segfaulted. Builds now bind the handle to a stream that always exists."""
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    cold = _first_result("streams", tmp_path)
    warm = _first_result("streams", tmp_path)
    assert cold["loaded"] == 0
    assert warm["loaded"] == 2
    assert warm["bits"] == cold["bits"]


def test_a_process_loads_its_own_entry_again_after_a_free(tmp_path):
    """Before the forty-seventh session a process never deserialized an entry it had stored, nor
    one twice (an H100 segfault after a free, whose likely cause, a handle naming a destroyed
    stream, was fixed in the forty-fifth). Now a selection after a free loads the graph the
    process built, and a new process loads it at each selection."""
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    cold = _first_result("again", tmp_path)
    warm = _first_result("again", tmp_path)
    assert (cold["loads"], cold["loaded"]) == (2, 1)  # built once, then its own entry twice
    assert (warm["loads"], warm["loaded"]) == (3, 1)
    assert warm["bits"] == cold["bits"]


def test_one_entry_serves_both_gpus_of_one_model(tmp_path):
    """Two GPUs of one model in one process: the graph built on cuda:0 is loaded for cuda:1 and
    back, freed between, and every run gives the same bits (forty-eighth session; before it, a
    process loaded an entry only for the device it first used it on)."""
    pytest.importorskip("torch")
    from opfacade._internal.device import device_count, device_name

    if device_count() < 2 or device_name(0) != device_name(1):
        pytest.skip("needs two GPUs of one model")
    cold = _first_result("devices", tmp_path)
    warm = _first_result("devices", tmp_path)
    assert (cold["loads"], cold["loaded"]) == (3, 1)  # built on cuda:0, then loaded three times
    assert (warm["loads"], warm["loaded"]) == (4, 1)
    assert warm["bits"] == cold["bits"]

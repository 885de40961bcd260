"""When a process that deserialized cuDNN plans from the plan store crashes: each scenario runs in
its own process (a segfault there is a result, not the end of the probe) over one store that a
first process filled, and says how far it got.

Found by `opfacade verify --op sdpa_forward` in a fresh process on a warm store (forty-fifth
session, H200): the f16 SKU's graphs were deserialized, run and freed, and the bf16 SKU's first
deserialize failed ("cuda_stream_is_capturing(...) failed with invalid resource handle") or
segfaulted inside the frontend. verify runs each problem on a new CuPy stream, which it destroys
after; the cuDNN handle still held it. The first call's scenarios (runs on the default stream,
frees, builds between loads) all passed; this call's run on a destroyed stream, with and without
graphs._build's rebinding of the handle (cudnn/runtime.bind_build_stream).

    python3 scripts/plan_store_free_probe.py [out.json]

A scenario is a list of steps on dense SDPA forward problems (bf16 or f16, B1 H4 S256 d64; "f16c"
is the f16 problem causal, "f16new" one of S320 that the store does not hold):
    run:P    select (deserialize or build) and run P's cuDNN plan, keep the plan
    gone:P   the same, run on a new CuPy stream that is destroyed after the run
    free:P   free P's plan (its graph goes with it)
    keep     from here on, keep every deserialized graph referenced for the process's life
    nofix    from here on, builds leave the handle on its last run's stream (the code before
             bind_build_stream)
    once     from here on, the store's rule before the forty-seventh session: no entry loaded
             twice, none this process stored
Each step prints how many graphs the store has handed back so far ("loads", every one counted) and
a run step a hash of its output's bytes (inputs drawn from a generator seeded by the problem's
name), so a graph loaded again can be compared with the one that ran before. The forty-seventh
session's first call ran the "again" scenarios on the old code with a "lift" step that cleared
the store's record of what the process had touched (catalog/probes/plan_store_again_H200.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from probe_record import write_to_argument  # beside this script

CHILD = r"""
import json, sys
import torch
from opfacade import Plan, PlanPreference, SdpaArgs, SdpaDescriptor
from opfacade._backends.cudnn import plan_store

PROBLEMS = {"bf16": dict(element="bf16"), "f16": dict(element="f16"),
            "f16c": dict(element="f16", causal="top_left"), "f16new": dict(element="f16", seq=320),
            # Problems no other scenario builds, for this process's own entries.
            "own1": dict(element="f16", seq=384), "own2": dict(element="bf16", seq=448),
            "own3": dict(element="f16", seq=512)}
plans, kept, digest, loads = {}, [], None, [0]
counted = plan_store.load
def counting(key, handle, load=counted):
    graph = load(key, handle)
    loads[0] += graph is not None
    return graph
plan_store.load = counting
for step in sys.argv[1:]:
    verb, _, name = step.partition(":")
    if verb == "keep":
        load = plan_store.load
        def keeping(key, handle, load=load):
            graph = load(key, handle)
            if graph is not None:
                kept.append(graph)
            return graph
        plan_store.load = keeping
    elif verb == "once":
        touched, loading, storing = set(), plan_store.load, plan_store.store
        def load_once(key, handle, load=loading):
            identity = plan_store._identity(key)
            if identity in touched:
                return None
            touched.add(identity)
            return load(key, handle)
        def store_once(key, graph, store=storing):
            touched.add(plan_store._identity(key))
            store(key, graph)
        plan_store.load, plan_store.store = load_once, store_once
    elif verb == "nofix":
        from opfacade._backends.cudnn import runtime
        runtime.bind_build_stream = lambda handle: None
    elif verb in ("run", "gone"):
        fields = dict(PROBLEMS[name])
        seq = fields.pop("seq", 256)
        desc = SdpaDescriptor(batch=1, heads_q=4, heads_kv=4, seq_q=seq, seq_kv=seq, head_dim=64,
                              **fields)
        plan = Plan.select(desc, PlanPreference(backends={"cudnn"}), device=0)
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[desc.element]
        gen = torch.Generator(device="cuda").manual_seed(sum(map(ord, name)))
        q, k, v = (torch.randn(1, 4, seq, 64, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(3))
        out = torch.empty_like(q)
        if verb == "gone":
            import cupy
            torch.cuda.synchronize()  # the inputs, written on torch's stream
            stream = cupy.cuda.Stream(non_blocking=True)
            plan.run(SdpaArgs(q, k, v, out), stream=stream.ptr)
            stream.synchronize()
            del stream  # cudaStreamDestroy: the handle still names it
        else:
            plan.run(SdpaArgs(q, k, v, out))
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        import hashlib
        digest = hashlib.sha256(out.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
        plans[name] = plan
    elif verb == "free":
        plans.pop(name).free()
    print(json.dumps({"done": step, "loaded": plan_store.loaded_count(), "loads": loads[0],
                      "out": digest}), flush=True)
    digest = None
print(json.dumps({"finished": True}), flush=True)
"""

SETUP = ["run:bf16", "run:f16", "run:f16c"]
SCENARIOS = {
    "run f16, free, run bf16 (verify's order, the default stream)": ["run:f16", "free:f16",
                                                                      "run:bf16"],
    "run f16, run bf16, free both, run f16c": ["run:f16", "run:bf16", "free:f16", "free:bf16",
                                                 "run:f16c"],
    "keep; run f16, free, run bf16": ["keep", "run:f16", "free:f16", "run:bf16"],
    "nofix; f16 on a stream since destroyed, run bf16": ["nofix", "gone:f16", "run:bf16"],
    "nofix; f16 on a stream since destroyed, free, run bf16": ["nofix", "gone:f16", "free:f16",
                                                               "run:bf16"],
    "f16 on a stream since destroyed, run bf16": ["gone:f16", "run:bf16"],
    "f16 on a stream since destroyed, free, bf16 likewise, free, run f16c": [
        "gone:f16", "free:f16", "gone:bf16", "free:bf16", "run:f16c"],
    # Loaded again: what the store's once-per-process rule (before the forty-seventh session)
    # kept from happening.
    "again; own1 built, freed, selected again (its own entry)": ["run:own1", "free:own1",
                                                                "run:own1"],
    "again; f16 loaded three times, freed between": ["run:f16", "free:f16", "run:f16",
                                                      "free:f16", "run:f16"],
    "again; own2 on a stream since destroyed, freed, selected again": [
        "gone:own2", "free:own2", "gone:own2", "free:own2", "run:own2"],
    "again; own3 and bf16 interleaved, each freed and selected again twice": [
        "run:own3", "run:bf16", "free:own3", "free:bf16", "gone:own3", "run:bf16",
        "free:own3", "free:bf16", "run:own3", "run:bf16"],
    "once; f16 freed and selected again (the old rule: a build)": ["once", "run:f16",
                                                                   "free:f16", "run:f16"],
}


def _child(steps: list[str], cache: str) -> dict:
    env = {**os.environ, "OPFACADE_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", CHILD, *steps], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {"rc": done.returncode, "steps": lines,
            "stderr": done.stderr.strip()[-300:] if done.returncode else ""}


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        results["setup (fills the store)"] = _child(SETUP, cache)
        for name, steps in SCENARIOS.items():
            results[name] = found = _child(steps, cache)
            last = found["steps"][-1] if found["steps"] else {}
            print(f"{name}: rc {found['rc']}, last {last}", flush=True)
    write_to_argument({"scenarios": SCENARIOS, "results": results})


if __name__ == "__main__":
    main()

"""Which way of deserializing a serialized cuDNN SDPA plan works with this frontend: each way runs
in its own process (a segfault there is a result, not the end of the probe), executes the
deserialized graph and compares its output with the original's.

    python3 scripts/plan_store_probe.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

SETUP = r"""
import sys, torch, cudnn
handle = cudnn.create_handle()
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16, generator=g)
           for _ in range(3))
o = torch.empty_like(q)
"""

BUILD = SETUP + r"""
graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
tq, tk, tv = (graph.tensor(dim=list(t.shape), stride=list(t.stride()), uid=i,
                           data_type=cudnn.data_type.BFLOAT16) for i, t in enumerate((q, k, v)))
out, _ = graph.sdpa(tq, tk, tv, name="sdpa", generate_stats=False, attn_scale=0.125,
                    use_causal_mask=True)
out.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_uid(3)
out.set_data_type(cudnn.data_type.BFLOAT16)
graph.validate(); graph.build_operation_graph()
graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
graph.check_support(); graph.build_plans()
ws = torch.empty(max(graph.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
graph.execute({0: q, 1: k, 2: v, 3: o}, ws, handle=handle)
torch.cuda.synchronize()
data = graph.serialize()
print("serialized", type(data).__name__, len(data), bytes(data[:16]))
open(sys.argv[1], "wb").write(bytes(data))
torch.save(o.cpu(), sys.argv[1] + ".out")
"""

LOAD = SETUP + r"""
data = open(sys.argv[1], "rb").read()
way = sys.argv[2]
if way == "fresh-list":
    graph = cudnn.pygraph(); graph.deserialize(list(data))
elif way == "fresh-handle-list":
    graph = cudnn.pygraph(); graph.deserialize(handle, list(data))
elif way == "handle-graph-handle-list":
    graph = cudnn.pygraph(handle=handle); graph.deserialize(handle, list(data))
elif way == "handle-graph-list":
    graph = cudnn.pygraph(handle=handle); graph.deserialize(list(data))
elif way == "handle-graph-handle-bytes":
    graph = cudnn.pygraph(handle=handle); graph.deserialize(handle, data)
ws = torch.empty(max(graph.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
graph.execute({0: q, 1: k, 2: v, 3: o}, ws, handle=handle)
torch.cuda.synchronize()
print("equal", bool(torch.equal(o.cpu(), torch.load(sys.argv[1] + ".out"))))
"""

WAYS = ("fresh-list", "fresh-handle-list", "handle-graph-handle-list", "handle-graph-list",
        "handle-graph-handle-bytes")


def main() -> int:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        blob = str(Path(tmp) / "plan.bin")
        built = subprocess.run([sys.executable, "-c", BUILD, blob], capture_output=True,
                               text=True, timeout=300)
        print("build:", built.returncode, built.stdout.strip()[-300:], built.stderr[-600:])
        for way in WAYS:
            done = subprocess.run([sys.executable, "-c", LOAD, blob, way], capture_output=True,
                                  text=True, timeout=300)
            results[way] = {"rc": done.returncode, "out": done.stdout.strip()[-200:],
                            "err": done.stderr.strip()[-400:]}
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

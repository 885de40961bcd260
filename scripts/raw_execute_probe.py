"""Whether cuDNN SDPA graphs run through the frontend's raw-pointer call or its public execute,
for a graph built in this process and for one the plan store deserialized (a second process
with the same cache), and what each costs in host time.

    python3 scripts/raw_execute_probe.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CHILD = r"""
import time, torch
import opfacade.torch as oft
from opfacade.ops.sdpa import SdpaForwardPlan
from opfacade._backends.cudnn import graphs
q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = oft.sdpa(q, k, v, is_causal=True)
torch.cuda.synchronize()
for key, built in list(graphs.GRAPHS._entries.items()):
    launch = built.launch if hasattr(built, "launch") else None
    if launch is not None:
        print("raw:", launch.raw, "why public:", launch._why_public, "served by:", built.served_by)
for _ in range(100):
    oft.sdpa(q, k, v, is_causal=True)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(1000):
    oft.sdpa(q, k, v, is_causal=True)
print(f"host us per oft.sdpa: {(time.perf_counter() - start) * 1e3:.1f}")
torch.cuda.synchronize()
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as cache:
        for label in ("built here", "deserialized"):
            done = subprocess.run([sys.executable, "-c", CHILD],
                                  env={**os.environ, "OPFACADE_CACHE_DIR": cache},
                                  capture_output=True, text=True, timeout=300)
            print(f"===== {label}\n{done.stdout}{done.stderr[-2000:] if done.returncode else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

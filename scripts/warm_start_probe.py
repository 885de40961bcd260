"""Where the first SDPA forward+backward of a new process spends its time, cold and warm: the
warm-start bench's child with opfacade's DEBUG log (builds and loads with their milliseconds)
and the phases timed apart; the warm process also runs its first forward+backward under
cProfile (cumulative and own time), to name what the first call spends outside cuDNN's build.

    python3 scripts/warm_start_probe.py [B H S D]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, logging, sys, time
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.empty(1, device="cuda")
t1 = time.perf_counter()
import opfacade.torch as oft
t2 = time.perf_counter()
class Stamp(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        if " ms" in text or "plan store" in text or "compil" in text:
            print(f"  {(time.perf_counter() - t2) * 1e3:8.1f} ms  {text[:150]}", flush=True)
log = logging.getLogger("opfacade"); log.setLevel(logging.DEBUG); log.addHandler(Stamp())
shape = tuple(json.loads(sys.argv[1]))
q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
           for _ in range(3))
profile = None
if sys.argv[2] == "warm":
    import cProfile
    profile = cProfile.Profile()
torch.cuda.synchronize(); t3 = time.perf_counter()
if profile: profile.enable()
out = oft.sdpa(q, k, v, is_causal=True, deterministic=True); torch.cuda.synchronize()
t4 = time.perf_counter()
out.backward(torch.ones_like(out)); torch.cuda.synchronize()
t5 = time.perf_counter()
if profile:
    profile.disable()
print(json.dumps({"torch init": t1 - t0, "import opfacade.torch": t2 - t1,
                  "forward": t4 - t3, "backward": t5 - t4}))
if profile:
    import pstats
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    # Which modules the first call imported, slowest first (import time is inside the call).
    print("modules loaded:", len(sys.modules))
"""


def main(shape: list[int]) -> int:
    with (tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as bytecode,
          tempfile.TemporaryDirectory() as throwaway):
        # As the warm-start bench: Python's bytecode cache warmed first (_bench/warm_start.py).
        env = {**os.environ, "PYTHONPYCACHEPREFIX": bytecode, "PYTHONDONTWRITEBYTECODE": ""}
        for label, plans in (("bytecode warm-up", throwaway), ("cold", cache), ("warm", cache)):
            print(f"===== {label}", flush=True)
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(shape), label],
                                  env={**env, "OPFACADE_CACHE_DIR": plans},
                                  capture_output=True, text=True, timeout=600)
            if label != "bytecode warm-up":
                print(done.stdout[-20000:], done.stderr[-1500:] if done.returncode else "")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [2, 16, 4096, 128]))

"""Where the host time of the framework paths goes: cProfile of repeated tiny calls of the
functional forms and the torch ops (the bench's host rows), top functions by own time.

    python3 scripts/host_profile.py [calls]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from dropin_pieces import profile_of  # this directory is on sys.path

import opfacade
import opfacade.torch as oft


def main(calls: int) -> int:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, w, b = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16), torch.randn(64, **bf16)
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    paths = {
        "opfacade.linear": lambda: opfacade.linear(x, w, b, activation="gelu_tanh"),
        "oft.linear": lambda: oft.linear(x, w, b, activation="gelu_tanh"),
        "opfacade.sdpa": lambda: opfacade.sdpa(q, k, v),
        "oft.sdpa": lambda: oft.sdpa(q, k, v),
        "torch linear": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
    }
    for name, fn in paths.items():
        print(f"===== {name}: {calls} calls")
        print(profile_of(fn, calls, top=22))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))

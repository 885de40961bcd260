"""Host time of torch's allocation calls on the GPU, in the forms torch_empty can use
(opfacade/_internal/memory.py): torch.empty with the extents as separate arguments or as one
tuple, empty_strided, empty_like, new_empty, and torch.zeros both ways; for linear's 64x64 bf16
output and GELU aux and sdpa's [1, 1, 64, 1] f32 stats (the bench's host rows). The forms were
chosen on a development CPU; this checks them where the ops run. Host microseconds per call,
median of interleaved batches (opfacade._bench.common.host_us_interleaved), one process.

    python3 scripts/alloc_forms_probe.py [out.json]
"""

from __future__ import annotations

import sys

import torch
from gpt_profile import write_report  # this directory is on sys.path

from opfacade._bench.common import host_us_interleaved


def main() -> int:
    device = torch.device("cuda", torch.cuda.current_device())
    cases = {}
    for label, shape, dtype in (("64x64 bf16", (64, 64), torch.bfloat16),
                                ("1x1x64x1 f32", (1, 1, 64, 1), torch.float32)):
        like = torch.empty(shape, dtype=dtype, device=device)
        strides = like.stride()
        cases |= {
            f"{label}: empty(*shape)": lambda s=shape, d=dtype: torch.empty(*s, dtype=d,
                                                                            device=device),
            f"{label}: empty(shape)": lambda s=shape, d=dtype: torch.empty(s, dtype=d,
                                                                          device=device),
            f"{label}: empty_strided": lambda s=shape, t=strides, d=dtype: torch.empty_strided(
                s, t, dtype=d, device=device),
            f"{label}: empty_like": lambda x=like: torch.empty_like(x),
            f"{label}: new_empty": lambda x=like, s=shape: x.new_empty(s),
            f"{label}: zeros(*shape)": lambda s=shape, d=dtype: torch.zeros(*s, dtype=d,
                                                                            device=device),
            f"{label}: empty(shape).zero_()": lambda s=shape, d=dtype: torch.empty(
                s, dtype=d, device=device).zero_(),
        }
    cases["python call of nothing"] = lambda: None
    us = host_us_interleaved(cases, calls=200, rounds=15)
    for name, value in us.items():
        print(f"{value:7.2f} us  {name}", flush=True)
    write_report({"device": torch.cuda.get_device_name(), "host_us": us})
    return 0


if __name__ == "__main__":
    sys.exit(main())

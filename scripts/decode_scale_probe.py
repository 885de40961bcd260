"""Ours against the bench's peer as the grid grows: the bench's own rows (opfacade/_bench/
decode_attention.py's _row: settled bursts, the same problem for every contestant) at B16, B64,
B128 and B256 over caches of 4096, contiguous ("torch sdpa") and paged 16 ("cudnn paged"). If
ours trails the peer by a fixed time (a grid's end: its last CTAs drain the SMs unevenly), the
ratio rises with the batch; if by a rate, it stays.

    python3 scripts/decode_scale_probe.py [out.json] [--batches=16,64,128,256] [--seq=4096]
"""

from __future__ import annotations

import sys

import torch
from probe_record import write_to_argument  # beside this script

from opfacade._bench import decode_attention as bench
from opfacade._bench.common import settle_by_copying
from opfacade._bench.cudnn_peers import RawCudnn


def option(name: str, default: str) -> str:
    return next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith(f"--{name}=")),
                default)


def main() -> None:
    batches = [int(b) for b in option("batches", "16,64,128,256").split(",")]
    seq = int(option("seq", "4096"))
    copy = bench._copy_row(torch, bench.COPY_BYTES, bench.REPS)
    rate = bench.copy_tbps(bench.COPY_BYTES, copy.ours_ms)
    print(f"device copy {rate:.2f} TB/s")
    raw, settle = RawCudnn(torch), settle_by_copying(torch)
    rows = []
    for batch in batches:
        for case in (bench.DecodeCase(batch, seq), bench.DecodeCase(batch, seq, "paged", 16)):
            row = bench._row(torch, raw, case, rate, bench.REPS, settle)
            torch.cuda.empty_cache()
            ratios = {peer: ms / row.ours_ms for peer, ms in row.peers_ms.items()}
            print(f"{case.label:50s} ours {row.ours_ms:.4f} ms {row.figure:28s} " +
                  " ".join(f"{peer} {ms:.4f} ms {ratios[peer]:.3f}x"
                           for peer, ms in row.peers_ms.items()))
            rows.append(dict(case=case.label, ours_ms=row.ours_ms, figure=row.figure,
                             peers_ms=row.peers_ms, ratios=ratios))
    write_to_argument(dict(copy_tbps=rate, rows=rows))


if __name__ == "__main__":
    main()

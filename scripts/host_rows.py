"""The bench's host rows alone (SDPA run()/prepared against cuDNN's graph.execute, linear run()
against a raw cublasLtMatmul), for whichever opfacade is on the path: repeated before and after
a change in one GPU session, they show whether a difference in those rows is more than noise.

    python3 scripts/host_rows.py LABEL
"""

from __future__ import annotations

import importlib
import sys


def main(label: str) -> int:
    import cudnn
    import torch

    try:
        sdpa = importlib.import_module("opfacade._bench.sdpa")
        linear = importlib.import_module("opfacade._bench.linear")
    except ImportError:  # 0.1.0 named the families attention and gemm
        sdpa = importlib.import_module("opfacade._bench.attention")
        linear = importlib.import_module("opfacade._bench.gemm")
    raw = sdpa._Raw(torch, cudnn.create_handle())
    rows = sdpa._host_rows(torch, raw) + [linear._host_overhead_row(25)]
    for row in rows:
        peers = ", ".join(f"{name} {ms * 1e3:.2f}" for name, ms in row.peers_ms.items())
        print(f"{label} {row.case}: ours {row.ours_ms * 1e3:.2f} us; {peers}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

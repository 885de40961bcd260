"""Why the bench's B1 S32768 decode row reads below what the same step reads alone (74.4-74.8%
of a copy in the bench, 77-80% in scripts/decode_variants.py and decode_burst_probe.py): the
bench's own problem, our run() and the torch peer (``opfacade._bench.decode_attention``), timed
by the bench's time_interleaved with different neighbours:

- ``alone``: ours only;
- ``torch peer``: ours and the torch peer, as the bench row runs them;
- ``idle neighbour``: ours and a kernel that spins for about the torch peer's time and reads
  nothing (torch.cuda._sleep): a neighbour that leaves the memory idle;
- ``copy neighbour``: ours and a device copy of the same bytes: a neighbour that streams as
  hard as ours;
- ``write neighbour`` and ``read neighbour`` (with ``--rw``): a memset of those bytes (writes
  only) and a sum over them (reads only), to tell which half of the copy clears the state the
  torch peer and the spinning kernel leave (twenty-ninth session: 42.0-42.5 us beside those,
  40.5-41.1 alone after a copy; catalog/probes/decode_b1_neighbours_H200.json).

Each again with the prepared step (a graph replay) in place of run(). The bench's 1 GiB
copy is timed too, so each figure is given against both copies. Each set runs ROUNDS times in
turn; with --clocks, nvidia-smi (run by the caller) samples the SM clock, and each set's start
and end times are printed to line up with it.

    python3 scripts/decode_b1_neighbours_probe.py [out.json] [--rounds N] [--rw]

To see whether the driver reports a reason, sample the clocks' event reasons beside it:
``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,clocks_event_reasons.active
--format=csv,noheader -lms 20``.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from opfacade._bench import decode_attention as bench
from opfacade._bench.common import time_interleaved
from opfacade._bench.cudnn_peers import RawCudnn

ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
REPS = 20


def main() -> int:
    case = bench.DecodeCase(1, 32768)
    p = bench.decode_problem(torch, case)
    notes: list[str] = []
    run_call, step = bench._ours(torch, p, notes)
    peers = bench._peers(torch, RawCudnn(torch), p, notes)
    peer = peers["torch sdpa"].call
    moved = bench.kv_bytes(p.lengths)
    src = torch.empty(moved, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_interleaved({"copy": lambda: dst.copy_(src)}, REPS)["copy"]
    copy_rate = 2 * moved / copy_ms / 1e9
    # The bench's own denominator: a 1 GiB copy (bench.COPY_BYTES), timed the bench's way.
    big = torch.empty(bench.COPY_BYTES, dtype=torch.uint8, device="cuda")
    big_out = torch.empty_like(big)
    gib_rate = bench.copy_tbps(bench.COPY_BYTES, time_interleaved(
        {"copy": lambda: big_out.copy_(big)}, REPS)["copy"])
    peer_ms = time_interleaved({"peer": peer}, REPS)["peer"]
    # torch.cuda._sleep spins for a number of cycles: about the peer's time at ~1.7 GHz.
    cycles = int(peer_ms * 1e-3 * 1.7e9)
    sets = {
        "alone": {"ours": run_call},
        "torch peer": {"ours": run_call, "torch sdpa": peer},
        "idle neighbour": {"ours": run_call, "sleep": lambda: torch.cuda._sleep(cycles)},
        "copy neighbour": {"ours": run_call, "copy": lambda: dst.copy_(src)},
        "alone, prepared step": {"ours": step},
        "torch peer, prepared step": {"ours": step, "torch sdpa": peer},
        "idle neighbour, prepared step": {"ours": step,
                                          "sleep": lambda: torch.cuda._sleep(cycles)},
        "copy neighbour, prepared step": {"ours": step, "copy": lambda: dst.copy_(src)},
    }
    if "--rw" in sys.argv:
        words = src.view(torch.int32)
        sets["write neighbour"] = {"ours": run_call, "memset": lambda: dst.zero_()}
        sets["read neighbour"] = {"ours": run_call, "sum": lambda: words.sum()}
    found: dict[str, list[dict]] = {name: [] for name in sets}
    for round_ in range(ROUNDS):
        for name, fns in sets.items():
            began = time.time()
            ms = time_interleaved(fns, REPS)
            found[name].append({"ms": ms, "ours_of_copy": moved / ms["ours"] / 1e9 / copy_rate,
                                "ours_of_gib_copy": moved / ms["ours"] / 1e9 / gib_rate,
                                "began": began, "ended": time.time()})
            print(f"round {round_} {name:16} ours {ms['ours']:.4f} ms "
                  f"{moved / ms['ours'] / 1e9 / copy_rate:.1%} of copy  "
                  + "  ".join(f"{k} {v:.4f}" for k, v in ms.items() if k != "ours")
                  + f"  [{began:.2f} - {time.time():.2f}]"
                  + f"  {moved / ms['ours'] / 1e9 / gib_rate:.1%} of the 1 GiB copy")
    record = {"copy_tbps": copy_rate, "gib_copy_tbps": gib_rate, "peer_ms": peer_ms,
              "notes": notes, "sets": found}
    for path in (a for a in sys.argv[1:] if a.endswith(".json")):
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

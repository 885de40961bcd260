"""Where the decode step loses to the torch peer on small problems (issue 13): batches of 1 to
16 sequences over contiguous caches of 1024 to 8192 tokens, and a few over pages of 16 (bf16,
Hq 32, Hkv 8, d 128, q_len 1, every sequence full), shapes outside the bench's. Per case, each a
CUDA graph of STEPS calls timed in rotated rounds (median per call, us): our prepared step in
each of FORMS (decode.py's attributes set while it is prepared: as shipped, without the kq
tile's one-wave build, with it up to two CTAs an SM, and with the partial kernel launched
plainly), the shipped step's partial kernel alone (its first launch, captured by itself), and
"torch sdpa" (the bench's peer, contiguous caches). The partial grid's CTA count says how much
of the device a fixed 512-key chunk leaves busy. The forms' outputs are compared bitwise. (An
earlier run compared a build that prefetched its chunk into L2:
docs/experiments/decode-kq-one-wave-prefetch.patch.)

    python3 scripts/decode_small_grid_probe.py [out.json]
"""

from __future__ import annotations

import sys

import torch
from decode_programmatic_probe import (  # this directory is on sys.path
    graph_of,
    rotated_medians,
    run_cases,
)
from decode_variants import case_tensors

from opfacade import DecodeAttentionPlan
from opfacade._backends.nvrtc import decode as kernels
from opfacade._bench.decode_peers import torch_sdpa

BATCHES, LENGTHS, ROUNDS = (1, 2, 4, 8, 16), (1024, 2048, 4096, 8192), 5
PAGED = ((1, 1024), (1, 4096), (4, 2048), (8, 4096), (16, 2048))  # pages of 16
# contestant: decode.py attributes while it is prepared
FORMS: dict[str, dict] = {
    "ours": {}, "ours, no one-wave build": {"KQ_DEEP_GRIDS": ()},
    "ours, d4 to 2 waves": {"KQ_DEEP_GRIDS": ((0, 2.0),)},
    "ours, d4 to 2 waves, partial plain": {"KQ_DEEP_GRIDS": ((0, 2.0),),
                                           "PARTIAL_FOLLOWS_PREVIOUS": False},
    "ours, partial plain": {"PARTIAL_FOLLOWS_PREVIOUS": False}}


def case_row(batch: int, seq: int, cache: str = "contiguous") -> dict:
    desc, args, kv_bytes = case_tensors(batch, seq, cache, 16 if cache == "paged" else 0)
    plan = DecodeAttentionPlan.select(desc, device=0)
    stream = torch.cuda.Stream()
    contestants, outs, alive = {}, {}, []
    for name, settings in FORMS.items():
        saved = {attribute: getattr(kernels, attribute) for attribute in settings}
        try:
            for attribute, value in settings.items():  # read when a step is prepared
                setattr(kernels, attribute, value)
            mine = type(args)(args.q, args.k_cache, args.v_cache, args.seq_lens,
                              torch.empty_like(args.out), args.page_table)
            step = plan.prepare(mine, stream=stream)
        finally:
            for attribute, value in saved.items():
                setattr(kernels, attribute, value)
        alive += [mine, step]
        contestants[name] = graph_of([step], stream).replay
        outs[name] = mine.out
        if name == "ours":  # GraphedLaunches' direct launches: partial, then merge
            contestants["ours, partial kernel alone"] = graph_of([step._call._direct[0]],
                                                                 stream).replay
    if cache == "contiguous":
        peer = torch_sdpa(torch, args.q, args.k_cache, args.v_cache, [seq] * batch,
                          args.seq_lens)
        alive.append(peer)
        contestants["torch sdpa"] = graph_of([peer.call], stream).replay
    us, _ = rotated_medians(contestants, stream, ROUNDS)
    ctas = batch * desc.heads_kv * kernels.chunks(seq)  # one 4-row tile a kv head at q_len 1
    row = {"case": f"B{batch} S{seq} {cache}", "kv_bytes": kv_bytes, "partial_ctas": ctas,
           "sms": torch.cuda.get_device_properties(0).multi_processor_count, "us": us,
           "bits_equal": all(torch.equal(out, outs["ours"]) for out in outs.values()),
           "ours TB/s": kv_bytes / us["ours"] / 1e6}
    if "torch sdpa" in us:
        row.update({f"torch sdpa / {name}": us["torch sdpa"] / us[name] for name in FORMS})
    del contestants, alive
    return row


def main(out_path: str | None) -> int:
    cases = [(b, s, "contiguous") for b in BATCHES for s in LENGTHS]
    return run_cases(out_path, cases + [(b, s, "paged") for b, s in PAGED], case_row, ROUNDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))

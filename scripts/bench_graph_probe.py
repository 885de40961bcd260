"""What the bench's CUDA-graph re-timing measures, checked on one GPU in under a minute.

For the 64x8192x8192 bf16 linear forward and backward rows and the d64 B8 H16 S2048 causal SDPA
backward (the rows the H100 record marks host-bound), each contestant's burst, host and
graph-replay milliseconds per call, its graph's node and work-node counts, and the row as the
bench would report it; then that a replay of our graph writes our outputs (filled with NaN first)
with what a fresh call writes (bitwise, or within 1e-2 relative); then that a capture that fails
leaves the process timing the default stream, and what ``torch.cuda.graph`` leaves instead (the
first H100 run with graphs). The record is written after each step.

    python3 scripts/bench_graph_probe.py probe.json
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

LINEAR = (64, 8192, 8192)
SDPA = (64, 8, 16, 16, 2048)  # (head_dim, batch, heads_q, heads_kv, seq), causal
REPS = 10
REL_TOLERANCE = 1e-2


def _rows(torch):
    """(name, op, figure's flops, make the contest) of each probed row."""
    from opfacade._bench import linear, sdpa

    m, n, k = LINEAR
    d, b, hq, _, s = SDPA

    def sdpa_backward():
        import cudnn

        raw = sdpa._Raw(torch, cudnn.create_handle())
        p = sdpa.problem(torch, SDPA, causal=True)
        peers, _ = sdpa.torch_peers(torch, p)
        return sdpa.backward_contest(torch, raw, p, peers)

    return (
        (f"linear fwd bias+gelu bf16 {m}x{n}x{k}", "linear", 2.0 * m * n * k,
         lambda: linear.forward_contest(m, n, k)),
        (f"linear bwd dgelu+dbias+dx+dW bf16 {m}x{n}x{k}", "linear", 4.0 * m * n * k,
         lambda: linear.backward_contest(m, n, k)),
        (f"sdpa_backward bf16 d{d} B{b} H{hq}/{hq} S{s} causal", "sdpa_backward",
         sdpa._flops(b, hq, s, d, causal=True, backward=True), sdpa_backward),
    )


def _probe_row(torch, name: str, op: str, flops: float, contest) -> dict:
    from opfacade._bench import common, graph_timing

    gpu = common.time_interleaved(contest.fns, REPS)
    host = {n: us / 1e3 for n, us in
            common.host_us_interleaved(contest.fns, common.HOST_CALLS, rounds=5).items()}
    suspect = common.suspects(gpu, host)
    contestants = {n: {"burst_ms": gpu[n], "host_ms": host[n], "suspect": n in suspect}
                   for n in contest.fns}
    captured, failed = {}, {}
    try:
        for n, fn in contest.fns.items():
            make = contest.makers.get(n, lambda stream, fn=fn: fn)
            try:
                got = graph_timing.capture(torch, make, common.burst_calls(gpu[n]))
            except graph_timing.CaptureFailed as error:
                failed[n] = contestants[n]["capture_failed"] = str(error)
                continue
            captured[n] = got
            contestants[n].update(calls=got.calls, nodes=got.nodes, work_nodes=got.work_nodes)
        graph = graph_timing.replay_ms(torch, captured, REPS) if captured else {}
        for n, ms in graph.items():
            contestants[n]["graph_ms"] = ms
        check = (_check_replay(torch, contest, captured["ours"]) if "ours" in captured
                 else {"ok": False, "why": "ours not captured"})
    finally:
        graph_timing.release(torch, captured)
    row = common.judge(gpu, host, graph, failed).row(
        op, name, lambda ms: f"{flops / ms / 1e9:.0f} TFLOP/s", contest.notes)
    return {"row": name, "contestants": contestants, "ours_replay_check": check,
            "bench_row": asdict(row), "table": common.format_rows([row])}


def _check_replay(torch, contest, captured) -> dict:
    """Our outputs filled with NaN, then one replay of our graph, against a fresh call."""
    outputs = contest.outputs

    def outputs_after(run) -> list:
        for t in outputs:
            t.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        return [t.clone() for t in outputs]

    replayed = outputs_after(captured.graph.replay)
    fresh = outputs_after(contest.fns["ours"])
    unwritten = sum(int(torch.isnan(t).sum()) for t in replayed)
    bitwise = all(torch.equal(a, b) for a, b in zip(replayed, fresh, strict=True))
    rel = max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
              for a, b in zip(replayed, fresh, strict=True))
    return {"ok": unwritten == 0 and (bitwise or rel <= REL_TOLERANCE),
            "elements_unwritten_by_replay": unwritten, "bitwise_equal": bitwise,
            "max_relative_difference": rel}


def _failing(torch, fn):
    """``fn``, then a synchronize of the current stream: illegal while it is capturing."""
    def call() -> None:
        fn()
        torch.cuda.current_stream().synchronize()

    return call


def _failed_capture_checks(torch, fn) -> dict:
    """Our capture of a call that breaks the capture, then torch.cuda.graph's, each followed by a
    burst of ``fn``: after ours the process still times the default stream; after torch's, the
    current stream may be left on the capture stream, where the bursts time only the host."""
    from opfacade._bench import common, graph_timing

    before = common.time_interleaved({"fn": fn}, REPS)["fn"]
    result: dict = {"burst_ms_before": before}
    try:
        graph_timing.capture(torch, lambda stream: _failing(torch, fn), 4)
        result["ours"] = "captured (expected a failure)"
    except graph_timing.CaptureFailed as error:
        result["ours"] = f"failed as expected: {error}"
    default = torch.cuda.default_stream()
    result["ours_left_default_stream"] = torch.cuda.current_stream() == default
    result["burst_ms_after_ours"] = common.time_interleaved({"fn": fn}, REPS)["fn"]

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            _failing(torch, fn)()
        result["torch"] = "captured (expected a failure)"
    except Exception as error:  # what torch.cuda.graph raises is the finding
        result["torch"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    result["torch_left_default_stream"] = torch.cuda.current_stream() == default
    if not result["torch_left_default_stream"]:
        result["burst_ms_on_leaked_stream"] = common.time_interleaved({"fn": fn}, REPS)["fn"]
        torch.cuda.set_stream(default)
    torch.cuda.synchronize()
    return result


def _save(path: str, record: dict) -> None:
    with open(path, "w") as out:
        json.dump(record, out, indent=2)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    from opfacade._internal.device import device_name
    from opfacade.bench import _warm_up
    from opfacade.errors import BackendUnavailable
    from opfacade.verify import require_gpu

    try:
        device = require_gpu("the graph probe")
    except BackendUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    import torch

    started = time.perf_counter()
    record: dict = {"gpu": device_name(device), "torch": torch.__version__, "rows": []}
    _warm_up()
    for name, op, flops, make in _rows(torch):
        found = _probe_row(torch, name, op, flops, make())
        print(found["table"])
        for contestant, figures in found["contestants"].items():
            print(f"    {contestant:24} {json.dumps(figures)}")
        print(f"    ours replay check: {json.dumps(found['ours_replay_check'])}", flush=True)
        record["rows"].append(found)
        _save(argv[0], record)
    forward = _rows(torch)[0][3]()
    record["failed_capture"] = _failed_capture_checks(torch, forward.fns["ours"])
    print(f"failed capture: {json.dumps(record['failed_capture'])}")
    record["seconds"] = time.perf_counter() - started
    _save(argv[0], record)
    print(f"{record['seconds']:.1f} s; written to {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""GPU check of the true-f32 flash attention kernels (native/flash_f32.cu) on CUDA device 0.

    python3 scripts/flash_f32_check.py flash_f32_check.json

Every case runs the forward and the backward through opfacade._backends.nvrtc.flash_f32 on
inputs uniform in [-1, 1) and compares out, lse, dq, dk and dv with the float64 reference,
as ||got - ref|| / ||ref||. It also checks:
- no NaN anywhere (outputs are NaN-poisoned before each run, so an unwritten row shows);
- lse is exactly -inf on the rows without keys, and finite on all others;
- the backward is bitwise the same over 3 runs, each on its own freshly poisoned workspace;
- offsets of garbage (random, decreasing, huge, past the tensors' end) write nothing outside
  the outputs: every output and the workspace sit between guard regions of a sentinel, which
  must survive;
- the cases of D = Dv = 128 run again on the forwards this GPU does not pick (the wide one, and
  the 64-row one without the FP64 tensor cores), as other GPUs would;
and times forward and backward at B=2, H=16, S=4096, D=128 with CUDA events (4*B*H*S^2*D flops
forward, halved for causal; the backward counted as 2.5 times the forward).

Prints a summary, writes everything to the JSON file named by argv[1], and exits 1 on any
failure. Needs CuPy and numpy; about a minute on an H100, most of it the float64 reference.
"""

from __future__ import annotations

import json
import sys
import time

import cupy
import numpy as np

from opfacade._backends.nvrtc import flash_f32
from opfacade._backends.nvrtc.flash_f32 import (
    SHARED_PER_BLOCK,
    FlashProblem,
    FlashStrides,
    backward_call,
    backward_workspace_bytes,
    forward_call,
)
from opfacade._backends.reference import (
    sdpa_backward,
    sdpa_forward,
    varlen_backward,
    varlen_forward,
)
from opfacade.types import ArchSku

# The kernels' error is a few f32 roundings of each dot product (~1e-6 relative, measured
# worst 6e-7 on an emulator); a tenfold margin still catches any indexing or masking bug,
# whose error is of order 1.
TOLERANCE = 1e-5
SENTINEL = 0x7FC0DEAD  # a NaN payload that no kernel writes
GUARD = 4096  # sentinel elements before and after each buffer in the garbage runs
DETERMINISM_RUNS = 3
TIMING = dict(batch=2, heads=16, seq=4096, head_dim=128, runs=5)
DEVICE = 0

# Dense cases: batch, heads, seq_q/seq_kv, head_dim(_v); varlen cases: lens_q/lens_kv per
# sequence. layout "bshd" stores dense tensors tokens-outer; "padded" makes every row one
# element wider than D, so no stride is a multiple of 4 (the kernels' 4-byte copy path).
CASES = {
    "dense_d64": dict(batch=2, heads_q=4, heads_kv=4, seq_q=128, seq_kv=128, head_dim=64),
    "dense_d128": dict(batch=2, heads_q=4, heads_kv=4, seq_q=200, seq_kv=200, head_dim=128),
    "dense_odd_lengths": dict(batch=2, heads_q=4, heads_kv=4, seq_q=77, seq_kv=201,
                              head_dim=64),
    "dense_gqa4_d128": dict(batch=2, heads_q=8, heads_kv=2, seq_q=190, seq_kv=190,
                            head_dim=128),
    "dense_mqa": dict(batch=1, heads_q=8, heads_kv=1, seq_q=150, seq_kv=260, head_dim=64),
    "dense_causal_tl_prefill": dict(batch=2, heads_q=4, heads_kv=2, seq_q=100, seq_kv=300,
                                    head_dim=64, causal="top_left"),
    "dense_causal_br_prefill_d128": dict(batch=2, heads_q=4, heads_kv=1, seq_q=100, seq_kv=300,
                                         head_dim=128, causal="bottom_right"),
    "dense_causal_br_tall": dict(batch=1, heads_q=4, heads_kv=4, seq_q=300, seq_kv=100,
                                 head_dim=64, causal="bottom_right"),
    "dense_window": dict(batch=1, heads_q=4, heads_kv=2, seq_q=257, seq_kv=257, head_dim=64,
                         window=(48, 16)),
    "dense_window_causal_br_d128": dict(batch=1, heads_q=4, heads_kv=4, seq_q=130, seq_kv=333,
                                        head_dim=128, causal="bottom_right", window=(64, -1)),
    "dense_d128_dv64": dict(batch=2, heads_q=4, heads_kv=2, seq_q=150, seq_kv=150,
                            head_dim=128, head_dim_v=64, causal="top_left"),
    "dense_d64_dv128": dict(batch=2, heads_q=4, heads_kv=2, seq_q=133, seq_kv=171,
                            head_dim=64, head_dim_v=128, causal="bottom_right"),
    "dense_d32_causal_br": dict(batch=2, heads_q=4, heads_kv=2, seq_q=110, seq_kv=170,
                                head_dim=32, causal="bottom_right"),
    "dense_d96_gqa": dict(batch=2, heads_q=6, heads_kv=2, seq_q=131, seq_kv=131, head_dim=96),
    "dense_bshd": dict(batch=2, heads_q=4, heads_kv=2, seq_q=140, seq_kv=170, head_dim=64,
                       layout="bshd"),
    "dense_padded": dict(batch=2, heads_q=2, heads_kv=1, seq_q=99, seq_kv=130, head_dim=64,
                         causal="bottom_right", layout="padded"),
    "varlen_gqa4": dict(heads_q=8, heads_kv=2, lens_q=(0, 1, 77, 128, 200),
                        lens_kv=(0, 1, 77, 128, 200), head_dim=64),
    "varlen_causal_br_prefill_mqa_d128": dict(heads_q=4, heads_kv=1, lens_q=(1, 50, 20, 130),
                                              lens_kv=(64, 300, 0, 130), head_dim=128,
                                              causal="bottom_right"),
    "varlen_causal_tl": dict(heads_q=4, heads_kv=2, lens_q=(300, 7, 1), lens_kv=(100, 7, 33),
                             head_dim=64, causal="top_left"),
    "varlen_window_d128": dict(heads_q=4, heads_kv=2, lens_q=(90, 1, 0, 150),
                               lens_kv=(90, 5, 3, 150), head_dim=128, window=(32, 8)),
    "varlen_window_causal_br": dict(heads_q=4, heads_kv=4, lens_q=(40, 3, 65),
                                    lens_kv=(200, 3, 64), head_dim=64, causal="bottom_right",
                                    window=(20, -1)),
    "varlen_window_d96": dict(heads_q=4, heads_kv=2, lens_q=(70, 0, 1, 129),
                              lens_kv=(70, 3, 1, 129), head_dim=96, window=(24, 40)),
    "varlen_single_tokens": dict(heads_q=4, heads_kv=1, lens_q=(1,) * 9,
                                 lens_kv=(1, 1, 0, 1, 1, 1, 1, 1, 1), head_dim=64,
                                 causal="bottom_right"),
    "varlen_padded_d128": dict(heads_q=4, heads_kv=2, lens_q=(33, 0, 129), lens_kv=(70, 2, 129),
                               head_dim=128, causal="top_left", layout="padded"),
}


# ------------------------------------------------------------------------------------ tensors

def row_strides(array: cupy.ndarray, varlen: bool) -> tuple[int, int, int]:
    """(batch, token, head) strides in elements of a [B, H, S, D] or [T, H, D] view."""
    s = [stride // array.itemsize for stride in array.strides]
    return (0, s[0], s[1]) if varlen else (s[0], s[2], s[1])


def device_view(host: np.ndarray, layout: str) -> cupy.ndarray:
    """``host`` on the device in the case's layout (a view whose strides say where rows are)."""
    if layout == "bshd":  # [B, H, S, D] stored as [B, S, H, D]
        return cupy.asarray(np.ascontiguousarray(host.transpose(0, 2, 1, 3))).transpose(0, 2, 1, 3)
    if layout == "padded":
        buffer = cupy.full((*host.shape[:-1], host.shape[-1] + 1), np.nan, np.float32)
        view = buffer[..., : host.shape[-1]]
        view[...] = cupy.asarray(host)
        return view
    return cupy.asarray(host)


def poison(*arrays: cupy.ndarray) -> None:
    for array in arrays:
        array[...] = np.nan


def build(case: dict, rng: np.random.Generator):
    """The problem, host inputs, device tensors (inputs and NaN outputs) and strides."""
    varlen = "lens_q" in case
    d = case["head_dim"]
    dv = case.get("head_dim_v", d)
    hq, hkv = case["heads_q"], case["heads_kv"]
    layout = case.get("layout", "contiguous")
    if varlen:
        lens_q, lens_kv = case["lens_q"], case["lens_kv"]
        batch, tq, tkv = len(lens_q), sum(lens_q), sum(lens_kv)
        max_q, max_kv = max(lens_q), max(lens_kv)
        rows_q, rows_kv, lse_shape = (tq, hq), (tkv, hkv), (hq, tq)
    else:
        batch, max_q, max_kv = case["batch"], case["seq_q"], case["seq_kv"]
        tq, tkv = batch * max_q, batch * max_kv
        rows_q, rows_kv = (batch, hq, max_q), (batch, hkv, max_kv)
        lse_shape = (batch, hq, max_q)
    shapes = dict(q=(*rows_q, d), k=(*rows_kv, d), v=(*rows_kv, dv), dout=(*rows_q, dv))
    host = {name: rng.uniform(-1, 1, shape).astype(np.float32) for name, shape in shapes.items()}
    dev = {name: device_view(x, layout) for name, x in host.items()}
    for name, like in (("out", "dout"), ("dq", "q"), ("dk", "k"), ("dv", "v")):
        dev[name] = device_view(np.full(host[like].shape, np.nan, np.float32), layout)
    dev["lse"] = cupy.full(lse_shape, np.nan, np.float32)
    window = case.get("window", (-1, -1))
    problem = FlashProblem(batch=batch, heads_q=hq, heads_kv=hkv, head_dim=d, head_dim_v=dv,
                           max_seqlen_q=max_q, max_seqlen_kv=max_kv, total_q=tq, total_kv=tkv,
                           varlen=varlen, scale=float(d) ** -0.5, causal=case.get("causal"),
                           window_left=window[0], window_right=window[1])
    standard = FlashStrides.contiguous(problem)
    strides = FlashStrides(**{name: row_strides(dev[name], varlen)
                              for name in ("q", "k", "v", "out", "dout", "dq", "dk", "dv")},
                           lse=standard.lse)
    if varlen:
        offsets = [np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
                   for lens in (case["lens_q"], case["lens_kv"])]
        host["cu_q"], host["cu_kv"] = offsets
        dev["cu_q"], dev["cu_kv"] = (cupy.asarray(x) for x in offsets)
    return problem, host, dev, strides


def address(dev: dict, name: str) -> int:
    return dev[name].data.ptr if name in dev else 0


def calls(problem, dev, strides, stream, workspace: int):
    """(forward, backward) launches of one case."""
    a = {name: address(dev, name) for name in
         ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "cu_q", "cu_kv")}
    forward = forward_call(problem, DEVICE, a["q"], a["k"], a["v"], a["out"], a["lse"],
                           a["cu_q"], a["cu_kv"], strides, stream.ptr)
    backward = backward_call(problem, DEVICE, a["q"], a["k"], a["v"], a["out"], a["dout"],
                             a["lse"], a["dq"], a["dk"], a["dv"], a["cu_q"], a["cu_kv"],
                             workspace, strides, stream.ptr)
    return forward, backward


# ---------------------------------------------------------------------------------- reference

def _reference_window(window: tuple[int, int]):
    return None if window == (-1, -1) else tuple(None if w < 0 else w for w in window)


def _dense(x: np.ndarray) -> np.ndarray:
    """[S, H, D] -> [1, H, S, D]."""
    return x.transpose(1, 0, 2)[None]


def _packed(x: np.ndarray) -> np.ndarray:
    """[1, H, S, D] -> [S, H, D]."""
    return x[0].transpose(1, 0, 2)


def reference(case: dict, problem: FlashProblem, host: dict) -> dict[str, np.ndarray]:
    """float64 out, lse (in the kernels' lse layout), dq, dk and dv."""
    q, k, v, dout = host["q"], host["k"], host["v"], host["dout"]
    options = dict(scale=problem.scale, causal=problem.causal)
    window = _reference_window(case.get("window", (-1, -1)))
    if not problem.varlen:
        out, lse = sdpa_forward(q, k, v, window=window, **options)
        grads = sdpa_backward(q, k, v, dout, window=window, **options)
        return dict(out=out, lse=lse, **grads)
    cu_q, cu_kv = host["cu_q"], host["cu_kv"]
    if window is None:
        out, lse = varlen_forward(q, k, v, cu_q, cu_kv, **options)
        dq, dk, dv = varlen_backward(q, k, v, dout, cu_q, cu_kv, **options)
        return dict(out=out, lse=lse.T, dq=dq, dk=dk, dv=dv)
    # varlen_* take no window: each sequence through sdpa_* as [1, H, S, D].
    ref = dict(out=np.zeros(dout.shape), lse=np.full((q.shape[1], q.shape[0]), -np.inf),
               dq=np.zeros(q.shape), dk=np.zeros(k.shape), dv=np.zeros(v.shape))
    for b in range(problem.batch):
        rows, cols = slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])
        args = (_dense(q[rows]), _dense(k[cols]), _dense(v[cols]))
        out, lse = sdpa_forward(*args, window=window, **options)
        grads = sdpa_backward(*args, _dense(dout[rows]), window=window, **options)
        ref["out"][rows], ref["lse"][:, rows] = _packed(out), lse[0]
        ref["dq"][rows] = _packed(grads["dq"])
        ref["dk"][cols], ref["dv"][cols] = _packed(grads["dk"]), _packed(grads["dv"])
    return ref


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref||, or the absolute ||got - ref|| where ref is exactly 0 (dq and dk
    of rows with a single key: a softmax over one key has no gradient)."""
    norm = float(np.linalg.norm(ref))
    return float(np.linalg.norm(got.astype(np.float64) - ref)) / (norm if norm > 0 else 1.0)


# ---------------------------------------------------------------------------------- the checks

def run_case(name: str, case: dict, rng: np.random.Generator, stream) -> dict:
    with stream:
        problem, host, dev, strides = build(case, rng)
        workspaces = [cupy.full(backward_workspace_bytes(problem) // 4 + 64 * run, np.nan,
                                np.float32) for run in range(DETERMINISM_RUNS)]
        gradients = []
        for run, workspace in enumerate(workspaces):
            forward, backward = calls(problem, dev, strides, stream, workspace.data.ptr)
            if run == 0:
                forward()
            poison(dev["dq"], dev["dk"], dev["dv"])
            backward()
            gradients.append({g: dev[g].get().view(np.uint32) for g in ("dq", "dk", "dv")})
        got = {n: dev[n].get() for n in ("out", "lse", "dq", "dk", "dv")}
    ref = reference(case, problem, host)
    errors = {n: relative_error(got[n], ref[n]) for n in ("out", "dq", "dk", "dv")}
    finite = np.isfinite(ref["lse"])
    errors["lse"] = relative_error(got["lse"][finite], ref["lse"][finite]) if finite.any() else 0.0
    failures = [f"{n} error {e:.2e}" for n, e in errors.items() if not e <= TOLERANCE]
    failures += [f"NaN in {n}" for n, x in got.items() if np.isnan(x).any()]
    if not (np.array_equal(np.isneginf(got["lse"]), ~finite)
            and np.isfinite(got["lse"][finite]).all()):
        failures.append("lse is not -inf exactly on the rows without keys")
    if any(not np.array_equal(run[g], gradients[0][g]) for run in gradients[1:] for g in run):
        failures.append(f"backward differs between {DETERMINISM_RUNS} runs")
    return dict(name=name, case=case, errors=errors, rows_without_keys=int((~finite).sum()),
                failures=failures)


def guarded(shape: tuple[int, ...]) -> tuple[cupy.ndarray, cupy.ndarray]:
    """A sentinel-filled buffer and the view of ``shape`` between its guard regions."""
    size = int(np.prod(shape))
    raw = cupy.full(size + 2 * GUARD, SENTINEL, np.uint32)
    return raw, raw[GUARD:GUARD + size].view(np.float32).reshape(shape)


def garbage_offsets(rng: np.random.Generator, batch: int, total: int) -> dict[str, np.ndarray]:
    top = np.iinfo(np.int32).max
    return {
        "random": rng.integers(np.iinfo(np.int32).min, top, batch + 1, dtype=np.int64),
        "decreasing": np.sort(rng.integers(-100, 2 * total, batch + 1))[::-1],
        "huge": top - rng.integers(0, 1000, batch + 1),
        "past_the_end": np.arange(batch + 1) * (total // 3),
    }


def run_garbage(rng: np.random.Generator, stream) -> list[dict]:
    """Forward and backward on garbage offsets: the guards around every output must hold."""
    batch, hq, hkv, d, tq, tkv = 8, 4, 2, 64, 300, 260
    results = []
    q_offsets, kv_offsets = garbage_offsets(rng, batch, tq), garbage_offsets(rng, batch, tkv)
    for kind in q_offsets:
        for causal in (None, "bottom_right"):
            problem = FlashProblem(batch=batch, heads_q=hq, heads_kv=hkv, head_dim=d,
                                   head_dim_v=d, max_seqlen_q=256, max_seqlen_kv=256,
                                   total_q=tq, total_kv=tkv, varlen=True, scale=0.125,
                                   causal=causal, window_left=17 if causal else -1)
            with stream:
                dev = {n: cupy.asarray(rng.uniform(-1, 1, s).astype(np.float32)) for n, s in
                       (("q", (tq, hq, d)), ("k", (tkv, hkv, d)), ("v", (tkv, hkv, d)),
                        ("dout", (tq, hq, d)))}
                raws = {}
                for name, shape in (("out", (tq, hq, d)), ("lse", (hq, tq)),
                                    ("dq", (tq, hq, d)), ("dk", (tkv, hkv, d)),
                                    ("dv", (tkv, hkv, d)),
                                    ("workspace", (backward_workspace_bytes(problem) // 4,))):
                    raws[name], dev[name] = guarded(shape)
                dev["cu_q"] = cupy.asarray(q_offsets[kind].astype(np.int32))
                dev["cu_kv"] = cupy.asarray(kv_offsets[kind].astype(np.int32))
                forward, backward = calls(problem, dev, FlashStrides.contiguous(problem), stream,
                                          dev["workspace"].data.ptr)
                forward()
                backward()
                stream.synchronize()
                broken = [name for name, raw in raws.items()
                          if not (bool((raw[:GUARD] == SENTINEL).all())
                                  and bool((raw[-GUARD:] == SENTINEL).all()))]
            results.append(dict(offsets=kind, causal=causal,
                                failures=[f"wrote outside {n}" for n in broken]))
    return results


def run_other_forwards(rng: np.random.Generator, stream) -> list[dict]:
    """The cases of D = Dv = 128 on the kernels an H100 does not pick: the wide forward (an
    sm_100's choice) and the 64-row forward without the FP64 tensor cores (an sm_89's), each
    with the FMA backward, as the launcher would pick them there."""
    arch, shared = flash_f32.device_arch, flash_f32._shared_per_block
    results = []
    try:
        for other, label in ((ArchSku.sm100, "wide forward"), (ArchSku.sm89, "64-row forward")):
            flash_f32.device_arch = lambda device, other=other: other
            flash_f32._shared_per_block = lambda device, other=other: SHARED_PER_BLOCK[other]
            results += [run_case(f"{name} ({label})", case, rng, stream)
                        for name, case in CASES.items()
                        if (case["head_dim"], case.get("head_dim_v", case["head_dim"]))
                        in flash_f32.WIDE_FORWARD_DIMS]
    finally:
        flash_f32.device_arch, flash_f32._shared_per_block = arch, shared
    return results


def elapsed_ms(call, stream, runs: int) -> float:
    """Mean milliseconds of ``call`` over ``runs`` back-to-back launches, after one warm-up."""
    call()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(runs):
        call()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / runs


def run_timing(rng: np.random.Generator, stream) -> list[dict]:
    b, h, s, d, runs = (TIMING[k] for k in ("batch", "heads", "seq", "head_dim", "runs"))
    results = []
    for causal in (None, "top_left"):
        problem = FlashProblem(batch=b, heads_q=h, heads_kv=h, head_dim=d, head_dim_v=d,
                               max_seqlen_q=s, max_seqlen_kv=s, total_q=b * s, total_kv=b * s,
                               varlen=False, scale=d ** -0.5, causal=causal)
        with stream:
            dev = {n: cupy.random.uniform(-1, 1, (b, h, s, d), dtype=np.float32)
                   for n in ("q", "k", "v", "out", "dout", "dq", "dk", "dv")}
            dev["lse"] = cupy.empty((b, h, s), np.float32)
            workspace = cupy.empty(backward_workspace_bytes(problem), np.uint8)
            forward, backward = calls(problem, dev, FlashStrides.contiguous(problem), stream,
                                      workspace.data.ptr)
            forward_ms = elapsed_ms(forward, stream, runs)
            backward_ms = elapsed_ms(backward, stream, runs)
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        results.append(dict(causal=causal, batch=b, heads=h, seq=s, head_dim=d,
                            forward_ms=forward_ms, backward_ms=backward_ms,
                            forward_tflops=flops / forward_ms / 1e9,
                            backward_tflops=2.5 * flops / backward_ms / 1e9))
    return results


def summarize(report: dict) -> None:
    print(f"device: {report['device']}")
    for case in report["cases"] + report["narrow"]:
        errors = " ".join(f"{n}={e:.1e}" for n, e in case["errors"].items())
        status = "FAIL " + "; ".join(case["failures"]) if case["failures"] else "ok"
        print(f"  {case['name']:36s} {errors}  {status}")
    print("  worst: " + " ".join(f"{n}={e:.2e}" for n, e in report["worst"].items()))
    for run in report["garbage"]:
        status = "FAIL " + "; ".join(run["failures"]) if run["failures"] else "ok"
        print(f"  garbage cu_seqlens {run['offsets']:13s} causal={run['causal']}: {status}")
    for t in report["timing"]:
        print(f"  B={t['batch']} H={t['heads']} S={t['seq']} D={t['head_dim']} "
              f"causal={t['causal']}: forward {t['forward_ms']:.2f} ms "
              f"{t['forward_tflops']:.1f} TFLOP/s, backward {t['backward_ms']:.2f} ms "
              f"{t['backward_tflops']:.1f} TFLOP/s")
    print("PASSED" if report["passed"] else f"FAILED: {report['failures']}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    started = time.perf_counter()
    rng = np.random.default_rng(2024)
    cupy.cuda.Device(DEVICE).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    props = cupy.cuda.runtime.getDeviceProperties(DEVICE)
    report: dict = dict(device=props["name"].decode(), tolerance=TOLERANCE, failures=[])
    stages = (("cases", lambda: [run_case(n, c, rng, stream) for n, c in CASES.items()]),
              ("other forwards", lambda: run_other_forwards(rng, stream)),
              ("garbage", lambda: run_garbage(rng, stream)),
              ("timing", lambda: run_timing(rng, stream)))
    for stage, run in stages:
        try:
            report[stage] = run()
        except Exception as error:  # a CUDA fault or a launch error ends the checks
            report[stage] = []
            report["failures"].append(f"{stage}: {type(error).__name__}: {error}")
            break
    for stage in ("cases", "narrow", "garbage"):
        for entry in report.get(stage, []):
            report["failures"] += [f"{entry.get('name', entry.get('offsets'))}: {f}"
                                   for f in entry["failures"]]
    checked = report.get("cases", []) + report.get("narrow", [])
    report["worst"] = {n: max((c["errors"][n] for c in checked), default=0.0)
                       for n in ("out", "lse", "dq", "dk", "dv")}
    for stage in ("narrow", "garbage", "timing"):
        report.setdefault(stage, [])
    report["passed"] = not report["failures"]
    report["seconds"] = time.perf_counter() - started
    summarize(report)
    with open(argv[1], "w") as out:
        json.dump(report, out, indent=1, default=str)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

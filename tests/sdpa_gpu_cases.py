"""The SDPA GPU tests' problems and helpers: the cases every feature and combination runs,
inputs from the contract's verification inputs, uploads, runs into poisoned outputs on fresh
workspaces and streams, and errors against the float64 reference on the valid rows only.

Inputs are uniform in [-1, 1) and rounded to the element; the reference runs in float64 on those
rounded values. Outputs are poisoned (all bits set) before each run. Rows past seq_len_q (and
gradient rows past the lengths) are unspecified by the contract and left out of comparisons.
"""

from __future__ import annotations

import zlib

import numpy as np

from opfacade import Workspace
from opfacade._internal.contract import TensorSpec
from opfacade._internal.tensors import TensorView, wrap
from opfacade.contracts.sdpa_samples import verification_inputs
from opfacade.ops.sdpa import SdpaBackwardDescriptor, SdpaDescriptor
from opfacade.testing import _device_tensor, _from_bits, download_bits, random_inputs
from opfacade.types import ElementKind

BASE = dict(batch=2, heads_q=4, heads_kv=4, seq_q=128, seq_kv=128, head_dim=64)

# Every feature alone, then the combinations that interact (masks with padding, bias with
# masks and GQA, layouts with everything). Each runs forward and backward.
CASES = {
    "plain": {},
    "d128": dict(head_dim=128),
    "dv_differs": dict(head_dim=128, head_dim_v=64),
    "odd_lengths": dict(seq_q=200, seq_kv=300),
    "bshd": dict(layout="bshd", seq_q=200, seq_kv=300),
    "sbhd": dict(layout="sbhd"),
    "scale": dict(scale=0.3),
    "gqa": dict(heads_q=8, heads_kv=2),
    "mqa": dict(heads_q=8, heads_kv=1),
    "causal_top_left": dict(causal="top_left", seq_q=200, seq_kv=300),
    "causal_top_left_tall": dict(causal="top_left", seq_q=300, seq_kv=200),
    "causal_bottom_right": dict(causal="bottom_right", seq_q=130, seq_kv=300),
    # Declared top-left to cuDNN (the same mask, its faster backward): graphs.py.
    "causal_bottom_right_square": dict(causal="bottom_right", seq_q=200, seq_kv=200),
    "window_left": dict(window=(64, None)),
    "window_left_right": dict(window=(48, 16), seq_q=160, seq_kv=224),
    "window_right_only": dict(window=(None, 8)),
    "window_causal": dict(causal="top_left", window=(32, None)),
    "window_bottom_right": dict(causal="bottom_right", window=(40, None), seq_q=100,
                                seq_kv=260),
    "bias_bhqk": dict(bias="bhqk"),
    "bias_1hqk_causal": dict(bias="1hqk", causal="top_left"),
    "bias_b1qk": dict(bias="b1qk"),
    "bias_11qk_window": dict(bias="11qk", window=(32, 32)),
    "alibi": dict(alibi=True, causal="top_left"),
    "alibi_six_heads_gqa": dict(alibi=True, causal="top_left", heads_q=6, heads_kv=3),
    "padding": dict(padding=True, seq_q=200, seq_kv=300),
    "padding_causal_bottom_right": dict(padding=True, causal="bottom_right", seq_q=200,
                                        seq_kv=300),
    "padding_bias": dict(padding=True, bias="bhqk", causal="top_left"),
    "padding_window": dict(padding=True, window=(32, 0)),
    "gqa_bias_window_bshd_d128": dict(heads_q=8, heads_kv=2, bias="bhqk", window=(64, 0),
                                      layout="bshd", head_dim=128),
}
def rng_for(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


def forward_case(element, name, **extra) -> SdpaDescriptor:
    return SdpaDescriptor(**{**BASE, **CASES[name], **extra}, element=element,
                               save_stats=True)


def backward_case(element, name, **extra) -> SdpaBackwardDescriptor:
    fields = {**BASE, **CASES[name], **extra}
    return SdpaBackwardDescriptor(**fields, element=element,
                                       need_bias_grad=fields.get("bias") is not None)


def case_inputs(desc, signature: dict[str, TensorSpec], rng) -> dict[str, np.ndarray]:
    floats = {n: s for n, s in signature.items() if s.element.is_float and s.role != "out"}
    return verification_inputs(desc, random_inputs(floats, rng), rng)


def upload(spec: TensorSpec, values: np.ndarray | None) -> TensorView:
    import cupy

    if spec.element.is_float:
        return _device_tensor(spec, 0, values)
    dtype = {ElementKind.i32: np.int32, ElementKind.i64: np.int64}[spec.element]
    with cupy.cuda.Device(0):
        return wrap(cupy.asarray(np.asarray(values, dtype=dtype).reshape(spec.shape)),
                    "lengths")


def run_plan(plan, signature, inputs, *, runs=1, args_type=None) -> list[dict[str, np.ndarray]]:
    """Raw output bits of ``runs`` runs, each with a fresh workspace buffer (at a different
    address and offset), fresh poisoned outputs and a new non-blocking stream."""
    import cupy

    args_type = args_type or type(plan).op.args
    results, keep = [], []
    for run in range(runs):
        views = {name: upload(spec, None if spec.role == "out" else inputs[name])
                 for name, spec in signature.items()}
        pool = cupy.empty(plan.workspace_size + 2 * Workspace.ALIGNMENT * (run + 2),
                          dtype=cupy.uint8)
        keep.append(pool)
        base = Workspace.round_up(pool.data.ptr)
        workspace = Workspace(base + run * Workspace.ALIGNMENT, plan.workspace_size, 0, pool)
        cupy.cuda.runtime.deviceSynchronize()  # uploads and poison ran on the legacy stream
        stream = cupy.cuda.Stream(non_blocking=True)
        plan.run(args_type(**views), workspace=workspace, stream=stream.ptr)
        stream.synchronize()
        results.append({name: download_bits(views[name]) for name, spec in signature.items()
                        if spec.role == "out"})
    return results


def valid_rows(desc, name: str, inputs) -> np.ndarray | None:
    """Where ``name`` is specified: rows inside the sequence lengths (None: everywhere)."""
    if not desc.padding:
        return None
    len_q, len_kv = inputs["seq_len_q"], inputs["seq_len_kv"]
    rows_q = np.arange(desc.seq_q)[None, None, :, None] < len_q[:, None, None, None]
    rows_kv = np.arange(desc.seq_kv)[None, None, :, None] < len_kv[:, None, None, None]
    if name in ("out", "stats", "grad_q"):
        return rows_q
    if name in ("grad_k", "grad_v"):
        return rows_kv
    cols = np.arange(desc.seq_kv)[None, None, None, :] < len_kv[:, None, None, None]
    both = rows_q & cols
    return both.all(axis=0, keepdims=True) if desc.bias_shape[0] == 1 else both


def relative_errors(desc, signature, bits: dict, expected: dict, inputs) -> dict[str, float]:
    from opfacade.testing import relative_error

    errors = {}
    for name, ref in expected.items():
        got = _from_bits(bits[name], signature[name].element)
        mask = valid_rows(desc, name, inputs)
        if mask is not None:
            got, ref = np.where(mask, got, 0.0), np.where(mask, ref, 0.0)
        errors[name] = relative_error(got, ref)
    return errors


def dropout_mask(desc: SdpaDescriptor, inputs) -> np.ndarray:
    """cuDNN's keep mask (1 kept, 0 dropped; float32 [B, Hq, Sq, Skv]) for the inputs' seed and
    offset, from the forward's variant that dumps it."""
    import cupy

    from opfacade._backends.cudnn.sdpa import run_forward_dumping_dropout
    from opfacade.contracts.sdpa import SDPA_FORWARD

    signature = SDPA_FORWARD.signature(desc)
    views = {name: upload(spec, None if spec.role == "out" else inputs[name])
             for name, spec in signature.items()}
    mask = cupy.zeros((desc.batch, desc.heads_q, desc.seq_q, desc.seq_kv), dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    run_forward_dumping_dropout(desc, views, wrap(mask, "dropout_mask"), stream.ptr)
    return mask.get()


def shared_windows(first: np.ndarray, second: np.ndarray, width: int = 64) -> float:
    """The fraction of second's runs of ``width`` consecutive keys (every row, every start) that
    also occur somewhere in first: about 0 for independent masks (a run is 64 random bits at
    dropout_p = 0.5), and large when second repeats first's draws, whether in the same rows,
    in other rows, or shifted along the keys (cuDNN 9.19 on an H100: offset + 1 repeats 75% of
    the rows, offset + 4k the whole mask k keys over)."""

    def runs(mask: np.ndarray) -> np.ndarray:
        bits = (mask.reshape(-1, mask.shape[-1]) > 0).astype(np.uint64)
        windows = np.lib.stride_tricks.sliding_window_view(bits, width, axis=1)
        weights = np.left_shift(np.uint64(1), np.arange(width, dtype=np.uint64))
        return (windows * weights).sum(axis=-1, dtype=np.uint64).ravel()

    return float(np.isin(runs(second), runs(first)).mean())


def same_bits(results: list[dict]) -> bool:
    return all(r[n].tobytes() == results[0][n].tobytes() for r in results[1:] for n in r)

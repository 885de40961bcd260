"""SDPA's edges on a real GPU (the contract's docstring and README "SDPA's edges" state them):
successive dropout draws from a DropoutState give independent masks where offset + 1 does not,
and the backward given the forward's draw uses the forward's mask; sequences without keys get out
0, stats -inf and grad_q 0 in buffers poisoned with NaN, and rows past seq_len_q are written
finite; finite garbage past the lengths changes no valid output, and a NaN there reaches them
(hence the precondition). CPU side: test_sdpa_edges.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from sdpa_gpu_cases import (
    dropout_mask,
    relative_errors,
    rng_for,
    run_plan,
    shared_windows,
    upload,
    valid_rows,
)

from opfacade import Plan, PlanPreference
from opfacade._backends.reference import sdpa as reference
from opfacade.contracts.sdpa import SDPA_BACKWARD, SDPA_FORWARD, reference_options
from opfacade.ops.sdpa import (
    DropoutState,
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    sdpa,
    sdpa_backward,
)
from opfacade.testing import _from_bits, _to_bits, download_bits, random_inputs, relative_error

pytestmark = pytest.mark.gpu

SHAPE = dict(batch=2, heads_q=4, heads_kv=4, seq_q=200, seq_kv=200, head_dim=64)


# ----------------------------------------------------------------------------- dropout


def test_successive_draws_from_a_state_are_independent_and_offset_plus_one_is_not():
    torch = pytest.importorskip("torch")
    p = 0.5  # the most random bits per key
    desc = SdpaDescriptor(**SHAPE, element="bf16", dropout_p=p)
    stride = desc.dropout_offset_stride
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.rand(desc.q_shape, device="cuda", generator=gen).to(torch.bfloat16) * 2 - 1
               for _ in range(3))
    inputs = {name: t.double().cpu().numpy() for name, t in (("q", q), ("k", k), ("v", v))}
    seed = 987654321
    state = DropoutState.create(seed=seed, like=q, offset=1000)
    offsets, outs, draws = [], [], []
    for _ in range(3):
        offsets.append(int(state.offset.item()))
        out, draw = sdpa(q, k, v, dropout_p=p, dropout=state)
        torch.cuda.synchronize()
        outs.append(out)
        draws.append(draw)
        assert int(draw.offset.item()) == offsets[-1]  # the call's offset, for its backward
        assert int(state.offset.item()) == offsets[-1] + stride  # advanced on the device
        assert draw.seed is state.seed
    assert offsets == [1000, 1000 + stride, 1000 + 2 * stride]

    def mask(seed_value: int, offset: int) -> np.ndarray:
        return dropout_mask(desc, {**inputs, "dropout_seed": np.array([seed_value], np.int64),
                                   "dropout_offset": np.array([offset], np.int64)})

    masks = [mask(seed, offset) for offset in offsets]
    # Each call ran with the offset it reported: its output is the raw Args run's, bitwise.
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    for offset, out in zip(offsets, outs, strict=True):
        raw = run_plan(plan, signature, {**inputs, "dropout_seed": np.array([seed], np.int64),
                                         "dropout_offset": np.array([offset], np.int64)})[0]
        ours = out.view(torch.int16).cpu().numpy().view(np.uint16)
        assert ours.tobytes() == raw["out"].tobytes()
    chance = shared_windows(masks[0], mask(seed + 1, offsets[0]))  # two independent seeds
    for a, b in ((0, 1), (1, 2), (0, 2)):
        shared = shared_windows(masks[a], masks[b])
        assert shared <= chance + 0.01, f"calls {a} and {b} share {shared:.3f} of their draws"
    # The overlap a caller adding 1 per call gets (cuDNN 9.19 on an H100: 75% of the rows).
    repeated = shared_windows(masks[0], mask(seed, offsets[0] + 1))
    assert repeated > chance + 0.25, f"offset + 1 shares {repeated:.3f} of the draws"


def test_the_backward_given_the_forwards_draw_uses_the_forwards_mask():
    torch = pytest.importorskip("torch")
    p = 0.2
    fields = dict(SHAPE, heads_kv=2, causal="top_left", element="bf16", dropout_p=p)
    desc = SdpaDescriptor(**fields)
    gen = torch.Generator(device="cuda").manual_seed(6)
    q = torch.rand(desc.q_shape, device="cuda", generator=gen).to(torch.bfloat16) * 2 - 1
    k, v = (torch.rand(desc.k_shape, device="cuda", generator=gen).to(torch.bfloat16) * 2 - 1
            for _ in range(2))
    d_out = torch.rand(desc.o_shape, device="cuda", generator=gen).to(torch.bfloat16) * 2 - 1
    state = DropoutState.create(seed=24680, like=q)
    sdpa(q, k, v, causal=True, dropout_p=p, dropout=state)  # a first call moves the state on
    out, stats, draw = sdpa(q, k, v, causal=True, dropout_p=p, dropout=state, return_stats=True)
    grads = sdpa_backward(q, k, v, out, d_out, stats, causal=True, dropout_p=p, dropout=draw,
                          deterministic=True)
    torch.cuda.synchronize()
    arrays = {name: t.double().cpu().numpy() for name, t in (("q", q), ("k", k), ("v", v),
                                                              ("grad_out", d_out))}
    keep = dropout_mask(desc, {**arrays, "dropout_seed": draw.seed.cpu().numpy(),
                               "dropout_offset": draw.offset.cpu().numpy()}) > 0
    options = reference_options(desc)
    expected = reference.sdpa_backward(arrays["q"], arrays["k"], arrays["v"],
                                       arrays["grad_out"], dropout_keep=keep, **options)
    bound = Plan.select(SdpaBackwardDescriptor(**fields), device=0).precision_guarantee
    for ours, name in zip(grads, ("dq", "dk", "dv"), strict=True):
        error = relative_error(ours.double().cpu().numpy(), expected[name])
        assert error <= bound.max_rel_error, f"{name}: {error}"


# ----------------------------------------------------------------------------- padding


def _padded_inputs(desc, len_q, len_kv, rng, past=None) -> dict[str, np.ndarray]:
    """Random inputs rounded to bf16, with ``past(shape)`` (default zeros) past the lengths in
    q, k, v and grad_out, and the lengths."""
    signature = (SDPA_BACKWARD if isinstance(desc, SdpaBackwardDescriptor) else
                 SDPA_FORWARD).signature(desc)
    inputs = random_inputs({n: s for n, s in signature.items()
                            if n in ("q", "k", "v", "grad_out")}, rng)
    past = past or np.zeros
    for name, lengths in (("q", len_q), ("k", len_kv), ("v", len_kv), ("grad_out", len_q)):
        if name in inputs:
            x = inputs[name]
            rows = np.arange(x.shape[2])[None, None, :, None] < np.asarray(lengths)[:, None,
                                                                                    None, None]
            garbage = _from_bits(_to_bits(past(x.shape), desc.element), desc.element)
            inputs[name] = np.where(rows, x, garbage)
    inputs["seq_len_q"] = np.asarray(len_q, np.int32)
    inputs["seq_len_kv"] = np.asarray(len_kv, np.int32)
    return inputs


def _saved(desc, inputs) -> dict[str, np.ndarray]:
    """out and stats as the forward leaves them (reference values rounded; 0 past seq_len_q)."""
    out, lse = reference.sdpa_forward(inputs["q"], inputs["k"], inputs["v"],
                                      seq_len_q=inputs["seq_len_q"],
                                      seq_len_kv=inputs["seq_len_kv"], **reference_options(desc))
    rows = np.arange(desc.seq_q)[None, None, :] < inputs["seq_len_q"][:, None, None]
    lse = np.where(rows, lse, 0.0)
    return {"out": _from_bits(_to_bits(out, desc.element), desc.element),
            "stats": lse[..., None].astype(np.float32).astype(np.float64)}


def test_sequences_without_keys_get_zero_out_minus_inf_stats_and_zero_grad_q():
    """Outputs start as NaN (all bits set); the backward reads the forward's own out and stats.
    The forward's rows are the edge kernel's; grad_q's are cuDNN's own."""
    fields = dict(batch=4, heads_q=4, heads_kv=2, seq_q=160, seq_kv=200, head_dim=64,
                  element="bf16", padding=True)
    desc = SdpaDescriptor(**fields, save_stats=True)
    bdesc = SdpaBackwardDescriptor(**fields)
    len_q, len_kv = [160, 100, 33, 160], [200, 0, 77, 0]
    with_keys = np.array(len_kv) > 0
    inputs = _padded_inputs(bdesc, len_q, len_kv, rng_for("no-keys"))
    fsig, bsig = SDPA_FORWARD.signature(desc), SDPA_BACKWARD.signature(bdesc)
    views = {name: upload(spec, None if spec.role == "out" else inputs[name])
             for name, spec in fsig.items()}
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    Plan.select(desc, device=0).run(SdpaArgs(**views), stream=0)
    grads = {name: upload(bsig[name], None) for name in ("grad_q", "grad_k", "grad_v")}
    grad_out = upload(bsig["grad_out"], inputs["grad_out"])
    cupy.cuda.runtime.deviceSynchronize()
    plan = Plan.select(bdesc, PlanPreference(deterministic=True), device=0)
    plan.run(SdpaBackwardArgs(views["q"], views["k"], views["v"], views["out"], grad_out,
                              views["stats"], **grads, seq_len_q=views["seq_len_q"],
                              seq_len_kv=views["seq_len_kv"]), stream=0)
    cupy.cuda.runtime.deviceSynchronize()
    out = _from_bits(download_bits(views["out"]), desc.element)
    stats = download_bits(views["stats"])[..., 0].astype(np.float64)
    grad_q = _from_bits(download_bits(grads["grad_q"]), desc.element)
    ref_out, ref_lse = reference.sdpa_forward(
        inputs["q"], inputs["k"], inputs["v"], seq_len_q=inputs["seq_len_q"],
        seq_len_kv=inputs["seq_len_kv"], **reference_options(desc))
    for b in (1, 3):  # no keys: every row, as the reference says for its rows
        assert (out[b] == 0).all() and (ref_out[b] == 0).all()
        assert (stats[b, :, :len_q[b]] == -np.inf).all()
        assert (ref_lse[b, :, :len_q[b]] == -np.inf).all()
        assert (stats[b, :, len_q[b]:] == 0).all()
        assert (grad_q[b, :, :len_q[b]] == 0).all()  # cuDNN's own
    for b in (0, 2):  # rows past seq_len_q: out 0, stats 0 (finite, for the backward)
        assert (out[b, :, len_q[b]:] == 0).all() and (stats[b, :, len_q[b]:] == 0).all()
    bound = plan.precision_guarantee.max_rel_error
    keyed = np.flatnonzero(with_keys)
    rows = np.arange(desc.seq_q)[None, None, :] < np.array(len_q)[keyed, None, None]
    assert relative_error(np.where(rows[..., None], out[keyed], 0),
                          np.where(rows[..., None], ref_out[keyed], 0)) <= bound
    assert relative_error(np.where(rows, stats[keyed], 0), np.where(rows, ref_lse[keyed], 0)
                          ) <= bound
    expected = reference.sdpa_backward(inputs["q"], inputs["k"], inputs["v"], inputs["grad_out"],
                                       seq_len_q=inputs["seq_len_q"],
                                       seq_len_kv=inputs["seq_len_kv"], **reference_options(bdesc))
    bits = {name: download_bits(view) for name, view in grads.items()}
    errors = relative_errors(bdesc, bsig, bits, {"grad_q": expected["dq"], "grad_k": expected[
        "dk"], "grad_v": expected["dv"]}, inputs)
    assert all(e <= bound for e in errors.values()), errors


def _large_garbage(shape) -> np.ndarray:
    return np.random.default_rng(7).uniform(-1e4, 1e4, shape)


LENGTHS = ([160, 33, 97], [200, 77, 130])  # seq_len_q, seq_len_kv: mid-tile boundaries
PADDED = dict(batch=3, heads_q=4, heads_kv=2, seq_q=160, seq_kv=200, head_dim=64,
              element="bf16", padding=True)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_finite_garbage_past_the_lengths_changes_no_valid_output(direction):
    if direction == "forward":
        desc = SdpaDescriptor(**PADDED, save_stats=True)
        plan = Plan.select(desc, device=0)
        signature = SDPA_FORWARD.signature(desc)
    else:
        desc = SdpaBackwardDescriptor(**PADDED)
        plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
        signature = SDPA_BACKWARD.signature(desc)
    runs = {}
    for past in ("zeros", "garbage"):
        rng = rng_for("garbage", direction)  # the same values inside the lengths
        inputs = _padded_inputs(desc, *LENGTHS, rng,
                                past=np.zeros if past == "zeros" else _large_garbage)
        if direction == "backward":
            inputs.update(_saved(desc, inputs))
        runs[past] = (inputs, run_plan(plan, signature, inputs)[0])
    inputs, zeros = runs["zeros"]
    garbage = runs["garbage"][1]
    for name in zeros:  # bitwise on the valid rows (seen on an H100, forward and deterministic)
        rows = valid_rows(desc, name, inputs)
        same = np.where(rows, garbage[name], 0) == np.where(rows, zeros[name], 0)
        assert same.all(), f"{name}: {np.count_nonzero(~same)} valid elements changed"
    bound = plan.precision_guarantee.max_rel_error
    if direction == "forward":
        out, lse = reference.sdpa_forward(inputs["q"], inputs["k"], inputs["v"],
                                          seq_len_q=inputs["seq_len_q"],
                                          seq_len_kv=inputs["seq_len_kv"],
                                          **reference_options(desc))
        expected = {"out": out, "stats": lse[..., None]}
    else:
        grads = reference.sdpa_backward(inputs["q"], inputs["k"], inputs["v"],
                                        inputs["grad_out"], seq_len_q=inputs["seq_len_q"],
                                        seq_len_kv=inputs["seq_len_kv"],
                                        **reference_options(desc))
        expected = {"grad_q": grads["dq"], "grad_k": grads["dk"], "grad_v": grads["dv"]}
    errors = relative_errors(desc, signature, garbage, expected, inputs)
    assert all(e <= bound for e in errors.values()), f"garbage vs the reference: {errors}"


def test_nan_in_v_past_seq_len_kv_reaches_valid_out_hence_the_precondition():
    """Documents why content past the lengths must be finite: cuDNN 9.19 multiplies the masked
    probabilities (zeros) by v's rows past seq_len_kv, and 0 * NaN is NaN (seen on an H100 with
    these very lengths). If this starts to fail, cuDNN stopped propagating it: revisit the
    precondition (contracts/sdpa.py, README)."""
    desc = SdpaDescriptor(**PADDED, save_stats=True)
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    inputs = _padded_inputs(desc, *LENGTHS, rng_for("nan"))
    len_kv = inputs["seq_len_kv"]
    past_kv = np.arange(desc.seq_kv)[None, None, :, None] >= len_kv[:, None, None, None]
    inputs["v"] = np.where(past_kv, np.nan, inputs["v"])
    out = _from_bits(run_plan(plan, signature, inputs)[0]["out"], desc.element)
    rows = np.arange(desc.seq_q)[None, None, :, None] < inputs["seq_len_q"][:, None, None, None]
    valid = out[np.broadcast_to(rows, out.shape) & (len_kv < desc.seq_kv)[:, None, None, None]]
    assert not np.isfinite(valid).all(), "NaN past seq_len_kv no longer reaches valid rows"

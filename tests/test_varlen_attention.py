"""The varlen_attention contract on the host: descriptors, the bucket ladder, binding, the
offsets' checks and the float64 reference plan against per-sequence dense attention."""

from __future__ import annotations

import numpy as np
import pytest

import opfacade
from opfacade import (
    Plan,
    PlanPreference,
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from opfacade._backends.reference import sdpa_backward, sdpa_forward
from opfacade.contracts.varlen_attention import offsets_problem, verification_lengths
from opfacade.errors import InvalidArgument, InvalidProblem, ShapeMismatch

FIELDS = dict(batch=4, heads_q=4, heads_kv=2, head_dim=8, max_seqlen_q=7, max_seqlen_kv=9,
              element="f64")
HOST = dict(device="cpu")


def _packed(rng, lengths, heads, dim):
    return rng.uniform(-1, 1, (int(sum(lengths)), heads, dim))


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _dense(x):
    return x.transpose(1, 0, 2)[None]


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_forward_and_backward_match_dense_attention_per_sequence(causal):
    rng = np.random.default_rng(0)
    len_q, len_kv = [7, 1, 0, 3], [9, 4, 0, 9]
    q, k, v = (_packed(rng, len_q, 4, 8), _packed(rng, len_kv, 2, 8), _packed(rng, len_kv, 2, 8))
    cu_q, cu_kv = _offsets(len_q), _offsets(len_kv)
    desc = VarlenAttentionDescriptor(**FIELDS, causal=causal, save_lse=True)
    out, lse = np.empty_like(q), np.empty((4, q.shape[0]))
    Plan.select(desc, **HOST).run(VarlenAttentionArgs(q, k, v, cu_q, cu_kv, out, lse))
    d_out = rng.uniform(-1, 1, out.shape)
    grads = [np.empty_like(t) for t in (q, k, v)]
    backward = VarlenAttentionBackwardDescriptor(**FIELDS, causal=causal)
    Plan.select(backward, **HOST).run(VarlenAttentionBackwardArgs(q, k, v, out, d_out, lse, cu_q,
                                                                  cu_kv, *grads))
    for s in range(4):
        rows, cols = slice(cu_q[s], cu_q[s + 1]), slice(cu_kv[s], cu_kv[s + 1])
        want_out, want_lse = sdpa_forward(_dense(q[rows]), _dense(k[cols]), _dense(v[cols]),
                                          causal=causal)
        np.testing.assert_allclose(out[rows], want_out[0].transpose(1, 0, 2), atol=1e-13)
        np.testing.assert_array_equal(lse[:, rows], want_lse[0])
        want = sdpa_backward(_dense(q[rows]), _dense(k[cols]), _dense(v[cols]),
                             _dense(d_out[rows]), causal=causal)
        for grad, name, span in zip(grads, ("dq", "dk", "dv"), (rows, cols, cols), strict=True):
            np.testing.assert_allclose(grad[span], want[name][0].transpose(1, 0, 2), atol=1e-13)


def test_a_sequence_without_keys_gets_zeros_and_minus_inf_never_nan():
    rng = np.random.default_rng(1)
    len_q, len_kv = [3, 2], [0, 5]
    q, k, v = _packed(rng, len_q, 4, 8), _packed(rng, len_kv, 2, 8), _packed(rng, len_kv, 2, 8)
    out, lse = np.full_like(q, np.nan), np.full((4, 5), np.nan)
    desc = VarlenAttentionDescriptor(**FIELDS, save_lse=True)
    Plan.select(desc, **HOST).run(VarlenAttentionArgs(q, k, v, _offsets(len_q), _offsets(len_kv),
                                                      out, lse))
    assert (out[:3] == 0).all() and (lse[:, :3] == -np.inf).all()
    assert np.isfinite(out).all() and np.isfinite(lse[:, 3:]).all()


def test_tokens_past_the_last_offset_keep_their_values():
    rng = np.random.default_rng(2)
    q, k, v = rng.uniform(-1, 1, (6, 4, 8)), rng.uniform(-1, 1, (6, 2, 8)), \
        rng.uniform(-1, 1, (6, 2, 8))
    out = np.full_like(q, 7.0)
    desc = VarlenAttentionDescriptor(**FIELDS)
    Plan.select(desc, **HOST).run(VarlenAttentionArgs(q, k, v, np.array([0, 4], np.int32),
                                                      np.array([0, 5], np.int32), out))
    assert (out[4:] == 7.0).all() and (out[:4] != 7.0).all()


def test_views_into_one_packed_qkv_run_without_copies():
    rng = np.random.default_rng(3)
    qkv = rng.uniform(-1, 1, (9, 3, 2, 8))  # [T, 3, H, D], as one projection writes it
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    desc = VarlenAttentionDescriptor(**{**FIELDS, "heads_q": 2, "heads_kv": 2})
    out = np.empty((9, 2, 8))
    cu = np.array([0, 4, 9], np.int32)
    Plan.select(desc, **HOST).run(VarlenAttentionArgs(q, k, v, cu, cu, out))
    want, _ = sdpa_forward(_dense(q[4:]), _dense(k[4:]), _dense(v[4:]))
    np.testing.assert_allclose(out[4:], want[0].transpose(1, 0, 2), atol=1e-13)


@pytest.mark.parametrize(("offsets", "message"), [
    ([1, 3, 5], "starts at 1"),
    ([0, 4, 3], "decreases at index 2"),
    ([0, 8, 9], "longer than 7 at index 1"),
    ([0, 5, 11], "past the tensor's 10 tokens"),
])
def test_bad_offsets_name_the_argument_and_the_first_bad_index(offsets, message):
    desc = VarlenAttentionDescriptor(**FIELDS)
    q, k, v = np.zeros((10, 4, 8)), np.zeros((10, 2, 8)), np.zeros((10, 2, 8))
    cu_kv = np.array([0, 5, 10], np.int32)
    plan = Plan.select(desc, **HOST)
    with pytest.raises(InvalidArgument, match=message) as error:
        plan.can_implement(VarlenAttentionArgs(q, k, v, np.array(offsets, np.int32), cu_kv,
                                               np.zeros((10, 4, 8))))
    assert error.value.argument == "cu_seqlens_q"


def test_offsets_problem_accepts_valid_offsets():
    assert offsets_problem(np.array([0, 0, 7, 9]), 10, 7) is None


def test_binding_names_the_argument():
    desc = VarlenAttentionDescriptor(**FIELDS)
    plan = Plan.select(desc, **HOST)
    cu = np.array([0, 2], np.int32)
    q, k, v, out = np.zeros((2, 4, 8)), np.zeros((2, 2, 8)), np.zeros((2, 2, 8)), \
        np.zeros((2, 4, 8))
    with pytest.raises(ShapeMismatch, match="cu_seqlens_q must be 1-D with 2 to batch"):
        plan.can_implement(VarlenAttentionArgs(q, k, v, np.zeros(6, np.int32), cu, out))
    with pytest.raises(ShapeMismatch, match="more than batch"):
        plan.can_implement(VarlenAttentionArgs(np.zeros((29, 4, 8)), k, v, cu, cu,
                                               np.zeros((29, 4, 8))))
    with pytest.raises(ShapeMismatch, match="out"):
        plan.can_implement(VarlenAttentionArgs(q, k, v, cu, cu, np.zeros((3, 4, 8))))
    with pytest.raises(InvalidArgument, match="lse"):
        plan.can_implement(VarlenAttentionArgs(q, k, v, cu, cu, out, np.zeros((4, 2))))


@pytest.mark.parametrize(("heads", "len_q"), [(1, [3, 2]), (4, [1, 0])])
def test_lse_with_an_extent_of_one_takes_any_stride_there(heads, len_q):
    """One head, or one token in all: lse [Hq, Tq] has an extent-1 dimension, whose stride a
    transposed buffer reports as anything. It addresses nothing, so the call runs, and writes what
    a C-ordered lse would hold."""
    rng = np.random.default_rng(1)
    fields = {**FIELDS, "heads_q": heads, "heads_kv": 1, "batch": 2}
    len_kv = [4, 5]
    q, k, v = (_packed(rng, len_q, heads, 8), _packed(rng, len_kv, 1, 8),
               _packed(rng, len_kv, 1, 8))
    cu_q, cu_kv = _offsets(len_q), _offsets(len_kv)
    plan = Plan.select(VarlenAttentionDescriptor(**fields, save_lse=True), **HOST)
    tokens = q.shape[0]
    transposed = np.full((tokens, heads), np.nan).T  # strides (8, 8 * heads): C order's reversed
    assert transposed.strides != (8 * tokens, 8)
    dense = np.full((heads, tokens), np.nan)
    for lse in (transposed, dense):
        plan.run(VarlenAttentionArgs(q, k, v, cu_q, cu_kv, np.empty_like(q), lse))
    np.testing.assert_array_equal(transposed, dense)
    padded = np.full((heads, tokens + 3), np.nan)[:, :tokens]  # rows 3 elements apart
    args = VarlenAttentionArgs(q, k, v, cu_q, cu_kv, np.empty_like(q), padded)
    if heads == 1:  # one row: the same memory as a dense lse
        plan.can_implement(args)
    else:
        with pytest.raises(InvalidArgument, match="lse must be contiguous"):
            plan.can_implement(args)


def test_descriptors_validate_and_bucket():
    with pytest.raises(InvalidProblem, match="multiple"):
        VarlenAttentionDescriptor(**{**FIELDS, "heads_kv": 3})
    desc = VarlenAttentionDescriptor(**{**FIELDS, "batch": 5, "max_seqlen_q": 700})
    bucket = desc.bucketed()
    assert (bucket.batch, bucket.max_seqlen_q, bucket.max_seqlen_kv) == (8, 1024, 128)
    assert bucket.bucketed() == bucket


def test_verification_lengths_cover_the_edges():
    desc = VarlenAttentionDescriptor(**{**FIELDS, "batch": 5})
    len_q, len_kv = verification_lengths(desc)
    assert 0 in len_q and 1 in len_q and desc.max_seqlen_q in len_q
    assert (len_q <= desc.max_seqlen_q).all() and (len_kv <= desc.max_seqlen_kv).all()


def test_functional_form_on_host_arrays():
    rng = np.random.default_rng(4)
    len_q = [3, 5]
    q, k, v = _packed(rng, len_q, 2, 8), _packed(rng, len_q, 2, 8), _packed(rng, len_q, 2, 8)
    cu = _offsets(len_q)
    out, lse = opfacade.varlen_attention(q, k, v, cu, cu, max_seqlen_q=5, max_seqlen_kv=5,
                                         causal=True)
    grads = opfacade.varlen_attention_backward(rng.uniform(-1, 1, out.shape), q, k, v, out, lse,
                                               cu, cu, max_seqlen_q=5, max_seqlen_kv=5,
                                               causal=True)
    assert out.shape == q.shape and lse.shape == (2, 8)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_no_gpu_sku_is_offered_by_the_reference():
    desc = VarlenAttentionDescriptor(**FIELDS)
    report = Plan.explain(desc, PlanPreference(), arch="sm90")
    assert "reference_is_oracle" in str(report) or "reference" in str(report)


def test_the_f32_kernels_refuse_archs_whose_blocks_lack_their_shared_memory():
    desc = VarlenAttentionDescriptor(**{**FIELDS, "head_dim": 128, "element": "f32"})
    report = str(Plan.explain(desc, arch="sm89"))
    assert "shared memory per block, more than sm89" in report
    assert Plan.select(desc, arch="sm90").sku.id == "varlen_attention_forward.nvrtc.f32"

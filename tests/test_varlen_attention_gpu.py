"""The varlen attention SKUs on a GPU (the true-f32 NVRTC kernels, cuDNN's ragged graphs in f16
and bf16 with both backwards): against the float64 reference, under capture with lengths changed
between replays, with packed-QKV views, with fewer sequences than the plan's capacity, with NaN in
tokens no sequence owns, and with garbage offsets (never a write outside the outputs). Every
SKU's bound on every input distribution is tests/test_precision_gpu.py's."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

from opfacade import (
    Plan,
    PlanPreference,
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from opfacade._backends.reference import varlen_backward, varlen_forward
from opfacade.contracts.varlen_attention import offsets_problem
from opfacade.errors import InvalidArgument
from opfacade.testing import relative_error

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

HEADS_Q, HEADS_KV, DIM = 4, 2, 64
CAPACITY = dict(batch=6, heads_q=HEADS_Q, heads_kv=HEADS_KV, head_dim=DIM, max_seqlen_q=160,
                max_seqlen_kv=200, element="f32")
F32 = PlanPreference(backends={"nvrtc"})


@dataclass(frozen=True)
class Flavor:
    """One family of SKUs: the element, the preference selecting them, and the plain relative
    errors their results keep against float64 on these uniform inputs (the guarantee's form is
    test_precision_gpu's; these are loose ceilings for the edges tested here)."""

    name: str
    element: str
    pref: PlanPreference
    out_error: float
    grad_error: float
    lse_tolerance: float

    @property
    def dtype(self):
        return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[self.element]


FLAVORS = [
    Flavor("nvrtc-f32", "f32", F32, 1e-5, 1e-4, 1e-5),
    Flavor("cudnn-bf16", "bf16", PlanPreference(backends={"cudnn"}), 2e-2, 6e-2, 1e-3),
    Flavor("cudnn-f16", "f16", PlanPreference(backends={"cudnn"}), 4e-3, 2e-2, 1e-3),
    Flavor("cudnn-bf16-deterministic", "bf16",
           PlanPreference(backends={"cudnn"}, deterministic=True), 2e-2, 6e-2, 1e-3),
]
flavors = pytest.mark.parametrize("flavor", FLAVORS, ids=[f.name for f in FLAVORS])


def _plans(flavor: Flavor = FLAVORS[0], **mask):
    fields = dict(CAPACITY, element=flavor.element)
    forward = Plan.select(VarlenAttentionDescriptor(**fields, **mask, save_lse=True),
                          flavor.pref, device=0)
    backward = Plan.select(VarlenAttentionBackwardDescriptor(**fields, **mask), flavor.pref,
                           device=0)
    backend = "nvrtc" if flavor.element == "f32" else "cudnn"
    assert forward.sku.backend.value == backend and backward.sku.backend.value == backend
    assert backward.precision_guarantee.deterministic or not flavor.pref.deterministic
    return forward, backward


def _offsets(lengths) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


class Packed:
    """Packed tensors on the GPU for given lengths (buffers sized for the capacity, so new
    lengths can be written into the same memory), and the float64 reference."""

    def __init__(self, seed: int = 0, flavor: Flavor = FLAVORS[0]):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        tq, tk = CAPACITY["batch"] * 160, CAPACITY["batch"] * 200
        self.flavor = flavor

        def uniform(*shape):
            values = torch.rand(shape, device="cuda", generator=gen, dtype=torch.float32) * 2 - 1
            return values.to(flavor.dtype)

        self.q, self.d_out = uniform(tq, HEADS_Q, DIM), uniform(tq, HEADS_Q, DIM)
        self.k, self.v = uniform(tk, HEADS_KV, DIM), uniform(tk, HEADS_KV, DIM)
        self.out = torch.full_like(self.q, float("nan"))
        self.lse = torch.full((HEADS_Q, tq), float("nan"), device="cuda")
        self.grads = [torch.full_like(t, float("nan")) for t in (self.q, self.k, self.v)]
        self.cu_q = torch.zeros(CAPACITY["batch"] + 1, device="cuda", dtype=torch.int32)
        self.cu_kv = torch.zeros_like(self.cu_q)

    def set_lengths(self, len_q, len_kv) -> None:
        """Writes new offsets into the same buffers (entries past the batch repeat the end)."""
        for buffer, lengths in ((self.cu_q, len_q), (self.cu_kv, len_kv)):
            values = _offsets(lengths)
            values += [values[-1]] * (buffer.numel() - len(values))
            buffer.copy_(torch.tensor(values, dtype=torch.int32))

    def forward_args(self):
        return VarlenAttentionArgs(self.q, self.k, self.v, self.cu_q, self.cu_kv, self.out,
                                   self.lse)

    def backward_args(self):
        return VarlenAttentionBackwardArgs(self.q, self.k, self.v, self.out, self.d_out, self.lse,
                                           self.cu_q, self.cu_kv, *self.grads)

    def check(self, len_q, len_kv, **options) -> None:
        """Results of the valid rows against the float64 reference."""
        tq, tk = sum(len_q), sum(len_kv)
        host = {n: getattr(self, n).double().cpu().numpy() for n in ("q", "k", "v", "d_out")}
        cu_q, cu_kv = np.array(_offsets(len_q)), np.array(_offsets(len_kv))
        out, lse = varlen_forward(host["q"][:tq], host["k"][:tk], host["v"][:tk], cu_q, cu_kv,
                                  **options)
        flavor = self.flavor
        assert relative_error(self.out[:tq].double().cpu().numpy(), out) < flavor.out_error
        got_lse = self.lse[:, :tq].double().cpu().numpy()
        np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(lse.T))
        finite = np.isfinite(lse.T)
        np.testing.assert_allclose(got_lse[finite], lse.T[finite], rtol=flavor.lse_tolerance,
                                   atol=flavor.lse_tolerance)
        grads = varlen_backward(host["q"][:tq], host["k"][:tk], host["v"][:tk],
                                host["d_out"][:tq], cu_q, cu_kv, **options)
        for got, want, rows in zip(self.grads, grads, (tq, tk, tk), strict=True):
            got = got[:rows].double().cpu().numpy()
            assert np.isfinite(got).all()
            assert relative_error(got, want) < flavor.grad_error


@flavors
@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
def test_runs_match_the_reference_with_fewer_sequences_than_the_capacity(flavor, causal):
    forward, backward = _plans(flavor, causal=causal)
    data = Packed(flavor=flavor)
    len_q, len_kv = [160, 1, 0, 77], [200, 33, 0, 150]
    data.set_lengths(len_q, len_kv)
    cu_q, cu_kv = data.cu_q[:5], data.cu_kv[:5]  # 4 sequences of the plan's 6
    forward.run(VarlenAttentionArgs(data.q, data.k, data.v, cu_q, cu_kv, data.out, data.lse))
    backward.run(VarlenAttentionBackwardArgs(data.q, data.k, data.v, data.out, data.d_out,
                                             data.lse, cu_q, cu_kv, *data.grads))
    torch.cuda.synchronize()
    data.check(len_q, len_kv, causal=causal)


@flavors
def test_a_captured_graph_replays_with_new_lengths(flavor):
    forward, backward = _plans(flavor, causal="bottom_right")
    assert forward.precision_guarantee.capture_safe and backward.precision_guarantee.capture_safe
    data = Packed(seed=1, flavor=flavor)
    data.set_lengths([100, 160, 3, 0, 50, 1], [120, 200, 3, 0, 60, 10])
    stream = torch.cuda.Stream()
    fwd_ws = torch.empty(max(forward.workspace_size, 1), device="cuda", dtype=torch.uint8)
    bwd_ws = torch.empty(max(backward.workspace_size, 1), device="cuda", dtype=torch.uint8)
    fwd = forward.prepare(data.forward_args(), workspace=fwd_ws, stream=stream)
    bwd = backward.prepare(data.backward_args(), workspace=bwd_ws, stream=stream)
    with torch.cuda.stream(stream):
        fwd()  # warm: kernels loaded before capture
        bwd()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fwd()
        bwd()
    for len_q, len_kv in (([160, 2, 0, 40, 1, 90], [200, 2, 7, 40, 1, 199]),
                          ([5, 5, 5, 5, 5, 5], [5, 9, 0, 200, 1, 33])):
        data.set_lengths(len_q, len_kv)
        graph.replay()
        torch.cuda.synchronize()
        data.check(len_q, len_kv, causal="bottom_right")


@flavors
def test_views_into_one_packed_qkv_give_the_same_bits_without_copies(flavor):
    data = Packed(seed=2, flavor=flavor)
    len_q = [100, 60, 0, 1, 160, 20]
    data.set_lengths(len_q, len_q)
    tokens = data.q.shape[0]
    qkv = (torch.rand((tokens, 3, HEADS_KV, DIM), device="cuda") * 2 - 1).to(flavor.dtype)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # views into one projection
    fields = dict(CAPACITY, heads_q=HEADS_KV, max_seqlen_kv=160, element=flavor.element)
    plan = Plan.select(VarlenAttentionDescriptor(**fields), flavor.pref, device=0)
    strided, compact = torch.empty_like(q), torch.empty_like(q)
    plan.run(VarlenAttentionArgs(q, k, v, data.cu_q, data.cu_q, strided))
    plan.run(VarlenAttentionArgs(q.contiguous(), k.contiguous(), v.contiguous(), data.cu_q,
                                 data.cu_q, compact))
    torch.cuda.synchronize()
    owned = sum(len_q)  # rows past the last offset belong to no sequence: left as they were
    if flavor.element == "f32":
        assert torch.equal(strided[:owned], compact[:owned])
    else:  # a graph built for other strides: cuDNN may pick another engine
        assert relative_error(strided[:owned].double().cpu().numpy(),
                              compact[:owned].double().cpu().numpy()) < 1e-3


@flavors
def test_garbage_offsets_never_write_outside_the_outputs(flavor):
    forward, backward = _plans(flavor, causal="top_left")
    data = Packed(seed=3, flavor=flavor)
    guard = 4096
    sentinel = 1024.0  # exact in f16 and bf16 too

    def guarded(like):
        flat = torch.full((like.numel() + 2 * guard,), sentinel, device="cuda",
                          dtype=like.dtype)
        return flat, flat[guard:guard + like.numel()].view(like.shape)

    out_buffer, out = guarded(data.out)
    lse_buffer, lse = guarded(data.lse)
    grad_buffers, grads = zip(*(guarded(g) for g in data.grads), strict=True)
    rng = np.random.default_rng(4)
    for garbage in (rng.integers(-2**31, 2**31 - 1, 7), [0, 5000, 3, 2**31 - 1, -7, 0, 9],
                    [0, 10, 10, 10, 10, 10, 10**6]):
        values = torch.tensor(np.asarray(garbage, dtype=np.int64).astype(np.int32))
        data.cu_q.copy_(values)
        data.cu_kv.copy_(values.flip(0))
        forward.run(VarlenAttentionArgs(data.q, data.k, data.v, data.cu_q, data.cu_kv, out, lse))
        backward.run(VarlenAttentionBackwardArgs(data.q, data.k, data.v, out, data.d_out, lse,
                                                 data.cu_q, data.cu_kv, *grads))
        torch.cuda.synchronize()
        for buffer in (out_buffer, lse_buffer, *grad_buffers):
            assert (buffer[:guard] == sentinel).all() and (buffer[-guard:] == sentinel).all()


@pytest.mark.parametrize(("offsets", "argument", "message"), [
    ([0, 100, 50, 150, 150, 150, 150], "cu_seqlens_q", "decreases at index 2 (100 -> 50)"),
    ([3, 10, 20, 30, 40, 50, 60], "cu_seqlens_q", "starts at 3, not 0 (index 0)"),
    ([0, 161, 200, 200, 200, 200, 200], "cu_seqlens_q", "longer than 160 at index 1"),
])
@pytest.mark.parametrize("flavor", FLAVORS[:2], ids=[f.name for f in FLAVORS[:2]])
def test_checked_mode_names_the_argument_and_the_first_bad_index(offsets, argument, message,
                                                                 flavor):
    desc = VarlenAttentionDescriptor(**dict(CAPACITY, element=flavor.element), checked=True,
                                     save_lse=True)
    plan = Plan.select(desc, flavor.pref, device=0)
    data = Packed(seed=5, flavor=flavor)
    data.cu_q.copy_(torch.tensor(offsets, dtype=torch.int32))
    data.cu_kv.copy_(torch.tensor([0, 10, 20, 30, 40, 50, 60], dtype=torch.int32))
    with pytest.raises(InvalidArgument, match=re.escape(message)) as error:
        plan.run(data.forward_args())
    assert error.value.argument == argument
    # The host reference gives the same words for the same offsets.
    assert message in offsets_problem(np.array(offsets), data.q.shape[0], 160)


def test_checked_mode_runs_valid_offsets():
    forward = Plan.select(VarlenAttentionDescriptor(**CAPACITY, checked=True, save_lse=True),
                          F32, device=0)
    data = Packed(seed=6)
    len_q, len_kv = [10, 0, 160, 1, 5, 7], [20, 3, 200, 1, 0, 9]
    data.set_lengths(len_q, len_kv)
    forward.run(data.forward_args())
    torch.cuda.synchronize()
    tq = sum(len_q)
    out, _ = varlen_forward(*(getattr(data, n).double().cpu().numpy()[:rows] for n, rows in
                              (("q", tq), ("k", sum(len_kv)), ("v", sum(len_kv)))),
                            np.array(_offsets(len_q)), np.array(_offsets(len_kv)))
    assert relative_error(data.out[:tq].double().cpu().numpy(), out) < 1e-5


@flavors
def test_nan_in_tokens_no_sequence_owns_never_reaches_a_result(flavor):
    """Rows past the last offset (a buffer from torch.empty, say) never reach a result."""
    forward, backward = _plans(flavor, causal="bottom_right")
    data = Packed(seed=7, flavor=flavor)
    len_q, len_kv = [100, 0, 1, 160, 7, 30], [150, 4, 0, 200, 9, 30]
    data.set_lengths(len_q, len_kv)
    for tensor, used in ((data.q, sum(len_q)), (data.d_out, sum(len_q)), (data.k, sum(len_kv)),
                         (data.v, sum(len_kv))):
        tensor[used:] = float("nan")
    forward.run(data.forward_args())
    backward.run(data.backward_args())
    torch.cuda.synchronize()
    tq, tk = sum(len_q), sum(len_kv)
    assert torch.isfinite(data.out[:tq]).all()
    assert all(torch.isfinite(g[:rows]).all() for g, rows in zip(data.grads, (tq, tk, tk),
                                                                 strict=True))
    data.check(len_q, len_kv, causal="bottom_right")


def test_a_workspace_limit_rejects_the_deterministic_backward_with_its_exact_size():
    fields = dict(CAPACITY, element="bf16", causal="bottom_right")
    desc = VarlenAttentionBackwardDescriptor(**fields)
    exact = Plan.select(desc, PlanPreference(backends={"cudnn"}, deterministic=True),
                        device=0).workspace_size
    limited = PlanPreference(deterministic=True, workspace_limit=exact - 1)
    report = Plan.explain(desc, limited, device=0)
    assert f"needs {exact} bytes of workspace, limit is {exact - 1}" in str(report)
    # Within the limit, the default backward still serves (it is not deterministic).
    plan = Plan.select(desc, PlanPreference(workspace_limit=exact - 1), device=0)
    assert plan.sku.id == "varlen_attention_backward.cudnn.bf16"


@flavors
def test_one_buffer_for_both_offsets_runs_bottom_right_as_top_left(flavor):
    """Self-attention: every sequence has as many queries as keys, so a bottom-right mask is the
    top-left one, and the cuDNN SKUs run their faster top-left graph (cudnn/varlen.py)."""
    forward, backward = _plans(flavor, causal="bottom_right", window=(40, 0))
    data = Packed(seed=8, flavor=flavor)
    lengths = [160, 1, 0, 77, 33, 100]
    data.set_lengths(lengths, lengths)
    args = [data.forward_args(), data.backward_args()]
    for arg in args:
        arg.cu_seqlens_kv = data.cu_q  # the same buffer
    forward.run(args[0])
    backward.run(args[1])
    torch.cuda.synchronize()
    data.check(lengths, lengths, causal="bottom_right", window=(40, 0))


# The issue's shapes: one sequence; a thousand short ones; one long sequence among short ones,
# GQA 32/8 at d 128; lengths that are multiples of nothing in particular.
SHAPES = {
    "batch 1": ([301], [517], 4, 2, 64),
    "batch 1024": (list(np.random.default_rng(9).integers(0, 40, 1024)),
                   list(np.random.default_rng(10).integers(0, 40, 1024)), 4, 2, 64),
    # 640 tokens: long beside the others, short enough for the float64 reference (32 heads at
    # 1500 tokens took 60-90 s a flavour on the host).
    "one long among short, GQA 32/8": ([1, 3, 640, 17, 0, 65], [2, 3, 640, 129, 5, 65], 32, 8,
                                       128),
}


@flavors
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_issues_shapes_match_the_reference(flavor, shape):
    len_q, len_kv, heads_q, heads_kv, dim = SHAPES[shape]
    fields = dict(batch=len(len_q), heads_q=heads_q, heads_kv=heads_kv, head_dim=dim,
                  max_seqlen_q=max(len_q), max_seqlen_kv=max(len_kv), element=flavor.element,
                  causal="bottom_right")
    forward = Plan.select(VarlenAttentionDescriptor(**fields, save_lse=True), flavor.pref,
                          device=0)
    backward = Plan.select(VarlenAttentionBackwardDescriptor(**fields), flavor.pref, device=0)
    gen = torch.Generator(device="cuda").manual_seed(11)
    tq, tk = int(sum(len_q)), int(sum(len_kv))

    def uniform(*shape):
        return (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(flavor.dtype)

    q, d_out = uniform(tq, heads_q, dim), uniform(tq, heads_q, dim)
    k, v = uniform(tk, heads_kv, dim), uniform(tk, heads_kv, dim)
    out, lse = torch.empty_like(q), torch.empty((heads_q, tq), device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    cu_q, cu_kv = (torch.tensor(_offsets(n), device="cuda", dtype=torch.int32)
                   for n in (len_q, len_kv))
    forward.run(VarlenAttentionArgs(q, k, v, cu_q, cu_kv, out, lse))
    backward.run(VarlenAttentionBackwardArgs(q, k, v, out, d_out, lse, cu_q, cu_kv, *grads))
    torch.cuda.synchronize()
    host = [t.double().cpu().numpy() for t in (q, k, v, d_out)]
    offsets = [np.array(_offsets(n)) for n in (len_q, len_kv)]
    want_out, want_lse = varlen_forward(*host[:3], *offsets, causal="bottom_right")
    assert relative_error(out.double().cpu().numpy(), want_out) < flavor.out_error
    got_lse = lse.double().cpu().numpy()
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse.T))
    finite = np.isfinite(want_lse.T)
    np.testing.assert_allclose(got_lse[finite], want_lse.T[finite], rtol=flavor.lse_tolerance,
                               atol=flavor.lse_tolerance)
    want = varlen_backward(*host, *offsets, causal="bottom_right")
    for got, expected in zip(grads, want, strict=True):
        got = got.double().cpu().numpy()
        assert np.isfinite(got).all() and relative_error(got, expected) < flavor.grad_error


@flavors
@pytest.mark.parametrize(("heads", "len_q"), [(1, [30, 0, 7]), (4, [0, 1, 0])])
def test_an_lse_with_an_extent_of_one_runs_from_a_transposed_buffer(flavor, heads, len_q):
    """One head, or one token in all: lse [Hq, Tq] is then a transposed buffer's view (strides
    (1, Hq) or (1, 1)), which the contract takes, as the stride of an extent-1 dimension
    addresses nothing. Forward and backward run as from a C-ordered lse: the same bits where the
    SKU is deterministic, within its plain error ceiling where not."""
    len_kv = [33, 5, 9]
    fields = dict(batch=3, heads_q=heads, heads_kv=1, head_dim=DIM, max_seqlen_q=32,
                  max_seqlen_kv=40, element=flavor.element)
    forward = Plan.select(VarlenAttentionDescriptor(**fields, save_lse=True), flavor.pref,
                          device=0)
    backward = Plan.select(VarlenAttentionBackwardDescriptor(**fields), flavor.pref, device=0)
    gen = torch.Generator(device="cuda").manual_seed(11)

    def uniform(tokens, h):
        values = torch.rand((tokens, h, DIM), device="cuda", generator=gen) * 2 - 1
        return values.to(flavor.dtype)

    tq, tk = sum(len_q), sum(len_kv)
    q, d_out, k, v = uniform(tq, heads), uniform(tq, heads), uniform(tk, 1), uniform(tk, 1)
    cu_q = torch.tensor(_offsets(len_q), device="cuda", dtype=torch.int32)
    cu_kv = torch.tensor(_offsets(len_kv), device="cuda", dtype=torch.int32)
    results = []
    for lse in (torch.full((tq, heads), float("nan"), device="cuda").t(),
                torch.full((heads, tq), float("nan"), device="cuda")):
        out = torch.full_like(q, float("nan"))
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        forward.run(VarlenAttentionArgs(q, k, v, cu_q, cu_kv, out, lse))
        backward.run(VarlenAttentionBackwardArgs(q, k, v, out, d_out, lse, cu_q, cu_kv, *grads))
        torch.cuda.synchronize()
        results.append(([out, lse.contiguous()], grads))
    (outputs, grads), (dense_outputs, dense_grads) = results
    for got, want in zip(outputs, dense_outputs, strict=True):  # the forward is deterministic
        assert torch.equal(got, want)
    for got, want in zip(grads, dense_grads, strict=True):
        if backward.precision_guarantee.deterministic:
            assert torch.equal(got, want)
        else:
            assert relative_error(got.double().cpu().numpy(),
                                  want.double().cpu().numpy()) < flavor.grad_error

"""The memo of what a torch call selected (opfacade/_internal/guarded.py), on host tensors:
a repeat call with tensors of the same facts finds the entry, any changed fact misses, and what
would never hit is never stored."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import opfacade  # noqa: E402
from opfacade._internal.guarded import GuardedCalls, Selected  # noqa: E402


class _Plan:
    freed = False


def _selected(shape=(2, 3)) -> Selected:
    return Selected(_Plan(), shape, (shape[1], 1), torch.float32, torch.device("cpu"))


def _tensors():
    return torch.ones(2, 3), torch.ones(4, 3, dtype=torch.bfloat16)


def test_a_call_with_the_same_facts_finds_what_the_first_selected():
    calls, selected = GuardedCalls(), _selected()
    assert calls.find(_tensors(), ("relu",)) is None
    calls.remember(_tensors(), ("relu",), selected)
    assert calls.find(_tensors(), ("relu",)) is selected  # other objects, the same facts
    assert tuple(selected.empty().shape) == (2, 3)


def test_a_first_call_inside_a_dispatch_modes_redispatch_does_not_refuse_the_guard(
        monkeypatch):
    # torch.library.opcheck's schema check redispatches with the Negative key excluded; torch's
    # guard self-test, run there on the caller's thread, failed and the process never stored a
    # call again (seen on an H100: test_guarded.py after test_torch_gpu.py).
    from opfacade._internal import guarded

    monkeypatch.setattr(guarded, "_GUARDS", [])
    calls, selected = GuardedCalls(), _selected()
    negative = torch._C.DispatchKeySet(torch._C.DispatchKey.Negative)
    with torch._C._ExcludeDispatchKeyGuard(negative):
        calls.remember(_tensors(), ("relu",), selected)
    assert guarded._GUARDS[0] is not None
    assert calls.find(_tensors(), ("relu",)) is selected


@pytest.mark.parametrize("changed", [
    lambda a, b: (a.double(), b),                          # dtype
    lambda a, b: (a[:1], b),                               # shape
    lambda a, b: (a.t().contiguous().t(), b),              # strides
    lambda a, b: (a, b.clone().requires_grad_()),          # requires_grad
])
def test_any_changed_fact_misses(changed):
    calls = GuardedCalls()
    calls.remember(_tensors(), ("relu",), _selected())
    assert calls.find(changed(*_tensors()), ("relu",)) is None


def test_a_call_with_another_number_of_tensors_misses():
    # linear's backward passes its aux only when there is one, with the same options; a guard
    # handed another number of tensors than it was built from raises TypeError (seen on an H100
    # in test_torch_fuzz.py: a ReLU backward without its mask after one with it).
    calls, selected = GuardedCalls(), _selected()
    calls.remember(_tensors(), ("relu",), selected)
    assert calls.find((*_tensors(), torch.ones(2, 3)), ("relu",)) is None
    assert calls.find(_tensors()[:1], ("relu",)) is None
    assert calls.find(_tensors(), ("relu",)) is selected


def test_other_options_and_a_freed_plan_miss():
    calls, selected = GuardedCalls(), _selected()
    calls.remember(_tensors(), ("relu",), selected)
    assert calls.find(_tensors(), ("none",)) is None
    selected.plan.freed = True
    assert calls.find(_tensors(), ("relu",)) is None


def test_a_call_repeating_one_tensor_is_not_stored():
    # torch's guard fails every check with one tensor object in two places: such an entry
    # would only push useful ones out.
    calls = GuardedCalls()
    a = torch.ones(2, 3)
    calls.remember((a, a), (), _selected())
    assert len(calls) == 0


def test_it_keeps_the_newest_calls_up_to_its_capacity():
    calls = GuardedCalls(capacity=2)
    firsts = [_selected() for _ in range(3)]
    for rows, selected in zip((1, 2, 3), firsts, strict=True):
        calls.remember((torch.ones(rows, 3),), (), selected)
    assert len(calls) == 2
    assert calls.find((torch.ones(1, 3),), ()) is None
    assert calls.find((torch.ones(3, 3),), ()) is firsts[2]
    # Remembering a selection again replaces its entry rather than adding one.
    calls.remember((torch.ones(5, 3),), (), firsts[2])
    assert len(calls) == 2 and calls.find((torch.ones(3, 3),), ()) is None


def test_clear_caches_empties_it():
    calls = GuardedCalls()
    calls.remember(_tensors(), (), _selected())
    opfacade.clear_caches()
    assert len(calls) == 0


def test_the_functional_forms_repeat_calls_find_their_plan_by_guard_and_give_the_same_bits():
    # Host torch tensors run the float64 reference: a repeat call of the same facts takes the
    # guarded path, a call with other facts (a transposed layout, a bias, other options) selects
    # again, and every one gives what a fresh selection gives.
    from opfacade.ops import linear as linear_form
    from opfacade.ops import sdpa as sdpa_form

    opfacade.clear_caches()
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=generator) for _ in range(3))
    # A process's first call meets torch through the full path (operands.PLAIN_TORCH_TYPES).
    first = opfacade.sdpa(q, k, v, causal=True)
    assert len(sdpa_form._TORCH_CALLS) <= 1
    again = opfacade.sdpa(q.clone(), k.clone(), v.clone(), causal=True)
    assert torch.equal(first, again) and len(sdpa_form._TORCH_CALLS) == 1
    assert torch.equal(opfacade.sdpa(q, k, v, causal=True), first)
    bshd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    out, stats = opfacade.sdpa(*bshd, causal=True, return_stats=True)
    assert torch.equal(out, first) and tuple(stats.shape) == (1, 2, 8, 1)
    assert len(sdpa_form._TORCH_CALLS) == 2
    opfacade.clear_caches()
    assert torch.equal(opfacade.sdpa(*bshd, causal=True), first)

    x, w, b = (torch.randn(*shape, generator=generator) for shape in ((6, 16), (12, 16), (12,)))
    opfacade.clear_caches()
    with_bias = opfacade.linear(x, w, b, activation="relu")
    assert torch.equal(opfacade.linear(x, w, b, activation="relu"), with_bias)
    without = opfacade.linear(x, w, activation="relu")
    assert len(linear_form._TORCH_CALLS) == 2
    # The full path (an out given) gives the same bits.
    assert torch.equal(opfacade.linear(x, w, b, activation="relu", out=torch.empty(6, 12)),
                       with_bias)
    assert torch.equal(opfacade.linear(x, w, activation="relu", out=torch.empty(6, 12)),
                       without)
    assert torch.equal(opfacade.sdpa(q, k, v, causal=True, out=torch.empty(1, 2, 8, 16)), first)


def test_an_output_like_the_first_tensor_is_allocated_like_it():
    """``like_first``: out as ``empty_like(first)``, in its strides (a transposed dense q); the
    deterministic fill stays off for it, as for every output the kernels write in full."""
    first = torch.ones(2, 5, 3, 4).transpose(1, 2)  # dense, not contiguous
    shape, strides = tuple(first.shape), tuple(first.stride())
    selected = Selected(_Plan(), shape, strides, torch.float32, torch.device("cpu"), None, True)
    out = selected.empty(first)
    assert tuple(out.shape) == shape and tuple(out.stride()) == strides
    assert out.dtype == first.dtype and not out.requires_grad
    plain = selected._replace(like_first=False).empty(first)
    assert tuple(plain.stride()) == strides
    from torch.overrides import TorchFunctionMode

    switch = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.empty_like:
                switch.append(torch.utils.deterministic.fill_uninitialized_memory)
            return func(*args, **(kwargs or {}))

    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with Watch():
            selected.empty(first)
        assert switch == [False] and torch.utils.deterministic.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_the_functional_forms_aux_takes_the_guarded_path_and_a_mask_starts_zeroed(
        activation, monkeypatch):
    # Host torch tensors run the float64 reference. save_aux=True with the aux left to the call
    # is served like the torch op's forward (ops/linear._TorchAux): the same out and aux as the
    # full path, found by guard on a repeat call, and a ReLU bit-mask allocated zeroed (its last
    # byte holds bits past N that cuBLASLt leaves as it found them).
    from opfacade.ops import linear as linear_form

    opfacade.clear_caches()
    generator = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(*shape, generator=generator) for shape in ((6, 16), (13, 16), (13,)))
    made = []
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: made.append(a) or real_zeros(*a, **k))
    out, aux = opfacade.linear(x, w, b, activation=activation, save_aux=True)
    again_out, again_aux = opfacade.linear(x, w, b, activation=activation, save_aux=True)
    assert len(linear_form._TORCH_CALLS) == 1
    assert torch.equal(out, again_out) and torch.equal(aux, again_aux)
    assert bool(made) == (activation == "relu")
    # The full path (an out= given) asks for the mask zeroed too, through operands.allocate.
    asked = []
    real_allocate = linear_form.operands.allocate
    monkeypatch.setattr(linear_form.operands, "allocate",
                        lambda *a, zeroed=False, **k: asked.append(zeroed)
                        or real_allocate(*a, zeroed=zeroed, **k))
    full_out, full_aux = opfacade.linear(x, w, b, activation=activation, save_aux=True,
                                         out=torch.empty(6, 13))
    assert asked == [activation == "relu"]
    assert torch.equal(out, full_out) and torch.equal(aux, full_aux)
    assert aux.stride() == full_aux.stride() and aux.dtype == full_aux.dtype
    with pytest.raises(opfacade.errors.InvalidProblem, match="needs an activation"):
        opfacade.linear(x, w, b, save_aux=True)  # activation "none": the descriptor refuses
    batched = torch.randn(2, 6, 16, generator=generator)  # lead dimensions: the aux has them too
    out, aux = opfacade.linear(batched, w, b, activation=activation, save_aux=True)
    full_out, full_aux = opfacade.linear(batched, w, b, activation=activation, save_aux=True,
                                         out=torch.empty(2, 6, 13))
    assert torch.equal(out, full_out) and torch.equal(aux, full_aux)
    assert aux.stride() == full_aux.stride()


def test_a_functional_host_call_does_not_let_a_torch_op_take_host_tensors():
    # The functional forms run host tensors on the float64 reference; the torch ops refuse them
    # (DeviceMismatch). A functional call's guarded entry must not serve an op's call of the
    # same facts, which would silently run the reference.
    import opfacade.torch  # noqa: F401 - registers the ops
    from opfacade.errors import DeviceMismatch

    opfacade.clear_caches()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    # "top_left": the value the ops pass
    out, stats = opfacade.sdpa(q, k, v, causal="top_left", return_stats=True)
    opfacade.sdpa(q, k, v, causal="top_left", return_stats=True)  # the guarded entry is in use
    with pytest.raises(DeviceMismatch, match="must be a CUDA tensor"):
        torch.ops.opfacade.sdpa_train(q, k, v, True, None, False)
    grad_out = torch.randn(1, 2, 8, 16)
    opfacade.sdpa_backward(q, k, v, out, grad_out, stats, causal=True)
    from opfacade.ops import sdpa as sdpa_form

    sdpa_form.torch_backward(q, k, v, out, grad_out, stats, "top_left", None, False)
    with pytest.raises(DeviceMismatch, match="must be a CUDA tensor"):
        torch.ops.opfacade.sdpa_train_backward(q, k, v, out, grad_out, stats, True, None, False)
    x, w = torch.randn(6, 16), torch.randn(12, 16)
    opfacade.linear(x, w, activation="relu")
    opfacade.linear(x, w, activation="relu")
    with pytest.raises(DeviceMismatch, match="must be a CUDA tensor"):
        torch.ops.opfacade.linear_inference(x, w, None, "relu", False)


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "packed"])
def test_sdpas_guarded_backward_gives_the_full_paths_gradients(layout):
    # Host torch tensors run the float64 reference. torch_backward (the torch ops' backward)
    # selects on a miss, finds the plan by guard on a repeat call with other objects of the
    # same facts, and allocates each gradient in the full path's strides (like its input
    # where that is dense in them): the same bits as sdpa_backward's full path.
    from opfacade.ops import sdpa as sdpa_form

    opfacade.clear_caches()
    generator = torch.Generator().manual_seed(2)
    if layout == "packed":  # views into one [B, S, 3, H, D] projection: not dense
        qkv = torch.randn(1, 8, 3, 2, 16, generator=generator)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    else:
        q, k, v = (torch.randn(1, 2, 8, 16, generator=generator) for _ in range(3))
        if layout == "bshd":
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out, stats = opfacade.sdpa(q, k, v, causal=True, return_stats=True)
    grad_out = torch.randn(out.shape, generator=generator).as_strided(out.shape, out.stride())
    full = opfacade.sdpa_backward(q, k, v, out, grad_out, stats, causal=True)
    guarded = sdpa_form.torch_backward(q, k, v, out, grad_out, stats, "top_left", None, False)
    again = sdpa_form.torch_backward(*(t.clone() if layout != "packed" else t
                                       for t in (q, k, v)), out, grad_out, stats, "top_left",
                                     None, False)
    assert len(sdpa_form._TORCH_BACKWARDS) == 1
    for a, b, c in zip(full, guarded, again, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
        assert a.stride() == b.stride() == c.stride()


@pytest.mark.parametrize("activation", ["none", "relu", "gelu_tanh"])
def test_linears_guarded_backward_gives_the_full_paths_gradients(activation):
    from opfacade.ops import linear as linear_form

    opfacade.clear_caches()
    generator = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*shape, generator=generator) for shape in ((6, 16), (13, 16), (13,)))
    saves = activation != "none"
    out, aux = (opfacade.linear(x, w, b, activation=activation, save_aux=True) if saves
                else (opfacade.linear(x, w, b), None))
    grad_out = torch.randn(6, 13, generator=generator)
    for needs in ((True, True, True), (False, True, False), (True, False, True)):
        full = opfacade.linear_backward(grad_out, x, w, aux, activation=activation,
                                        need_input_grad=needs[0], need_weight_grad=needs[1],
                                        need_bias_grad=needs[2])
        for _ in range(2):  # selects, then finds it by guard
            guarded = linear_form.torch_backward(grad_out, x, w, aux, activation, *needs, False)
            for a, c in zip(full, guarded, strict=True):
                assert (a is None) == (c is None)
                if a is not None:
                    assert torch.equal(a, c) and a.stride() == c.stride()
    assert len(linear_form._TORCH_BACKWARDS) == 3

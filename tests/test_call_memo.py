"""run()'s memo keys on the host: what a key holds for torch calls, when the fast all-torch
pattern gives way to the full read, and what is never stored. CPU torch tensors stand in for
device tensors (the key reads the same facts); the GPU behaviour is in test_call_memo_gpu.py."""

from __future__ import annotations

import pytest

from opfacade import Workspace
from opfacade._internal import call_memo
from opfacade._internal.call_memo import CallMemo, call_key
from opfacade.ops.linear import LinearArgs

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def one_device(monkeypatch):
    monkeypatch.setattr(call_memo, "_read_current_device", lambda: 0)
    if call_memo._tensor_guards() is None:
        pytest.skip("this torch has no usable TensorGuards")


def _args(**changes):
    x, w, b, out = torch.rand(6, 4), torch.rand(5, 4), torch.rand(5), torch.empty(6, 5)
    return LinearArgs(**{"x": x, "weight": w, "bias": b, "out": out, **changes})


def test_the_key_holds_addresses_workspace_and_stream():
    args = _args()
    key, tensors = call_key(args, None, 7)
    assert key[2] == tuple(t.data_ptr() for t in (args.x, args.weight, args.bias, args.out))
    assert key[3:] == (None, 7) and tensors == (args.x, args.weight, args.bias, args.out)
    buffer = torch.empty(256, dtype=torch.uint8)
    key, tensors = call_key(args, buffer, 7)
    assert key[2][-1] == buffer.data_ptr() and tensors[-1] is buffer and key[3] == "tensor"
    key, _ = call_key(args, Workspace(4096, 512, 0), 7)
    assert key[3] == (4096, 512, 0)


def test_same_facts_same_key_other_facts_other_key():
    args = _args()
    again = LinearArgs(args.x, args.weight, args.bias, out=args.out)
    assert call_key(args, None, 7)[0] == call_key(again, None, 7)[0]
    assert call_key(args, None, 7)[0] != call_key(args, None, 8)[0]
    assert call_key(args, None, 7)[0] != call_key(_args(x=args.weight), None, 7)[0]


def test_a_field_that_stops_being_none_is_not_missed():
    """The thread's remembered pattern for LinearArgs must not read a new pattern's call."""
    launches = []

    def checked(args, workspace, stream):
        launches.append(args)
        return lambda: None

    memo = CallMemo(checked)

    plain = _args()
    with_residual = _args(residual=torch.rand(6, 5))
    for args in (plain, plain, with_residual, with_residual, plain):
        memo.launch_for(args, None, 7)
    assert launches == [plain, with_residual]
    assert len(memo.table()) == 2


def test_other_strides_or_dtype_at_the_same_address_are_checked_again():
    checks = []

    def checked(args, workspace, stream):
        checks.append(1)
        return lambda: None

    memo = CallMemo(checked)

    storage = torch.rand(40)
    x = storage[:24].view(6, 4)
    args = _args(x=x)
    memo.launch_for(args, None, 7)
    memo.launch_for(args, None, 7)
    strided = storage.as_strided((6, 4), (5, 1))
    assert strided.data_ptr() == x.data_ptr()
    memo.launch_for(LinearArgs(strided, args.weight, args.bias, out=args.out), None, 7)
    as_int = storage.view(torch.int32)[:24].view(6, 4)
    memo.launch_for(LinearArgs(as_int, args.weight, args.bias, out=args.out), None, 7)
    assert len(checks) == 3


def test_torch_subclasses_are_launched_but_never_remembered():
    class Marked(torch.Tensor):
        pass

    checks = []

    def checked(args, workspace, stream):
        checks.append(1)
        return lambda: None

    memo = CallMemo(checked)

    args = _args()
    marked = LinearArgs(args.x.as_subclass(Marked), args.weight, args.bias, out=args.out)
    assert memo.launch_for(marked, None, 7) is None  # no key: run() checks in full
    memo.launch_for(args, None, 7)  # the thread now reads LinearArgs the fast way
    for _ in range(2):  # same addresses and facts as the stored call, but not a plain tensor
        assert memo.launch_for(marked, None, 7) is not None
    assert len(checks) == 3 and len(memo.table()) == 1


def test_unreadable_calls_have_no_key():
    import numpy as np

    args = _args()
    assert call_key(LinearArgs(np.zeros((6, 4)), args.weight, args.bias, out=args.out),
                    None, 7) == (None, None)
    assert call_key(args, object(), 7) == (None, None)
    assert call_key(args, None, object()) == (None, None)
    assert call_key({"x": args.x}, None, 7) == (None, None)
    assert CallMemo(lambda *a: 1 / 0).launch_for({"x": args.x}, None, 7) is None

"""run()'s memo keys on the host: what a key holds for torch calls, when the fast all-torch
pattern gives way to the full read, and what is never stored. CPU torch tensors stand in for
device tensors (the key reads the same facts; a stand-in runtime with one GPU makes device 0
current); the GPU behaviour is in test_call_memo_gpu.py.

Both ways of reading torch tensors run here: torch's ``TensorGuards`` (private API, used where it
passes its self-test) and the public-API facts, and they must hit and miss alike."""

from __future__ import annotations

import logging

import pytest

from opfacade import Unsupported, Workspace
from opfacade._internal import call_keys, call_memo
from opfacade._internal.call_keys import ArgumentReader, torch_guards
from opfacade._internal.call_memo import CallMemo
from opfacade._internal.contract import BoundArgs
from opfacade._internal.device import Devices
from opfacade._internal.retarget import Checked, Retarget
from opfacade._internal.tensors import wrap
from opfacade.ops.linear import LinearArgs

torch = pytest.importorskip("torch")

STREAM = 7  # an explicit handle: host tensors have no current stream to ask for


class OneGpu:
    """CUDA's runtime as a process that sees one GPU reads it; the current device is never
    asked (it is always 0)."""

    def getDeviceCount(self):
        return 1

    def getDevice(self):
        raise AssertionError("with one GPU the current device is 0 without asking")


def _guards_or_skip():
    guards, why = torch_guards(torch)
    if guards is None:
        pytest.skip(f"this torch has no usable TensorGuards: {why}")
    return guards


def _reader(path: str, **kwargs) -> ArgumentReader:
    if path == "guards":
        _guards_or_skip()
    return ArgumentReader(use_torch_guards=path == "guards", devices=Devices(OneGpu()), **kwargs)


@pytest.fixture(params=["guards", "public"])
def path(request) -> str:
    """Each test runs through torch's guard and through the public-API fallback."""
    return request.param


@pytest.fixture
def guarded() -> ArgumentReader:
    return _reader("guards")


class Counting:
    """A memo's full check: counts its calls and returns a launch."""

    def __init__(self):
        self.calls = []

    def __call__(self, args, workspace, stream):
        self.calls.append(args)
        return Checked(lambda: None)


def _memo(path: str) -> tuple[CallMemo, Counting]:
    checked = Counting()
    return CallMemo(checked, _reader(path)), checked


def _hits(memo: CallMemo, checked: Counting, args, workspace=None, stream=STREAM) -> bool:
    """Whether the memo served this call without the full check."""
    before = len(checked.calls)
    assert memo.launch_for(args, workspace, stream) is not None
    return len(checked.calls) == before


def _args(**changes):
    x, w, b, out = torch.rand(6, 4), torch.rand(5, 4), torch.rand(5), torch.empty(6, 5)
    return LinearArgs(**{"x": x, "weight": w, "bias": b, "out": out, **changes})


def _with_x(args, x):
    return LinearArgs(x, args.weight, args.bias, out=args.out)


# -- both paths ------------------------------------------------------------------------------------

def test_the_same_call_hits_and_a_call_at_other_addresses_misses(path):
    memo, checked = _memo(path)
    args = _args()
    assert not _hits(memo, checked, args)
    assert _hits(memo, checked, args)
    assert _hits(memo, checked, _with_x(args, args.x))  # new args object, same tensors
    moved = _with_x(args, args.x.clone())
    assert not _hits(memo, checked, moved) and _hits(memo, checked, moved)
    assert _hits(memo, checked, args)  # both stay remembered
    assert not _hits(memo, checked, args, stream=STREAM + 1)


def test_a_tensor_passed_in_two_places_hits_after_its_first_check(path):
    # torch's TensorGuards fails any check in which one object fills two places: without the
    # memo's distinct guard, sdpa(x, x, x) or kv_append(new, new, ...) was checked every call.
    memo, checked = _memo(path)
    x = torch.rand(5, 4)
    same = _args(x=x, weight=x)  # weight is x itself (5 x 4 both)
    assert not _hits(memo, checked, same) and _hits(memo, checked, same)
    assert _hits(memo, checked, _args(x=x, weight=x, bias=same.bias, out=same.out))
    # The same address through two objects: the guard's count differs, so at most one more
    # full check (the public path's facts are equal: none), then remembered.
    other = _args(x=x, weight=x[:], bias=same.bias, out=same.out)
    memo.launch_for(other, None, STREAM)
    assert _hits(memo, checked, other) and len(checked.calls) <= 2


def test_other_strides_dtype_or_shape_at_the_same_address_miss(path):
    memo, checked = _memo(path)
    storage = torch.rand(40)
    x = storage[:24].view(6, 4)
    args = _args(x=x)
    assert not _hits(memo, checked, args) and _hits(memo, checked, args)
    strided = storage.as_strided((6, 4), (5, 1))
    as_int = storage.view(torch.int32)[:24].view(6, 4)
    shorter = storage[:20].view(5, 4)
    for other in (strided, as_int, shorter):
        assert other.data_ptr() == x.data_ptr()
        assert not _hits(memo, checked, _with_x(args, other))
        assert _hits(memo, checked, _with_x(args, other))


def test_a_negated_view_of_the_same_memory_misses(path):
    memo, checked = _memo(path)
    pairs = torch.rand(6, 4, dtype=torch.complex64)
    plain, negated = pairs.imag, pairs.conj().imag  # public API for a lazily negated view
    assert (plain.data_ptr(), plain.stride(), plain.dtype) == \
        (negated.data_ptr(), negated.stride(), negated.dtype)
    assert negated.is_neg() and not plain.is_neg()
    args = _args(x=plain)
    assert not _hits(memo, checked, args) and _hits(memo, checked, args)
    assert not _hits(memo, checked, _with_x(args, negated))


def test_requires_grad_turning_on_misses(path):
    memo, checked = _memo(path)
    args = _args()
    assert not _hits(memo, checked, args) and _hits(memo, checked, args)
    args.weight.requires_grad_(True)
    assert not _hits(memo, checked, args)
    assert _hits(memo, checked, args)


def test_a_torch_subclass_has_no_key_and_is_never_remembered(path):
    class Marked(torch.Tensor):
        pass

    memo, checked = _memo(path)
    args = _args()
    marked = _with_x(args, args.x.as_subclass(Marked))
    assert memo.reader.call_key(marked, None, STREAM) == (None, None)
    assert memo.launch_for(marked, None, STREAM) is None  # no key: run() checks in full
    memo.launch_for(args, None, STREAM)  # the guarded thread now reads LinearArgs the fast way
    for _ in range(2):  # same addresses and facts as the stored call, but not a plain tensor
        before = len(checked.calls)
        launch = memo.launch_for(marked, None, STREAM)
        # Checked in full every time: by the memo (the fast read keys it, the guard fails it) or
        # by run() (no key).
        assert (launch is None) if path == "public" else (len(checked.calls) == before + 1)
    assert len(memo.table()) == 1


def test_a_field_that_stops_being_none_is_not_missed(path):
    """The thread's remembered pattern for LinearArgs must not read a new pattern's call."""
    memo, checked = _memo(path)
    plain = _args()
    with_residual = _args(residual=torch.rand(6, 5))
    for args in (plain, plain, with_residual, with_residual, plain):
        memo.launch_for(args, None, STREAM)
    assert checked.calls == [plain, with_residual]
    assert len(memo.table()) == 2


def test_workspaces_key_by_address_and_size(path):
    memo, checked = _memo(path)
    args = _args()
    buffer = torch.empty(256, dtype=torch.uint8)
    assert not _hits(memo, checked, args, buffer) and _hits(memo, checked, args, buffer)
    assert not _hits(memo, checked, args, buffer[:128])
    assert not _hits(memo, checked, args, Workspace(4096, 512, 0))
    assert _hits(memo, checked, args, Workspace(4096, 512, 0))
    assert not _hits(memo, checked, args, Workspace(4096, 1024, 0))


def test_unreadable_calls_have_no_key(path):
    import numpy as np

    reader = _reader(path)
    args = _args()
    assert reader.call_key(_with_x(args, np.zeros((6, 4))), None, STREAM) == (None, None)
    assert reader.call_key(args, object(), STREAM) == (None, None)
    assert reader.call_key(args, None, object()) == (None, None)
    assert reader.call_key(args, None, -1) == (None, None)
    assert reader.call_key({"x": args.x}, None, STREAM) == (None, None)
    assert CallMemo(lambda *a: 1 / 0, reader).launch_for({"x": args.x}, None, STREAM) is None


def test_stream_none_asks_the_current_stream_of_device_zero_with_one_gpu(path):
    asked = []
    reader = _reader(path, torch_stream=lambda device: asked.append(device) or 4242)
    key, _ = reader.call_key(_args(), None, None)
    if path == "guards":  # device 0, the one GPU: the guard rejects host tensors on a GPU plan
        assert key[-1] == 4242 and asked == [0]
    else:  # the facts read the tensors' device: host tensors leave it to the full path
        assert key is None and asked == []


# -- each path's key -------------------------------------------------------------------------------

def test_the_guarded_key_holds_addresses_workspace_and_stream(guarded):
    args = _args()
    key, tensors = guarded.call_key(args, None, STREAM)
    assert key[1] == 0  # the current device
    assert key[2] == tuple(t.data_ptr() for t in (args.x, args.weight, args.bias, args.out))
    assert key[3:] == (None, STREAM) and tensors == (args.x, args.weight, args.bias, args.out)
    buffer = torch.empty(256, dtype=torch.uint8)
    key, tensors = guarded.call_key(args, buffer, STREAM)
    assert key[2][-1] == buffer.data_ptr() and tensors[-1] is buffer and key[3] == "tensor"
    key, _ = guarded.call_key(args, Workspace(4096, 512, 0), STREAM)
    assert key[3] == (4096, 512, 0)
    again = _with_x(args, args.x)
    assert guarded.call_key(args, None, STREAM)[0] == guarded.call_key(again, None, STREAM)[0]
    assert guarded.call_key(args, None, STREAM)[0] != guarded.call_key(args, None, 8)[0]


def test_the_public_key_holds_every_fact():
    reader = _reader("public")
    args = _args()
    key, tensors = reader.call_key(args, None, STREAM)
    assert tensors == () and key[:2] == (LinearArgs, 0) and key[-2:] == (None, STREAM)
    facts = [None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype, -1, False,
                                     False) for t in vars(args).values()]  # absent: None
    assert list(key[2:-2]) == facts and facts.count(None) == 2
    assert reader.uses_torch_guards is False


# -- choosing the path -----------------------------------------------------------------------------

def test_the_guard_is_the_default_where_it_passes_its_self_test():
    guards = _guards_or_skip()
    reader = ArgumentReader(devices=Devices(OneGpu()))
    assert reader.uses_torch_guards is None  # torch not seen yet
    key, tensors = reader.call_key(_args(), None, STREAM)
    assert reader.uses_torch_guards is True and reader.guards is guards and len(tensors) == 4
    assert CallMemo(Counting()).reader.guards is not guards  # decided per reader, at first use


def test_a_guard_failing_its_self_test_falls_back_to_the_public_api(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="opfacade")
    monkeypatch.setattr(call_keys, "torch_guards", lambda torch: (None, "no guard here"))
    checked = Counting()
    memo = CallMemo(checked, ArgumentReader(devices=Devices(OneGpu())))
    args = _args()
    assert not _hits(memo, checked, args) and _hits(memo, checked, args)
    assert memo.reader.uses_torch_guards is False
    assert "no guard here" in caplog.text and "public" in caplog.text
    with pytest.raises(Unsupported, match="no guard here"):
        ArgumentReader(use_torch_guards=True)


def test_the_self_test_rejects_a_guard_blind_to_a_fact():
    class Facts:
        """A guard comparing what ``compared`` reads of each tensor."""

        compared = staticmethod(lambda t: (t.shape, t.stride(), t.dtype, t.is_neg()))

        def __init__(self, *tensors, dynamic_dims_sizes, dynamic_dims_strides):
            self.facts = [self.compared(t) for t in tensors]

        def check(self, *tensors):
            return self.facts == [self.compared(t) for t in tensors]

    class NoNegationBit(Facts):
        compared = staticmethod(lambda t: (t.shape, t.stride(), t.dtype))

    class NoStrides(Facts):
        compared = staticmethod(lambda t: (t.shape, t.dtype, t.is_neg()))

    assert call_keys._guards_pass_self_test(torch, Facts)
    assert not call_keys._guards_pass_self_test(torch, NoNegationBit)
    assert not call_keys._guards_pass_self_test(torch, NoStrides)


def test_two_memos_share_nothing(path):
    first, second = _memo(path)[0], _memo(path)[0]
    args = _args()
    first.launch_for(args, None, STREAM)
    assert len(first.table()) == 1 and len(second.table()) == 0
    assert first.reader is not second.reader and second.reader.torch_types == set()
    # No module-level state: every table lives on a reader or a memo.
    for module in (call_keys, call_memo):
        state = [name for name, value in vars(module).items()
                 if isinstance(value, dict | set | list) and not name.startswith("__")]
        assert state == [], module.__name__


# -- a checked call at other addresses -------------------------------------------------------------

def _bound(args: LinearArgs) -> BoundArgs:
    views = {name: None if getattr(args, name) is None else wrap(getattr(args, name), name)
             for name in ("x", "weight", "bias", "residual", "out")}
    return BoundArgs(views, ("out",))


class Retargeting(Counting):
    """A full check that also offers its Retarget; records the arguments each launch got."""

    def __init__(self):
        super().__init__()
        self.launched = []

    def __call__(self, args, workspace, stream):
        self.calls.append(args)

        def launch_on(bound):
            return lambda: self.launched.append({n: None if v is None else v.ptr
                                                 for n, v in bound.views.items()})

        bound = _bound(args)
        return Checked(launch_on(bound), Retarget(bound, launch_on))


def _linear_at(storage, offsets):
    """x [6, 4], weight [5, 4], bias [5], out [6, 5] f32 views of ``storage`` at these element
    offsets (64 f32 = 256 bytes apart keeps each address's residue)."""
    x, w, b, out = offsets
    return LinearArgs(storage[x:x + 24].view(6, 4), storage[w:w + 20].view(5, 4),
                      storage[b:b + 5], out=storage[out:out + 30].view(6, 5))


def test_a_guarded_call_at_new_addresses_is_retargeted_not_checked_again(guarded):
    checked = Retargeting()
    memo = CallMemo(checked, guarded)
    storage = torch.zeros(64 * 40)
    memo.launch_for(_linear_at(storage, (0, 64, 128, 192)), None, STREAM)()
    moved = _linear_at(storage, (640, 704, 768, 1280))
    memo.launch_for(moved, None, STREAM)()
    assert len(checked.calls) == 1  # re-pointed, not checked again
    assert checked.launched[-1] == {"x": moved.x.data_ptr(), "weight": moved.weight.data_ptr(),
                                    "bias": moved.bias.data_ptr(), "out": moved.out.data_ptr(),
                                    "residual": None}  # absent arguments stay named, as None
    # Another residue modulo 256 bytes, an output meeting an input, other strides: checked.
    for other in (_linear_at(storage, (641, 704, 768, 1280)),
                  _linear_at(storage, (640, 704, 768, 640))):
        memo.launch_for(other, None, STREAM)
    assert len(checked.calls) == 3
    strided = LinearArgs(storage[:48].view(6, 8)[:, :4], moved.weight, moved.bias, out=moved.out)
    memo.launch_for(strided, None, STREAM)
    assert len(checked.calls) == 4
    # With a workspace the call is checked in full (retargets serve calls without one).
    memo.launch_for(_linear_at(storage, (1920, 704, 768, 1280)), Workspace.empty(), STREAM)
    assert len(checked.calls) == 5


def test_retarget_keeps_which_arguments_an_output_meets():
    """An in-place call (out is x) re-points only to another in-place call; a call whose output
    met nothing re-points only to calls whose output meets nothing."""
    storage = torch.zeros(64 * 40)
    x = storage[:30].view(6, 5)
    in_place = BoundArgs({"x": wrap(x, "x"), "out": wrap(x, "out")}, ("out",))
    retarget = Retarget(in_place, lambda bound: bound)
    base = storage.data_ptr()
    assert retarget({"x": base + 1024, "out": base + 1024}) is not None
    assert retarget({"x": base + 1024, "out": base + 2048}) is None
    separate = BoundArgs({"x": wrap(x, "x"), "out": wrap(storage[256:286].view(6, 5), "out")},
                         ("out",))
    retarget = Retarget(separate, lambda bound: bound)
    assert retarget({"x": base, "out": base + 4096}).views["out"].ptr == base + 4096
    assert retarget({"x": base, "out": base}) is None  # out would meet x
    assert retarget({"x": base + 16, "out": base + 4096}) is None  # another alignment residue
    assert retarget({"x": base}) is None  # not the checked call's arguments


def test_calls_alternating_at_one_address_each_keep_their_launch(guarded):
    """Two calls on the same storage whose tensors differ in what the guard checks (a view
    with requires_grad set, another shape in a reused buffer) each find their own launch again
    after the first check: they do not replace each other's (a launch carries its count towards
    a CUDA-graph capture). Past SHADOWED earlier calls, the oldest is dropped."""
    checked = Counting()
    memo = CallMemo(checked, guarded)
    storage = torch.rand(40)
    plain = _args(x=storage[:24].view(6, 4))
    grad = _with_x(plain, storage[:24].view(6, 4).detach().requires_grad_())
    shorter = _with_x(plain, storage[:20].view(5, 4))
    launches = {}
    for args in (plain, grad, shorter):
        assert not _hits(memo, checked, args)
        launches[id(args)] = memo.launch_for(args, None, STREAM)
    for _ in range(3):
        for args in (grad, plain, shorter):
            assert _hits(memo, checked, args)
            assert memo.launch_for(args, None, STREAM) is launches[id(args)]
    assert len(checked.calls) == 3
    shapes = [_with_x(plain, storage[:4 * rows].view(rows, 4)) for rows in (1, 2, 3)]
    for args in shapes:
        assert not _hits(memo, checked, args)
    assert _hits(memo, checked, shapes[0]) and not _hits(memo, checked, plain)

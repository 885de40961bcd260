"""Property-based, without a GPU: opfacade.torch's drop-ins handed hostile arguments (host and
meta tensors of any rank and dtype, tensor subclasses, None, numbers, strings, lists) in every
position raise an OpFacadeError naming an argument, or Python's own TypeError for a call that
does not match the signature; never anything else. On a host without CUDA every tensor fails
the device check, so this fuzzes the checks that run before any GPU work (tests/
test_torch_gpu.py covers bad input on CUDA tensors)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import opfacade.torch as oft  # noqa: E402
from opfacade.errors import OpFacadeError  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.bool, torch.complex64)


@st.composite
def tensors(draw):
    shape = draw(st.lists(st.integers(0, 3), max_size=5))
    tensor = torch.zeros(shape, dtype=draw(st.sampled_from(DTYPES)),
                         device=draw(st.sampled_from(("cpu", "meta"))))
    if draw(st.booleans()) and tensor.is_floating_point():
        tensor = torch.nn.Parameter(tensor, requires_grad=draw(st.booleans()))
    return tensor


hostile = st.one_of(tensors(), st.none(), st.integers(-3, 9), st.floats(allow_nan=True),
                    st.text(max_size=4), st.lists(st.integers(), max_size=3), st.booleans())

# Each drop-in with its positional arity and keyword options.
DROP_INS = {
    "linear": (oft.linear, 3, ("activation", "deterministic")),
    "sdpa": (oft.sdpa, 4, ("dropout_p", "is_causal", "scale", "enable_gqa")),
    "varlen_attention": (oft.varlen_attention, 5, ("max_seqlen_q", "max_seqlen_kv", "causal",
                                                   "window", "scale")),
    "alibi": (oft.alibi, 2, ()),
    "decode_attention": (oft.decode_attention, 5, ()),
    "kv_append": (oft.kv_append, 6, ()),
    "Linear": (lambda x: oft.Linear(4, 3)(x), 1, ()),
}


@pytest.mark.parametrize("name", DROP_INS)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drop_ins_raise_only_typed_errors(name, data):
    call, arity, options = DROP_INS[name]
    args = data.draw(st.lists(hostile, min_size=0, max_size=arity + 1))
    kwargs = {key: data.draw(hostile) for key in options if data.draw(st.booleans())}
    try:
        call(*args, **kwargs)
    except OpFacadeError as error:
        assert error.argument, f"{name}: {error!r} names no argument"
    except TypeError as error:  # Python's own: the call does not match the signature
        assert "argument" in str(error), f"{name}: {error!r}"
    else:
        pytest.fail(f"{name} accepted {args!r} {kwargs!r} on a host without a GPU run")


# -- the registered ops themselves, as torch.ops and compiled graphs call them -----------------

def _ops() -> dict[str, object]:
    namespace = torch.ops.opfacade
    return {name: getattr(namespace, name).default for name in dir(namespace)
            if not name.startswith("_") and hasattr(getattr(namespace, name), "default")}


OPS = _ops()
_TENSOR = torch._C.TensorType.get()


def _value(argument, data):
    """A value of the argument's schema type, hostile within it: tensors on the host or meta
    device of any rank and dtype (optional ones sometimes None), any bools, numbers and
    strings. torch's schema check passes each; what is wrong with it is the kernels' to say."""
    kind = argument.type
    optional = isinstance(kind, torch._C.OptionalType)
    if optional and data.draw(st.booleans()):
        return None
    inner = kind.getElementType() if optional else kind
    if inner.isSubtypeOf(_TENSOR):
        return data.draw(tensors())
    text = str(inner)
    if text == "bool":
        return data.draw(st.booleans())
    if text in ("int", "SymInt"):
        return data.draw(st.integers(-3, 1 << 20))
    if text == "float":
        return data.draw(st.floats(allow_nan=True))
    if text == "str":
        return data.draw(st.sampled_from(("none", "gelu_tanh", "relu", "nhd", "hnd", "top_left",
                                          "bottom_right", "", "?")))
    raise AssertionError(f"no strategy for {argument.name}: {text}")


@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_registered_ops_raise_only_typed_errors(name, data):
    """Every torch.ops.opfacade op, called with arguments of its schema's types, raises an
    OpFacadeError naming an argument where the values are wrong, on the host and on the meta
    device (the fake kernels): never a crash, never another exception."""
    op = OPS[name]
    args = [_value(argument, data) for argument in op._schema.arguments]
    try:
        op(*args)
    except OpFacadeError as error:
        assert error.argument, f"{name}: {error!r} names no argument"
    else:
        pytest.fail(f"{name} accepted {args!r} on a host without a GPU")

"""How opfacade's torch ops are registered (opfacade/torch/_define.py), on the host: a toy op
(x * factor, with a backward) defined the way every GPU op is, run eagerly, through the
dispatcher with and without grad, under a dispatch mode, through torch.library.opcheck and
under torch.compile (aot_eager). The GPU ops' own opcheck and compile tests are in
tests/test_torch_gpu.py."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
from opfacade.errors import Unsupported  # noqa: E402
from opfacade.torch._define import NAMESPACE, define_op  # noqa: E402

_NAMES = itertools.count()


def _scale_kernel(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def _scale_fake(x, factor):
    return torch.empty_like(x)


def _save(ctx, inputs, output):
    ctx.factor = inputs[1]


def _scale_backward(ctx, grad):
    return (None if grad is None else grad * ctx.factor), None


def _toy(backward=True, kernel=_scale_kernel):
    """A fresh toy op (a name of its own: the namespace is process-wide)."""
    name = f"test_scale_{next(_NAMES)}"
    if backward:
        return define_op(name, kernel, _scale_fake, setup_context=_save,
                         backward=_scale_backward)
    return define_op(name, kernel, _scale_fake)


class _Counting:
    """Stands in for a DefinedOp's op to see whether a call went through the dispatcher."""

    def __init__(self, op):
        self.op, self.calls = op, 0

    def __call__(self, *args):
        self.calls += 1
        return self.op(*args)


def test_an_eager_call_runs_the_ops_autograd_function_without_the_dispatcher():
    toy = _toy()
    toy.op = counting = _Counting(toy.op)
    x = torch.ones(3, requires_grad=True)
    y = toy(x, 2.5)
    assert type(y.grad_fn).__name__.startswith(f"{toy.name}_function")
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.5)) and counting.calls == 0
    with torch.no_grad():
        assert toy(x, 2.0).grad_fn is None and counting.calls == 0


def test_an_eager_call_with_grad_skips_function_apply_python_layer(monkeypatch):
    # With no torch.func transform active, DefinedOp calls the Function's C apply: Python's
    # autograd.Function.apply (argument binding, dead-wrapper unwrapping) is not on the path.
    toy = _toy()
    entered = []
    python_apply = torch.autograd.Function.apply.__func__

    def counted(cls, *args, **kwargs):
        entered.append(cls.__name__)
        return python_apply(cls, *args, **kwargs)

    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(counted))
    x = torch.ones(3, requires_grad=True)
    y = toy(x, 2.0)
    assert type(y.grad_fn).__name__.startswith(f"{toy.name}_function") and entered == []
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(grad, torch.full((3,), 2.0))
    # Inside torch.func.grad, the twin goes through torch's own apply (it needs that layer).
    torch.func.grad(lambda t: toy(t, 3.0).sum())(torch.ones(3))
    assert entered


def test_a_traced_call_goes_through_the_op():
    toy = _toy()
    toy.op = counting = _Counting(toy.op)

    class Subclass(torch.Tensor):  # what tracing hands in: fake or functional tensors
        pass

    toy(torch.ones(3).as_subclass(Subclass), 2.0)
    assert counting.calls == 1
    assert toy.positions == (0,)  # the Tensor arguments are the ones looked at


def test_the_dispatcher_runs_the_op_with_its_autograd():
    toy = _toy()
    x = torch.arange(4.0, requires_grad=True)
    y = toy.op(x, 3.0)
    assert y.requires_grad
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((4,), 3.0))
    with torch.no_grad():  # a parameter under no_grad, as a compiled forward calls the op
        out = toy.op(x, 2.0)
    assert not out.requires_grad and torch.equal(out, x.detach() * 2)


def test_a_dispatch_mode_sees_the_op_called_eagerly():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    toy = _toy()
    with Watch(), torch.no_grad():
        toy(torch.ones(2), 2.0)  # the drop-in's route
    assert sum(toy.name in name for name in seen) == 1, seen
    with Watch():
        toy.op(torch.ones(2), 2.0)  # the dispatcher's: the autograd kernel reads the keys
    assert sum(toy.name in name for name in seen) == 2, seen


def test_an_op_without_backward_refuses_a_gradient_and_runs_without_one():
    toy = _toy(backward=False)
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(Unsupported, match=f"{NAMESPACE}::{toy.name} has no backward"):
        toy.op(x, 2.0)
    with torch.no_grad():
        assert torch.equal(toy.op(x, 2.0), torch.full((2,), 2.0))
    assert torch.equal(toy(x.detach(), 2.0), torch.full((2,), 2.0))


def test_opcheck_passes_for_an_op_defined_this_way():
    toy = _toy()
    torch.library.opcheck(toy.op, (torch.randn(5, requires_grad=True), 1.5))
    torch.library.opcheck(_toy(backward=False).op, (torch.randn(5), 1.5))


def test_compiled_fullgraph_matches_eager_gradients():
    toy = _toy()
    x = torch.randn(6, requires_grad=True)

    def model(t):
        return torch.relu(toy(t, 1.5)).sum()

    model(x).backward()
    expected, x.grad = x.grad.clone(), None
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    compiled(x).backward()
    assert torch.equal(x.grad, expected)


@pytest.mark.parametrize("requires_grad", [True, False])
def test_wants_grad_is_traceable_under_fullgraph_compile(requires_grad):
    """The drop-ins (oft.linear, oft.sdpa, oft.varlen_attention) ask wants_grad before they
    know whether they are traced; its C++ check needs a stand-in Dynamo can trace, or a
    fullgraph compile of a model using them fails."""
    from opfacade.torch._common import wants_grad

    def pick(x, bias):
        return x * 2 if wants_grad(x, bias) else x + 1

    x = torch.randn(4, requires_grad=requires_grad)
    got = torch.compile(pick, backend="eager", fullgraph=True)(x, None)
    assert torch.equal(got, pick(x, None))
    assert torch.equal(got, x * 2 if requires_grad else x + 1)


@pytest.mark.parametrize("through", ["op", "drop-in"])
def test_functionalized_calls_keep_their_gradients(through):
    """torch.func.functionalize (the Functionalize key in the call's keyset) with a gradient
    wanted: the op's autograd.Function runs, and its backward gives the gradient."""
    toy = _toy()
    call = toy.op if through == "op" else toy
    x = torch.randn(5, requires_grad=True)
    out = torch.func.functionalize(lambda t: call(t, 1.5))(x)
    out.sum().backward()
    assert torch.equal(out.detach(), x.detach() * 1.5)
    assert torch.equal(x.grad, torch.full_like(x, 1.5))


def test_torch_func_transforms_differentiate_the_drop_in():
    """torch.func.grad and vjp run the op's autograd.Function, which they accept only with
    forward and setup_context apart. (Through torch.ops they meet the autograd kernel inside
    the dispatcher, where functorch's custom_function_call has no kernel: torch's own
    custom_op ops refuse these transforms too.)"""
    toy = _toy()
    x = torch.randn(5)
    grad = torch.func.grad(lambda t: (toy(t, 1.5) * t).sum())(x)
    torch.testing.assert_close(grad, 3.0 * x, rtol=0, atol=1e-6)
    out, vjp = torch.func.vjp(lambda t: toy(t, -2.0), x)
    assert torch.equal(out, x * -2.0)
    assert torch.equal(vjp(torch.ones(5))[0], torch.full_like(x, -2.0))


def _square_with_backward_op():
    """x * x whose backward calls a second op without a backward of its own, as the GPU ops'
    backwards call their backward ops."""
    name = f"test_square_{next(_NAMES)}"

    def backward_kernel(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return grad * x * 2

    backward_op = define_op(name + "_backward", backward_kernel,
                            lambda grad, x: torch.empty_like(grad))

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return x * x

    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return backward_op(grad, x)

    return define_op(name, kernel, lambda x: torch.empty_like(x), setup_context=save,
                     backward=backward)


def test_a_backward_op_of_the_cotangent_alone_runs_inside_torch_func():
    """A linear op's backward reads only the incoming gradient, which inside torch.func.grad
    is a wrapper that requires no grad: the backward op still gets plain tensors."""
    name = f"test_double_{next(_NAMES)}"

    def backward_kernel(grad: torch.Tensor) -> torch.Tensor:
        return grad.untyped_storage().data_ptr() and grad * 2  # a kernel needs storage

    backward_op = define_op(name + "_backward", backward_kernel, lambda g: torch.empty_like(g))

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    double = define_op(name, kernel, lambda x: torch.empty_like(x),
                       backward=lambda ctx, grad: backward_op(grad))
    x = torch.randn(5)
    weights = torch.randn(5)
    assert torch.equal(torch.func.grad(lambda t: (double(t) * weights).sum())(x), weights * 2)


def test_a_backward_op_runs_inside_torch_func_and_refuses_a_second_order():
    """Inside torch.func.grad a backward runs with create_graph, so the backward op's inputs
    require grad: it runs (first order), and a second-order gradient through it is a typed
    error, in torch.func and in eager autograd alike, never a gradient that leaves it out."""
    square = _square_with_backward_op()
    x = torch.randn(6)
    assert torch.equal(torch.func.grad(lambda t: square(t).sum())(x), x * 2)
    with pytest.raises(Unsupported, match="second-order gradients"):
        torch.func.grad(lambda t: torch.func.grad(lambda u: square(u).sum())(t).sum())(x)
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(square(leaf).sum(), leaf, create_graph=True)
    assert torch.equal(grad.detach(), x * 2)
    with pytest.raises(Unsupported, match="second-order gradients"):
        (grad.sum() + leaf.sum()).backward()


def test_with_grad_applies_the_function_eagerly_and_defers_to_call_otherwise():
    """A drop-in that has found its tensors plain and a gradient wanted calls with_grad: eager,
    the Function without the dispatcher; under a dispatch mode, a torch.func transform or
    torch.compile, the op's own route (__call__) decides."""
    from torch.utils._python_dispatch import TorchDispatchMode

    toy = _toy()
    toy.op = counting = _Counting(toy.op)
    x = torch.ones(3, requires_grad=True)
    y = toy.with_grad(x, 2.5)
    assert type(y.grad_fn).__name__.startswith(f"{toy.name}_function") and counting.calls == 0
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(grad, torch.full((3,), 2.5))

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        toy.with_grad(x, 2.0)
    assert counting.calls == 1  # a mode watches: through the op
    grad = torch.func.grad(lambda t: toy.with_grad(t, 3.0).sum())(torch.ones(3))
    assert torch.equal(grad, torch.full((3,), 3.0))  # the transform's twin, as __call__ takes
    compiled = torch.compile(lambda t: toy.with_grad(t, 1.5).sum(), backend="aot_eager",
                             fullgraph=True)
    x.grad = None
    compiled(x).backward()
    assert torch.equal(x.grad, torch.full((3,), 1.5))

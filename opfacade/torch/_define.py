"""How this package's torch ops are put in torch's dispatcher, and what the drop-ins call.

``define_op`` registers an op with torch.library's public pieces (a schema inferred from the
kernel's annotations, ``Library.define``, ``register_fake``) and, instead of
``torch.library.custom_op``'s Python layers, two kernels of its own: the kernel itself for every
backend, and an autograd kernel. Compiled graphs call an op through the dispatcher with
parameters that require grad under no_grad, and the backward ops with plain gradients; there
custom_op's layers (its autograd kernel re-entering the dispatcher, its backend wrapper's
aliasing checks and dynamo guards) cost several times the kernel's own host time (see
docs/PERF-NOTES.md). The autograd kernel here calls the kernel directly when nothing traces the
call, and otherwise hands it on below autograd, as custom_op does.

What the drop-ins call (``DefinedOp.__call__``) is the op's ``autograd.Function`` in eager mode
(the dispatcher is never entered) and the op itself while torch traces, so both routes save the
same tensors and run the same backward. Inside torch.func.grad or vjp they call a twin of the
Function in torch.func's form (forward and setup_context apart), so those transforms
differentiate the drop-ins; through torch.ops, the transforms meet the autograd kernel inside
the dispatcher, where torch has no kernel for an autograd.Function (torch.library.custom_op ops
refuse them the same way).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._internal.tensors import plain_torch_types
from ..errors import Unsupported
from ._common import autocast_inputs

__all__ = ["NAMESPACE", "DefinedOp", "define_inference_op", "define_op"]

# torch.ops.opfacade.<op>: one namespace for every family's ops.
NAMESPACE = "opfacade"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_PLAIN_TYPES = plain_torch_types(torch)
# The keys below autograd (torch/_library/autograd.py hands a call on with the same set).
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
# In a call's dispatch keys when a fake or functional tensor (a Python subclass) or a
# TorchDispatchMode is involved (Python), or C++ functionalization is (Functionalize): the two
# bits of the keyset's raw form, tested in one call (two has() calls cost 0.66 us on a
# development host, this 0.31).
_TRACING_KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
                 | torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)).raw_repr()
_dispatch_modes = torch._C._len_torch_dispatch_stack
_is_compiling = torch.compiler.is_compiling
# torch.func's transforms: whether any runs, and which is innermost.
_transforms_active = torch._C._are_functorch_transforms_active
_functorch = torch._C._functorch
_GRAD_TRANSFORM = _functorch.TransformType.Grad  # grad and vjp alike


def _innermost_differentiates() -> bool:
    """Whether the innermost torch.func transform (one is active) differentiates (grad, vjp).
    Its tensors are wrappers without storage, which an autograd.Function unwraps. Other
    transforms (functionalize, vmap) have no rule for an autograd.Function in torch, so their
    calls go on as outside any transform."""
    interpreter = _functorch.peek_interpreter_stack()
    return interpreter is not None and interpreter.key() == _GRAD_TRANSFORM


def _c_apply(function: type) -> Callable:
    """``function``'s apply without autograd.Function.apply's Python layer, which binds
    setup_context-form arguments (none here) and unwraps the dead torch.func wrappers of
    finished transforms: with no transform active, 3-4 us a call on a development host with 11
    arguments. A dead wrapper then reaches the kernel, which refuses it as a tensor without
    storage (Unsupported)."""
    return super(torch.autograd.Function, function).apply


def _tensor_positions(op) -> tuple[int, ...]:
    """The positions of the op's Tensor and Tensor? arguments, read from its schema once, so a
    call looks at those alone (checking every argument's type cost 2-4 us a call)."""
    tensor = torch._C.OptionalType(torch._C.TensorType.get())
    return tuple(i for i, argument in enumerate(op._schema.arguments)
                 if argument.type.isSubtypeOf(tensor))


def _requiring_grad(op, positions: tuple[int, ...], args: tuple) -> str:
    """The schema's name of the first tensor argument that requires grad (the refusals'
    subject; read only when refusing)."""
    for i in positions:
        if isinstance(args[i], torch.Tensor) and args[i].requires_grad:
            return op._schema.arguments[i].name
    return "an input"


_grad_enabled = torch._C.is_grad_enabled


def _wants_grad(args: tuple, positions: tuple[int, ...]) -> bool:
    """Whether autograd will ask for a gradient of this call: grad mode on and a tensor among the
    op's tensor arguments requires grad (None or a tensor at each of ``positions``). Read at
    those positions alone: torch's C check over all of sdpa's 11 arguments took 1.3 us on a
    development host, this loop 0.5."""
    if _grad_enabled():
        for i in positions:
            a = args[i]
            if a is not None and a.requires_grad:
                return True
    return False


def _traced(args: tuple, positions: tuple[int, ...]) -> bool:
    """Whether torch is tracing this call or a dispatch mode watches it (torch.compile; fake or
    functional tensors, which are Tensor subclasses; a TorchDispatchMode such as
    FlopCounterMode): then only the op will do."""
    if _is_compiling() or _dispatch_modes():
        return True
    for i in positions:
        a = args[i]
        if a is not None and type(a) not in _PLAIN_TYPES:
            return True
    return False


class DefinedOp:
    """A registered op: ``op`` is ``torch.ops.opfacade.<name>.default``; calling this object
    runs it the way the drop-ins want (see the module's docstring). ``function`` None: the op
    has no backward. (kv_append, a custom_op, is wrapped in one too, for its eager route.)"""

    __slots__ = ("_apply", "_for_transforms", "backward", "function", "kernel", "name", "op",
                 "positions", "setup_context")

    def __init__(self, name: str, kernel: Callable, op, function: type | None = None,
                 positions: tuple[int, ...] | None = None, setup_context: Callable | None = None,
                 backward: Callable | None = None):
        self.name, self.kernel, self.op, self.function = name, kernel, op, function
        self.setup_context, self.backward = setup_context, backward
        # Where the Tensor arguments are.
        self.positions = _tensor_positions(op) if positions is None else positions
        self._for_transforms = None
        # The eager route's Function (__call__ has found the call untraced, so its forward runs
        # the kernel without asking again, as ``function``'s does for the dispatcher's calls).
        self._apply = None if function is None else _c_apply(_autograd_function(
            name, kernel, op, self.positions, setup_context, backward, untraced=True))

    def __call__(self, *args):
        if _traced(args, self.positions):
            return self.op(*args)
        if not _transforms_active():  # the common case, and the cheap check (~70 ns)
            if not _wants_grad(args, self.positions):
                return self.kernel(*args)
            if self._apply is not None:
                return self._apply(*args)
            return self._transformable().apply(*args)  # no backward: a second order raises
        # Inside a torch.func transform. Grad and vjp take the twin with or without grad (a
        # backward op's cotangent needs none); the others, torch's Function.apply.
        if _innermost_differentiates():
            return self._transformable().apply(*args)
        if _wants_grad(args, self.positions):
            return (self.function or self._transformable()).apply(*args)
        return self.kernel(*args)

    def with_grad(self, *args):
        """What a drop-in calls once it has found its tensors plain (torch.Tensor or
        nn.Parameter) and a gradient wanted: the eager route's Function, unless torch traces the
        call or a dispatch mode or torch.func transform runs, where ``__call__`` decides. The
        drop-in's own reads stand for __call__'s type and requires_grad checks (0.6-1 us a call
        on a development host)."""
        if _is_compiling() or _dispatch_modes() or _transforms_active():
            return self(*args)
        return self._apply(*args)

    def _transformable(self) -> type:
        """The op's Function in torch.func's form, for calls inside a transform (grad, vjp),
        whose tensors are wrappers without storage: its forward gets them unwrapped, whether or
        not they require grad.

        An op without a backward (a backward op, called from a backward) gets one too, whose
        backward raises: a backward run with create_graph, as every torch.func.grad and vjp
        runs it, calls such an op with tensors that require grad. A first-order gradient
        never differentiates that call; a second-order one gets a typed error instead of a
        gradient that silently leaves this op's share out."""
        if self._for_transforms is None:
            backward = self.backward
            if backward is None:
                qualname = f"{NAMESPACE}::{self.name}"

                def backward(ctx, *grads):
                    raise Unsupported(f"{qualname} has no backward: second-order gradients "
                                      f"through it are not supported")

            self._for_transforms = _autograd_function(self.name, self.kernel, self.op,
                                                      self.positions, self.setup_context,
                                                      backward, transformable=True)
        return self._for_transforms


_AUTOCAST_CUDA = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)


def _cast_under_autocast(name: str, op) -> None:
    """Gives ``op`` an AutocastCUDA kernel: under torch.autocast("cuda") a call through
    torch.ops casts its floating CUDA inputs to autocast's dtype (``autocast_inputs``, the rule
    the drop-ins apply before they skip the dispatcher), then runs the op with autocast off
    below, as torch's lower-precision ops (F.linear, F.scaled_dot_product_attention) do. Outside
    autocast torch never reaches this kernel, so it costs those calls nothing."""

    def autocast_kernel(keyset, *args):
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CUDA):
            return op(*autocast_inputs(torch.get_autocast_dtype("cuda"), *args))

    _LIBRARY.impl(name, autocast_kernel, "AutocastCUDA", with_keyset=True)


def define_op(name: str, kernel: Callable, fake: Callable, *,
              setup_context: Callable | None = None, backward: Callable | None = None,
              autocast: bool = False) -> DefinedOp:
    """Registers ``opfacade::<name>`` (its schema from ``kernel``'s annotations; no argument is
    mutated) with ``fake`` as its fake kernel. With ``backward`` (and ``setup_context``, as
    torch.library.register_autograd takes them) it is differentiable; without, a call that
    autograd would differentiate raises Unsupported. ``autocast``: the op computes in lower
    precision under torch.autocast("cuda"), as its torch counterpart does
    (``_cast_under_autocast``); backward ops take the dtypes their forward ran in and have none."""
    _LIBRARY.define(name + torch.library.infer_schema(kernel, mutates_args=()))
    qualname = f"{NAMESPACE}::{name}"
    # Every backend: a host tensor reaches the kernel, whose device check names it.
    _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, fake, lib=_LIBRARY)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    if autocast:
        _cast_under_autocast(name, op)
    positions = _tensor_positions(op)
    function = None if backward is None else _autograd_function(name, kernel, op, positions,
                                                                setup_context, backward)

    def autograd_kernel(keyset, *args):
        if _wants_grad(args, positions):
            if function is None:
                argument = _requiring_grad(op, positions, args)
                raise Unsupported(f"{qualname} has no backward, but {argument} requires grad; "
                                  f"call it under torch.no_grad() or detach the inputs",
                                  argument=argument)
            return function.apply(*args)
        if keyset.raw_repr() & _TRACING_KEYS:
            return op.redispatch(keyset & _BELOW_AUTOGRAD, *args)
        return kernel(*args)  # a compiled graph's call, or an eager one without grad

    _LIBRARY.impl(name, autograd_kernel, "Autograd", with_keyset=True)
    return DefinedOp(name, kernel, op, function, positions, setup_context, backward)


def define_inference_op(name: str, kernel: Callable, fake: Callable, *, training_op: str,
                        autocast: bool = False):
    """Registers ``opfacade::<name>``, an op without a backward for calls that want no gradient
    (a graph compiled under no_grad), and returns it (``torch.ops.opfacade.<name>.default``).
    ``training_op`` names the differentiable op that serves the same calls; ``autocast`` as
    define_op's.

    Its Autograd key falls through to the kernel in C++: no Python autograd kernel, one crossing
    from the dispatcher into Python a call (define_op's ops cross twice). Without that kernel
    autograd would give an output that silently has no gradient, so the real and the fake
    kernel both refuse a call that wants one (Unsupported); the drop-ins call the training op
    then. (A development host: a 5-argument op 9.0 us a call this way, 10.3 us with a Python
    autograd kernel; docs/PERF-NOTES.md.)"""
    qualname = f"{NAMESPACE}::{name}"
    _LIBRARY.define(name + torch.library.infer_schema(kernel, mutates_args=()))
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    positions = _tensor_positions(op)

    def refusing(function: Callable) -> Callable:
        def call(*args):
            if _wants_grad(args, positions):
                argument = _requiring_grad(op, positions, args)
                raise Unsupported(f"{qualname} is for calls that want no gradient, but "
                                  f"{argument} requires grad; {NAMESPACE}::{training_op} has a "
                                  f"backward", argument=argument)
            return function(*args)
        return call

    _LIBRARY.impl(name, refusing(kernel), "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, refusing(fake), lib=_LIBRARY)
    _LIBRARY.impl(name, torch.library.fallthrough_kernel, "Autograd")
    if autocast:
        _cast_under_autocast(name, op)
    return op


def _autograd_function(name: str, kernel: Callable, op, positions: tuple[int, ...],
                       setup_context: Callable | None, backward: Callable, *,
                       transformable: bool = False, untraced: bool = False) -> type:
    """The op's autograd.Function: forward runs the kernel (or, under tracing, the op below
    autograd, through the autograd kernel's no-grad branch), and ``setup_context`` saves what
    the backward needs.

    ``transformable``: forward and setup_context are separate staticmethods, the form
    torch.func's transforms require. Function.apply binds such a forward's signature with
    inspect on every call (about 10 us on a development host), so plain eager calls take the
    other form, with setup_context called from forward(ctx, ...).

    ``untraced``: for callers that have found the call untraced (DefinedOp's eager route):
    forward runs the kernel without asking again (1-2 us a call on a development host)."""

    if untraced:
        def run(args):
            return kernel(*args)
    else:
        def run(args):
            return op(*args) if _traced(args, positions) else kernel(*args)

    def save(ctx, inputs, output):
        if setup_context is not None:
            setup_context(ctx, inputs, output)
        # Unused outputs (stats, aux) get None, not zeros allocated for them.
        ctx.set_materialize_grads(False)

    if transformable:
        methods = {"forward": staticmethod(lambda *args: run(args)),
                   "setup_context": staticmethod(save)}
    else:
        def forward(ctx, *args):
            output = run(args)
            save(ctx, args, output)
            return output

        methods = {"forward": staticmethod(forward)}
    # Made by type() so that the name reaches the backward node autograd names after it
    # ("<name>_functionBackward" in a grad_fn), which a class statement's name would not.
    return type(f"{name}_function", (torch.autograd.Function,),
                {**methods, "backward": staticmethod(backward)})

"""Property-based: every public entry point, fed random and hostile inputs, returns a result or
raises an ``OpFacadeError``, never anything else; and a host run it accepts writes what the float64
reference computes.

Each test runs once per op of every family in ``_registry.py`` (a new family is fuzzed without
a line here): descriptors from constructors, ``model_validate``, JSON and ``model_copy``;
preferences; ``Plan.select``/``explain``/``select_for_training`` with random targets; and
``can_implement``/``run`` on host plans with random NumPy (and torch CPU) arguments: wrong shapes,
dtypes and strides, read-only, broadcast, self-overlapping and aliased arrays, None and
non-arrays. No target names a real GPU ordinal, so a GPU machine fuzzes the same paths.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from opfacade import (
    ArchSku,
    BackendKind,
    ElementKind,
    MathPrecision,
    OpFacadeError,
    Plan,
    PlanPreference,
    Workspace,
)
from opfacade._internal.view import numpy_dtype
from opfacade._registry import FAMILIES, all_ops
from opfacade.plan import ExplainReport, plan_class
from opfacade.testing import random_inputs, reference_outputs

OPS = all_ops()
SKU_IDS = [impl.sku.id for op in OPS for impl in op.skus]


def fuzz(examples: int):
    """Hypothesis settings: ``examples`` per test (and per op), no per-example deadline. The
    counts keep this file near 15 s on two cores while each family meets thousands of inputs
    (each example feeds several entry points)."""
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def by_op(test):
    return pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])(test)


def typed(call, *args, **kwargs):
    """The call's result, or None when it raised an OpFacadeError; anything else propagates."""
    try:
        return call(*args, **kwargs)
    except OpFacadeError:
        return None


# -- values: valid, wrong and hostile -------------------------------------------------------------

class Hostile:
    """An object whose conversions all fail (its repr and hash work, so errors can name it)."""

    def _fail(self, *args):
        raise RuntimeError("hostile conversion")

    __str__ = __int__ = __index__ = __float__ = __bool__ = __iter__ = __len__ = _fail

    def __repr__(self) -> str:
        return "<Hostile>"


VOCABULARY = sorted({e.value for e in ElementKind} | {a.value for a in ArchSku}
                    | {b.value for b in BackendKind} | {m.value for m in MathPrecision}
                    | {"bhsd", "bshd", "sbhd", "kn", "nk", "none", "relu", "gelu_tanh", "silu",
                       "top_left", "bottom_right", "bhqk", "11qk", "1,2", "3,none", "speed",
                       "memory", "cpu", "sm_90", "9.0", "true", "1e3", "-0"})
SPECIAL = [0, -1, 1, 2, 2**24, 2**31 - 1, 2**31, 2**53 + 1, 2**63, 2**64, 2**100, -2**100,
           10**400, float("nan"), float("inf"), -float("inf"), -0.0, 5e-324, 1e308, 0.5, 1.0]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from(SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=4),
    st.sampled_from(VOCABULARY), st.builds(object), st.builds(Hostile),
)
junk = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner), st.frozensets(st.sampled_from(
        VOCABULARY), max_size=2), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**80, 2**80), st.floats(),
              st.text(max_size=6), st.sampled_from(VOCABULARY)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)


def _samples(op) -> list:
    """The op's standard problems for every element it has them for, as dicts."""
    found = []
    for element in (ElementKind.f64, ElementKind.f32, ElementKind.f16, ElementKind.bf16):
        with contextlib.suppress(OpFacadeError):
            found += [d.model_dump() for d in op.sample_problems(element)]
    return found


SAMPLES = {op.name: _samples(op) for op in OPS}


@st.composite
def small_problem(draw, op) -> dict:
    """One of the op's standard problems with every extent made small (1 to 4): mostly valid,
    and small enough for the host reference."""
    fields = dict(draw(st.sampled_from(SAMPLES[op.name])))
    for name, value in fields.items():
        if isinstance(value, int) and not isinstance(value, bool):
            fields[name] = draw(st.integers(1, 4))
    for _ in range(3):  # an extent that breaks a rule between fields (heads_q % heads_kv) -> 1
        try:
            op.descriptor(**fields)
        except OpFacadeError as error:
            if not isinstance(fields.get(error.field), int):
                break
            fields[error.field] = 1
    return fields


@st.composite
def problem_fields(draw, op) -> dict:
    """A small problem, often with some fields replaced by values of the field's vocabulary,
    junk, or unknown names."""
    fields = draw(small_problem(op))
    names = sorted(op.descriptor.model_fields) + ["bogus", ""]
    seen = {repr(v): v for sample in SAMPLES[op.name] for v in sample.values()}
    value = st.one_of(junk, st.sampled_from([seen[k] for k in sorted(seen)]))
    fields.update(draw(st.dictionaries(st.sampled_from(names), value, max_size=3)))
    for name in draw(st.lists(st.sampled_from(names), max_size=1)):
        fields.pop(name, None)
    return fields


preference = st.one_of(
    st.none(), junk, st.builds(PlanPreference),
    st.fixed_dictionaries({}, optional={
        "deterministic": st.one_of(st.booleans(), junk),
        "bit_stable": st.one_of(st.booleans(), junk),
        "min_math_precision": st.one_of(st.sampled_from(list(MathPrecision)), junk),
        "max_rel_error": st.one_of(st.floats(), junk),
        "backends": st.one_of(st.lists(st.sampled_from([b.value for b in BackendKind]
                                                       + ["tensorrt"]), max_size=3), junk),
        "workspace_limit": st.one_of(st.integers(-5, 2**70), junk),
        "objective": st.one_of(st.sampled_from(["speed", "memory", "fast"]), junk),
        "sku": st.one_of(st.sampled_from(SKU_IDS), junk),
        "bogus": junk,
    }),
)
arch = st.one_of(
    st.sampled_from(list(ArchSku) + ["sm_90", "9.0", "90", (9, 0), (8, 6), "sm7", "hopper", "",
                                     (9,), (9, 0, 1), (), 90, 9.0, 8.6, "sm_100a", -90]),
    junk.filter(lambda value: value is not None))


def _no_real_ordinal(value) -> bool:
    return isinstance(value, bool) or not (isinstance(value, int) and 0 <= value < 1024)


bad_device = st.one_of(st.sampled_from([-1, 1.5, 10**6, "gpu0", "cuda:0", True, "CPU", b"cpu"]),
                       junk.filter(lambda v: v is not None and _no_real_ordinal(v)))
target = st.one_of(
    st.just({"device": "cpu"}), st.builds(lambda a: {"arch": a}, arch),
    st.builds(lambda d: {"device": d}, bad_device),
    st.builds(lambda a, d: {"arch": a, "device": d}, arch, st.one_of(st.just("cpu"),
                                                                      bad_device)))


# -- descriptors ----------------------------------------------------------------------------------

@by_op
@fuzz(150)
@given(data=st.data())
def test_descriptors_only_raise_typed_errors(op, data):
    cls = op.descriptor
    fields = data.draw(problem_fields(op))
    desc = typed(cls, **fields)
    typed(cls.model_validate, data.draw(st.one_of(st.just(fields), junk)))
    typed(cls.model_validate_strings, data.draw(st.one_of(st.just(fields), junk)))
    try:
        text = json.dumps(data.draw(st.one_of(st.just(fields), json_values)))
    except (TypeError, ValueError):  # junk with no JSON form: bytes, objects, NaN keys
        text = data.draw(st.text(max_size=40))
    typed(cls.from_json, text)
    typed(cls.model_validate_json, data.draw(st.one_of(st.just(text), st.binary(max_size=20))))
    typed(cls.from_json, data.draw(junk))
    if desc is None:
        return
    assert hash(desc) == hash(cls.from_json(desc.model_dump_json()))
    assert cls.model_validate(desc.model_dump()) == desc
    update = data.draw(st.one_of(
        st.dictionaries(st.sampled_from(sorted(cls.model_fields) + ["bogus"]), junk, max_size=2),
        junk))
    copy = typed(desc.model_copy, update=update)
    if copy is not None and update:  # a copy that validated is a valid descriptor
        assert cls.model_validate_json(copy.model_dump_json()) == copy


@fuzz(250)
@given(pref=preference, text=st.one_of(st.text(max_size=30), json_values.map(json.dumps)))
def test_preferences_only_raise_typed_errors(pref, text):
    coerced = typed(PlanPreference.coerce, pref)
    if isinstance(pref, dict):
        built = typed(PlanPreference, **pref)
        assert (built is None) == (coerced is None) and built == coerced
    typed(PlanPreference.model_validate_json, text)
    if coerced is not None:
        assert PlanPreference.model_validate_json(coerced.model_dump_json()) == coerced


# -- selection ------------------------------------------------------------------------------------

@by_op
@fuzz(150)
@given(data=st.data())
def test_selection_only_raises_typed_errors(op, data):
    fields = data.draw(st.one_of(small_problem(op), problem_fields(op)))
    desc = typed(op.descriptor, **fields)
    if desc is None:
        desc = data.draw(st.one_of(junk, st.just(None)))  # selection's own descriptor check
    pref, where = data.draw(preference), data.draw(target)
    report = typed(Plan.explain, desc, pref, **where)
    plan = typed(Plan.select, desc, pref, **where)
    if report is not None:
        assert isinstance(report, ExplainReport) and len(report.verdicts) == len(op.skus)
        assert report.table() and json.loads(report.to_json())["op"] == op.name
    if plan is not None:
        assert report is not None and plan.sku.id == report.chosen.sku.id
        assert plan.workspace_size >= 0 and not plan.freed
        plan.free()
        plan.free()
    pinned = plan_class(data.draw(st.sampled_from(OPS)).name)
    typed(pinned.select, desc, pref, **where)
    typed(Plan.select_for_training, desc, pref, **where)
    if where == {"device": "cpu"}:
        typed(Plan.cached, desc, pref, device="cpu")


# -- host runs ------------------------------------------------------------------------------------

# Forms of a valid argument the host plan must accept and compute with, each element where the
# C-order copy has it: every other row of a bigger array, a non-last axis stored reversed
# (negative strides), an address off the element alignment, a torch CPU tensor.
VALID_FORMS = ("same", "same", "rows", "reversed", "unaligned", "torch")
# Ways to make an argument wrong (or, for "alias", maybe still right: an input that is another
# input of its shape).
ARRAY_MUTATIONS = ("none", "junk", "shape", "rank", "dtype", "last_dim", "readonly", "broadcast",
                   "overlap", "alias", "scalar", "fortran", "list")
OTHER_DTYPES = [np.float64, np.float32, np.float16, np.int32, np.int64, np.uint8, np.bool_,
                np.complex64, ">f4", ">f8", np.object_, "U1", "datetime64[s]", np.int8]


def _valid_arrays(op, desc, rng) -> dict:
    """Arguments the host plan must accept: random [-1, 1) values (mixed signs, rounded to each
    element), in each argument's layout; outputs poisoned with NaN (random bits for integer
    outputs), inputs no random value can be (sequence lengths) from the op's
    ``verification_inputs``, u8 masks random."""
    signature = op.signature(desc)
    values = random_inputs(signature, rng)
    if op.verification_inputs is not None:
        values = op.verification_inputs(desc, values, rng)
    arrays = {}
    for name, spec in signature.items():
        dtype = numpy_dtype(spec.element)
        if spec.role == "out":
            value = np.full(spec.shape, np.nan) if spec.element.is_float else None
        else:
            value = values.get(name)
        if value is None:  # integer outputs, u8 masks: random bits
            value = rng.integers(0, 256 if spec.element is ElementKind.u8 else 4,
                                 size=spec.shape)
        order = (sorted(range(len(spec.shape)), key=lambda d: -spec.strides[d]) if spec.strides
                 else list(range(len(spec.shape))))
        stored = np.ascontiguousarray(np.asarray(value).transpose(order)).astype(dtype)
        arrays[name] = stored.transpose(np.argsort(order))
    return arrays


def _mutated(array, how: str, others: list, rng):
    """``array`` made wrong (or, aliased, maybe still right) in the way ``how`` names."""
    if hasattr(array, "numpy"):  # a torch form: mutate the NumPy array it shares memory with
        array = array.numpy()
    if array is None and how not in ("junk", "list"):
        return array
    shape = array.shape if array is not None else (2,)
    if how == "none":
        return None
    if how == "junk":
        choices = [1, 2.5, "x", b"", object(), Hostile(), {}, (), np.float32(1)]
        return choices[int(rng.integers(len(choices)))]
    if how == "list":
        return np.asarray(array, dtype=np.float64).tolist() if array is not None else [[1.0]]
    if how == "shape":
        changed = list(shape)
        axis = int(rng.integers(len(changed))) if changed else 0
        if changed:
            changed[axis] = max(0, changed[axis] + int(rng.choice([-1, 1])))
        return np.zeros(changed, array.dtype)
    if how == "rank":
        return np.zeros((1, *shape) if rng.random() < 0.5 else shape[1:], array.dtype)
    if how == "dtype":
        return np.zeros(shape, rng.choice(OTHER_DTYPES))
    if how == "last_dim":
        return np.asfortranarray(array) if array.ndim >= 2 else array[::-1]
    if how == "readonly":
        array = array.copy()
        array.flags.writeable = False
        return array
    if how == "broadcast":
        return np.broadcast_to(array[:1] if array.ndim else array, shape)
    if how == "overlap":  # every index of the first axis on the same memory, writable
        dense = np.ascontiguousarray(array)  # as_strided needs strides within its own buffer
        strides = (0, *dense.strides[1:]) if dense.ndim else ()
        return np.lib.stride_tricks.as_strided(dense, shape, strides, writeable=True)
    if how == "alias":
        same = [o for o in others if o is not None and o is not array]
        return same[int(rng.integers(len(same)))] if same else array
    if how == "scalar":
        return array.reshape(-1)[:1].reshape(()) if array.size else np.float64(0)
    if how == "fortran":
        return np.asfortranarray(array)
    raise AssertionError(how)


def _in_form(array: np.ndarray, form: str, rng) -> object:
    """``array``'s values in another valid form (see VALID_FORMS)."""
    if form in ("rows", "reversed") and array.ndim >= 2:
        axis = int(rng.integers(array.ndim - 1))  # never the last: it must have unit stride
        if form == "rows":
            return np.repeat(array, 2, axis=axis)[(slice(None),) * axis + (slice(None, None, 2),)]
        return np.flip(np.flip(array, axis).copy(), axis)
    if form == "unaligned":
        view = np.zeros(array.nbytes + 1, np.uint8)[1:].view(array.dtype).reshape(array.shape)
        view[...] = array
        return view
    torch = _torch()
    if form == "torch" and torch is not None and array.dtype.kind in "fiu":  # not bf16 ("V")
        return torch.from_numpy(np.ascontiguousarray(array))
    return array


@functools.cache
def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _smallest_subnormal(element: ElementKind) -> float:
    """The spacing of the element's subnormals: one rounding's absolute error near zero."""
    dtype = numpy_dtype(element)
    try:
        return float(np.finfo(dtype).smallest_subnormal)
    except ValueError:  # bf16, fp8: ml_dtypes' own finfo
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).smallest_subnormal)


def _expect_reference(op, plan, inputs: dict, arrays: dict, before: dict) -> None:
    """The outputs of an accepted host run are bit for bit a separate float64 reference run on
    C-contiguous copies of its inputs, rounded once to each output's element: the reference
    declares bit_stable, so neither the arguments' layouts nor their packages may change a
    bit. The reference's outputs start as NaN, so what an op leaves as it was (tokens of no
    packed sequence) is NaN there, where the run's array keeps what it held ``before`` the run:
    NaN as drawn, or zeros where a mutation swapped in a zero array of the right dtype."""
    expected = reference_outputs(plan, inputs)
    signature = op.signature(plan.descriptor)
    for name, want in expected.items():
        got = np.asarray(arrays[name].numpy() if hasattr(arrays[name], "numpy")
                         else arrays[name]).astype(np.float64)
        rounded = want.astype(numpy_dtype(signature[name].element)).astype(np.float64)
        left = np.isnan(rounded) & ~np.isnan(got)  # not NaN after the run: left as it was
        if name in before:
            np.testing.assert_array_equal(got[left], before[name][left], err_msg=name)
            rounded = np.where(left, got, rounded)
        np.testing.assert_array_equal(got, rounded, err_msg=name, strict=True)


HOST_PREFERENCES = st.sampled_from([None, {"deterministic": True}, {"backends": ["reference"]},
                                    PlanPreference(objective="memory", bit_stable=True)])


@st.composite
def host_arguments(draw, op, desc):
    """The op's arguments for ``desc``: valid arrays, each in one of the valid forms, with up to
    two made wrong, maybe an argument the descriptor does not ask for, as the op's Args or as
    junk. Returns (args, the arrays by name)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = {name: _in_form(array, draw(st.sampled_from(VALID_FORMS)), rng)
              for name, array in _valid_arrays(op, desc, rng).items()}
    names = list(arrays)
    count = draw(st.sampled_from([0, 0, 1, 1, 2]))
    for name in draw(st.lists(st.sampled_from(names), min_size=count, max_size=count,
                              unique=True)):
        how = draw(st.sampled_from(ARRAY_MUTATIONS))
        arrays[name] = _mutated(arrays[name], how, list(arrays.values()), rng)
    extra = draw(st.sampled_from([None, *op.args.__dataclass_fields__]))
    if extra is not None and extra not in arrays and draw(st.booleans()):
        arrays[extra] = np.zeros(2)
    form = draw(st.integers(0, 9))  # mostly the op's Args; else a dict of them, or junk
    args = op.args(**arrays) if form > 1 else arrays if form == 1 else draw(junk)
    return args, arrays


def _input_values(op, desc, arrays, outputs: bool = False) -> dict:
    """float64 copies of the inputs (integers kept as they are), taken before the run; of the
    outputs instead with ``outputs``."""
    signature = op.signature(desc)
    return {name: np.array(value.numpy() if hasattr(value, "numpy") else value,
                           dtype=np.float64 if signature[name].element.is_float else None)
            for name, value in arrays.items()
            if name in signature and (signature[name].role == "out") == outputs}


@by_op
@fuzz(200)
@given(data=st.data())
def test_host_runs_only_raise_typed_errors_and_accepted_runs_match_the_reference(op, data):
    fields = data.draw(small_problem(op))
    if data.draw(st.integers(0, 4)) == 0:
        fields.update(data.draw(problem_fields(op)))
    desc = typed(op.descriptor, **fields)
    assume(desc is not None)
    pref = data.draw(preference if data.draw(st.integers(0, 4)) == 0 else HOST_PREFERENCES)
    plan = typed(Plan.select, desc, pref, device="cpu")
    if plan is None:
        event("no host plan")
        return
    if sum(math.prod(spec.shape) for spec in op.signature(desc).values()) > 1 << 14:
        event("too large to run on the host here")  # a junk extent the host plan accepts
        return
    args, arrays = data.draw(host_arguments(op, desc))
    workspace = st.one_of(st.just(np.zeros(64, np.uint8)), junk, st.builds(Workspace, junk, junk,
                                                                          junk))
    typed(plan.can_implement, args, data.draw(workspace))
    if not _accepted(plan, args):
        event("refused host run")
        with pytest.raises(OpFacadeError):  # what can_implement refuses, run refuses
            plan.run(args)
        with pytest.raises(OpFacadeError):
            plan.prepare(args)
        return
    inputs = _input_values(op, desc, arrays)
    before = _input_values(op, desc, arrays, outputs=True)
    stream = data.draw(st.one_of(st.none(), junk))  # a host plan has no stream to check
    if data.draw(st.booleans()):
        plan.run(args, stream=stream)
    else:
        plan.prepare(args, stream=stream)()
    _expect_reference(op, plan, inputs, arrays, before)
    event("accepted host run, checked against the reference")
    plan.free()
    with pytest.raises(OpFacadeError):
        plan.run(args)


def _accepted(plan, args) -> bool:
    """Whether can_implement takes ``args`` (it returns None either way)."""
    try:
        plan.can_implement(args)
    except OpFacadeError:
        return False
    return True


def test_every_op_of_every_family_is_fuzzed():
    table = [op.name for family in FAMILIES for op in family.contract.OPS]
    assert [op.name for op in OPS] == table and {f.name for f in FAMILIES} >= {"alibi", "linear",
                                                                             "sdpa"}
    assert all(SAMPLES[op.name] for op in OPS), "an op without sample problems is not fuzzed"

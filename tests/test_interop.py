"""The interop edge on the host: wrapping, checks, streams, devices and allocation, with no GPU
needed.

Device objects are stood in for by fakes: a class exposing ``__cuda_array_interface__`` with
made-up pointers, DLPack capsules from NumPy whose device or dtype fields are rewritten, and fake
``torch``/``cupy`` modules where only the stream and allocator calls matter. Real GPU paths are
exercised by the GPU-marked tests elsewhere.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import subprocess
import sys
import types
import weakref
from pathlib import Path

import numpy as np
import pytest

from opfacade._internal import device, interop, memory, operands
from opfacade._internal.device import Devices
from opfacade._internal.streams import (
    StreamObjects,
    cupy_stream,
    owning_package,
    resolve_stream,
    torch_stream_reader,
)
from opfacade._internal.tensors import (
    TensorView,
    as_numpy,
    expect,
    expect_aligned,
    expect_args_type,
    expect_no_overlap,
    expect_no_overlaps,
    wrap,
)
from opfacade.errors import (
    DeviceMismatch,
    DTypeMismatch,
    InvalidArgument,
    LayoutMismatch,
    ShapeMismatch,
    Unsupported,
)
from opfacade.types import ArchSku
from opfacade.types import ElementKind as E

FAKE_PTR = 0x7F0000000000


def raises(kind: type[Exception], argument: str, call, *args, **kwargs) -> Exception:
    """Runs ``call`` expecting exactly ``kind``, naming ``argument`` in message and attribute."""
    with pytest.raises(kind) as info:
        call(*args, **kwargs)
    error = info.value
    assert type(error) is kind, f"expected {kind.__name__}, got {type(error).__name__}: {error}"
    assert argument in str(error)
    if isinstance(error, InvalidArgument):
        assert error.argument == argument
    return error


def view_of(shape, strides, *, ptr=0x1000, element=E.f32, device=0, readonly=False):
    return TensorView(ptr, tuple(shape), tuple(strides), element, device, "cupy", None,
                      readonly=readonly)


# ----------------------------------------------------------------------------- NumPy


@pytest.mark.parametrize(
    ("dtype", "element"),
    [(np.float64, E.f64), (np.float32, E.f32), (np.float16, E.f16), (np.int32, E.i32),
     (np.int64, E.i64), (np.uint8, E.u8)],
)
def test_numpy_dtypes(dtype, element):
    array = np.zeros((2, 3), dtype=dtype)
    view = wrap(array, "x")
    assert view.element is element
    assert (view.ptr, view.shape, view.strides) == (array.ctypes.data, (2, 3), (3, 1))
    assert (view.device, view.package, view.readonly) == (None, "numpy", False)
    assert view.obj is array
    assert view.is_contiguous and view.size == 6 and view.nbytes == array.nbytes
    assert view.ndim == 2 and view.itemsize == array.itemsize


def test_numpy_noncontiguous_slice():
    base = np.zeros((4, 6), dtype=np.float32)
    view = wrap(base[1:, ::2], "x")
    assert view.shape == (3, 3) and view.strides == (6, 2)
    assert view.ptr == base.ctypes.data + 6 * 4
    assert not view.is_contiguous
    assert view.byte_span() == (base.ctypes.data + 24, base.ctypes.data + 24 + (2 * 6 + 4 + 1) * 4)


def test_numpy_negative_strides_point_at_first_element():
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    flipped = base[::-1, ::-1]
    view = wrap(flipped, "x")
    assert view.strides == (-4, -1)
    assert view.ptr == base.ctypes.data + 11 * 8  # element [0, 0] of the flipped array
    assert view.byte_span() == (base.ctypes.data, base.ctypes.data + base.nbytes)
    assert not view.is_contiguous


def test_numpy_byte_strides_not_whole_elements():
    raw = np.zeros(64, dtype=np.uint8)
    odd = np.lib.stride_tricks.as_strided(raw[:8].view(np.float32), shape=(3,), strides=(6,))
    error = raises(LayoutMismatch, "scores", wrap, odd, "scores")
    assert "(6,)" in str(error) and "4" in str(error)


def test_numpy_readonly_and_zero_size():
    array = np.zeros((0, 5), dtype=np.float32)
    array.flags.writeable = False
    view = wrap(array, "x")
    assert view.readonly and view.size == 0 and view.is_contiguous
    assert view.byte_span() == (view.ptr, view.ptr)


def test_numpy_unsupported_dtypes():
    error = raises(DTypeMismatch, "q", wrap, np.zeros(3, dtype=np.complex64), "q")
    assert str(error).startswith("q has element type complex64, which opfacade does not support")
    assert "f64, f32, f16, bf16, fp8_e4m3, fp8_e5m2, i32, i64, u8" in str(error)
    raises(DTypeMismatch, "mask", wrap, np.zeros(3, dtype=bool), "mask")
    error = raises(DTypeMismatch, "k", wrap, np.zeros(3, dtype=">f4"), "k")
    assert "big-endian" in str(error)


def test_numpy_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for dtype, element in [(ml_dtypes.bfloat16, E.bf16), (ml_dtypes.float8_e4m3fn, E.fp8_e4m3),
                           (ml_dtypes.float8_e5m2, E.fp8_e5m2)]:
        assert wrap(np.zeros(4, dtype=dtype), "x").element is element


def test_unsupported_object():
    error = raises(InvalidArgument, "bias", wrap, [1.0, 2.0], "bias")
    assert "got list" in str(error)
    raises(InvalidArgument, "bias", wrap, 3.0, "bias")


def test_wrap_is_idempotent_and_views_hash_without_obj():
    array = np.zeros(3, dtype=np.float32)
    view = wrap(array, "x")
    assert wrap(view, "x") is view
    assert view == wrap(array, "y") and hash(view) == hash(wrap(array, "y"))
    assert "obj" not in repr(view)


def test_as_numpy_returns_the_original_numpy_array():
    array = np.zeros(3, dtype=np.float32)
    assert as_numpy(wrap(array, "x")) is array
    raises(InvalidArgument, "x", as_numpy, view_of((3,), (1,)), name="x")


# ----------------------------------------------------------------------------- CUDA array interface


class FakeCudaArray:
    """Something that speaks ``__cuda_array_interface__`` v3 without any real device memory."""

    def __init__(self, shape, typestr, *, ptr=FAKE_PTR, strides=None, readonly=False, **extra):
        self.interface = {"version": 3, "shape": shape, "typestr": typestr,
                          "data": (ptr, readonly), "strides": strides, "stream": None, **extra}

    @property
    def __cuda_array_interface__(self):
        return self.interface


def fake_class(module: str, base=FakeCudaArray, **attrs):
    return type("FakeArray", (base,), {"__module__": module, **attrs})


@pytest.fixture
def device_3(monkeypatch):
    looked_up = []

    def lookup(ptr, name):
        looked_up.append(ptr)
        return 3

    monkeypatch.setattr(interop, "_device_ordinal_of_pointer", lookup)
    return looked_up


@pytest.mark.parametrize(("typestr", "element"), [("<f4", E.f32), ("<f2", E.f16), ("<i8", E.i64),
                                                  ("|u1", E.u8), ("<f8", E.f64), ("<i4", E.i32)])
def test_cai_c_contiguous(device_3, typestr, element):
    array = FakeCudaArray((2, 3, 4), typestr)
    view = wrap(array, "k")
    assert (view.ptr, view.shape, view.strides) == (FAKE_PTR, (2, 3, 4), (12, 4, 1))
    assert (view.element, view.device, view.package) == (element, 3, "cuda_array_interface")
    assert view.obj is array and not view.readonly and view.is_contiguous
    assert device_3 == [FAKE_PTR]


def test_cai_explicit_strides_and_readonly(device_3):
    view = wrap(FakeCudaArray((4, 8), "<f2", strides=(64, 2), readonly=True), "v")
    assert view.strides == (32, 1) and view.readonly and not view.is_contiguous
    raises(LayoutMismatch, "v", wrap, FakeCudaArray((4, 8), "<f4", strides=(64, 6)), "v")


def test_cai_unsupported_and_malformed(device_3):
    error = raises(DTypeMismatch, "q", wrap, FakeCudaArray((3,), "<c8"), "q")
    assert "complex64" in str(error)
    raises(DTypeMismatch, "q", wrap, FakeCudaArray((3,), ">f4"), "q")
    raises(InvalidArgument, "q", wrap, FakeCudaArray((3,), "<f4", mask=object()), "q")
    broken = FakeCudaArray((3,), "<f4")
    del broken.interface["data"]
    raises(InvalidArgument, "q", wrap, broken, "q")


def test_cai_cupy_uses_device_id_and_skips_pointer_lookup(monkeypatch):
    def no_lookup(ptr, name):
        raise AssertionError("CuPy arrays carry their device")

    monkeypatch.setattr(interop, "_device_ordinal_of_pointer", no_lookup)
    cupy_like = fake_class("cupy", device=types.SimpleNamespace(id=2))
    view = wrap(cupy_like((5,), "<f4"), "x")
    assert (view.package, view.device) == ("cupy", 2)


def test_cai_jax_is_readonly_and_bf16_comes_from_dtype(device_3):
    jax_like = fake_class("jaxlib.xla_extension", dtype=types.SimpleNamespace(name="bfloat16"))
    view = wrap(jax_like((2, 2), "<V2"), "q")
    assert (view.package, view.element, view.readonly) == ("jax", E.bf16, True)
    error = raises(DTypeMismatch, "q", wrap, fake_class("jax")((2,), "<V2"), "q")
    assert "V2" in str(error)


def test_cai_pointer_that_is_not_cuda_memory_names_the_argument():
    # No GPU and no driver here: neither cuda.bindings nor CuPy can place the pointer.
    raises(DeviceMismatch, "slopes", wrap, FakeCudaArray((4,), "<f4"), "slopes")


def test_cai_that_raises_falls_back_to_dlpack():
    host = np.arange(3, dtype=np.float32)

    class HostOnly:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("only defined for GPU buffers")

        def __dlpack__(self, **kwargs):
            return host.__dlpack__(**kwargs)

    view = wrap(HostOnly(), "x")
    assert (view.package, view.device, view.ptr) == ("dlpack", None, host.ctypes.data)

    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("boom")

    raises(InvalidArgument, "x", wrap, Broken(), "x")


# ----------------------------------------------------------------------------- DLPack


class Producer:
    """Exports ``array`` through DLPack only (NumPy arrays themselves take the NumPy path)."""

    def __init__(self, array, patch=None, **dlpack_kwargs):
        self.array, self.patch, self.kwargs = array, patch, dlpack_kwargs

    def __dlpack__(self, **kwargs):
        capsule = self.array.__dlpack__(**self.kwargs, **kwargs)
        if self.patch is not None:
            address = interop._capsule_pointer(capsule, b"dltensor")
            self.patch(interop._DLManagedTensor.from_address(address).dl_tensor)
        return capsule


def retype(code, bits, lanes=1):
    def patch(tensor):
        tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = code, bits, lanes
    return patch


def on_device(device_type, device_id):
    def patch(tensor):
        tensor.device.device_type, tensor.device.device_id = device_type, device_id
    return patch


def test_dlpack_host_contiguous():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = wrap(Producer(array), "x")
    assert (view.ptr, view.shape, view.strides) == (array.ctypes.data, (3, 4), (4, 1))
    assert (view.element, view.device, view.package) == (E.f32, None, "dlpack")
    assert isinstance(view.obj, tuple) and type(view.obj[1]).__name__ == "PyCapsule"
    host = as_numpy(view)
    assert np.shares_memory(host, array) and np.array_equal(host, array)


@pytest.mark.parametrize("index", [np.s_[:, 1::2], np.s_[::-1, ::-2], np.s_[1:, 2:]])
def test_dlpack_host_noncontiguous(index):
    base = np.arange(48, dtype=np.int64).reshape(6, 8)
    part = base[index]
    view = wrap(Producer(part), "x")
    assert view.ptr == part.ctypes.data  # data + byte_offset
    assert view.strides == tuple(s // 8 for s in part.strides) and view.element is E.i64
    host = as_numpy(view)
    assert np.array_equal(host, part) and np.shares_memory(host, base)
    host[0, 0] = -1
    assert part[0, 0] == -1


def test_dlpack_keeps_the_producer_alive_until_the_view_dies():
    array = np.arange(4, dtype=np.float32)
    alive = weakref.ref(array)
    view = wrap(Producer(array), "x")
    del array
    gc.collect()
    assert alive() is not None
    host = as_numpy(view)
    del view
    gc.collect()
    assert alive() is not None  # the NumPy view keeps the TensorView, which keeps the capsule
    del host
    gc.collect()
    assert alive() is None


def test_dlpack_versioned_capsule_and_readonly_flag():
    array = np.arange(6, dtype=np.float16)
    array.flags.writeable = False
    view = wrap(Producer(array, max_version=(1, 0)), "x")
    assert (view.element, view.readonly, view.ptr) == (E.f16, True, array.ctypes.data)


def test_dlpack_bf16_and_fp8_codes():
    bits = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0 as bfloat16
    view = wrap(Producer(bits, retype(4, 16)), "q")
    assert view.element is E.bf16 and view.itemsize == 2
    assert wrap(Producer(np.zeros(2, np.uint8), retype(10, 8)), "q").element is E.fp8_e4m3
    assert wrap(Producer(np.zeros(2, np.uint8), retype(12, 8)), "q").element is E.fp8_e5m2
    ml_dtypes = pytest.importorskip("ml_dtypes")
    host = as_numpy(view)
    assert host.dtype == np.dtype(ml_dtypes.bfloat16)
    assert host.astype(np.float32).tolist() == [1.0, -2.0]


def test_dlpack_unsupported_dtypes():
    error = raises(DTypeMismatch, "q", wrap, Producer(np.zeros(3, np.complex64)), "q")
    assert "complex64" in str(error)
    raises(DTypeMismatch, "q", wrap, Producer(np.zeros(3, np.float32), retype(2, 32, 4)), "q")
    raises(DTypeMismatch, "q", wrap, Producer(np.zeros(3, np.uint8), retype(7, 8)), "q")


def test_dlpack_devices():
    cuda = wrap(Producer(np.zeros(3, np.float32), on_device(2, 1)), "k")
    assert cuda.device == 1
    raises(InvalidArgument, "k", as_numpy, cuda, name="k")
    assert wrap(Producer(np.zeros(3, np.float32), on_device(13, 0)), "k").device == 0
    assert wrap(Producer(np.zeros(3, np.float32), on_device(3, 0)), "k").device is None
    error = raises(DeviceMismatch, "k", wrap, Producer(np.zeros(3), on_device(10, 0)), "k")
    assert "device type 10" in str(error)


def test_dlpack_failures():
    class Refuses:
        def __dlpack__(self):
            raise BufferError("cannot export")

    class NotACapsule:
        def __dlpack__(self):
            return "capsule?"

    raises(InvalidArgument, "v", wrap, Refuses(), "v")
    raises(InvalidArgument, "v", wrap, NotACapsule(), "v")


# ----------------------------------------------------------------------------- torch (CPU)


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = wrap(tensor.t(), "x")
    assert (view.ptr, view.shape, view.strides) == (tensor.data_ptr(), (6, 4), (1, 6))
    assert (view.element, view.device, view.package) == (E.f32, None, "torch")
    assert view.obj is not None and not view.is_contiguous
    assert np.array_equal(as_numpy(view), tensor.t().numpy())
    for dtype, element in [(torch.bfloat16, E.bf16), (torch.float8_e4m3fn, E.fp8_e4m3),
                           (torch.float8_e5m2, E.fp8_e5m2), (torch.int64, E.i64),
                           (torch.uint8, E.u8), (torch.float16, E.f16)]:
        assert wrap(torch.zeros(2, dtype=dtype), "x").element is element


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation:UserWarning")
def test_torch_rejections():
    torch = pytest.importorskip("torch")
    error = raises(DTypeMismatch, "q", wrap, torch.zeros(2, dtype=torch.complex64), "q")
    assert "complex64" in str(error)
    raises(LayoutMismatch, "q", wrap, torch.zeros(2, 2).to_sparse(), "q")
    raises(DeviceMismatch, "q", wrap, torch.zeros(2, device="meta"), "q")
    quantized = torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.quint8)
    raises(DTypeMismatch, "q", wrap, quantized, "q")


def test_torch_func_wrappers_are_unsupported_and_named():
    """vmap's batched tensors (and grad's wrappers, where an op is reached without its
    autograd.Function) have no storage to read: Unsupported, naming the transform."""
    torch = pytest.importorskip("torch")
    raised = []

    def attempt(t):
        with pytest.raises(Unsupported) as error:
            wrap(t, "q")
        raised.append(str(error.value))
        return t

    torch.func.vmap(attempt)(torch.randn(4, 3))
    torch.func.grad(lambda t: attempt(t).sum())(torch.randn(3))
    assert "q is a wrapper of torch.func's Vmap transform" in raised[0]
    assert "Grad transform" in raised[1] and "grad and vjp" in raised[1]


def test_torch_cpu_outputs_stay_torch():
    torch = pytest.importorskip("torch")
    out = memory.allocate_like((2, 3), E.bf16, None, "torch", 0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (2, 3)
    assert resolve_stream(None, "torch", None) == 0  # host: no CUDA stream asked for


# ----------------------------------------------------------------------------- view geometry


def test_contiguity_ignores_size_one_dims():
    assert view_of((1, 4), (99, 1)).is_contiguous
    assert view_of((3, 1, 4), (4, 7, 1)).is_contiguous
    assert not view_of((3, 4), (8, 1)).is_contiguous
    assert view_of((0, 4), (123, 9)).is_contiguous
    assert view_of((), ()).is_contiguous and view_of((), ()).size == 1


def test_byte_span_and_overlap():
    base = np.zeros((4, 8), dtype=np.float32)
    top, bottom = wrap(base[:2], "top"), wrap(base[2:], "bottom")
    assert top.byte_span() == (base.ctypes.data, base.ctypes.data + 64)
    assert not top.overlaps(bottom) and not bottom.overlaps(top)
    middle = wrap(base[1:3], "middle")
    assert middle.overlaps(top) and middle.overlaps(bottom)
    empty = wrap(base[:0], "empty")
    assert not empty.overlaps(top) and not top.overlaps(empty)
    # Interleaved columns share no element but their spans cross: reported (conservatively).
    assert wrap(base[:, 0], "a").overlaps(wrap(base[:, 1], "b"))
    assert top.same_layout(wrap(base[:2], "again")) and not top.same_layout(middle)


def test_expect_passes_and_shape_message():
    view = view_of((2, 4), (4, 1))
    expect(view, "x", shape=(2, 4), element=E.f32, device=0)
    expect(view, "x", shape=(2, 4), element=(E.f16, E.f32), device="any_gpu")
    expect(view, "x", shape=(2, 4), element=E.f32)  # device left to another check
    error = raises(ShapeMismatch, "slopes", expect, view_of((3,), (1,)), "slopes", shape=(4,),
                   element=E.f32, device=0)
    assert str(error) == "slopes must have shape (4,), got (3,)"


def test_expect_element():
    view = view_of((2,), (1,))
    error = raises(DTypeMismatch, "q", expect, view, "q", shape=(2,), element=E.f16, device=0)
    assert str(error) == "q must have element type f16, got f32"
    error = raises(DTypeMismatch, "q", expect, view, "q", shape=(2,), element=(E.f16, E.bf16),
                   device=0)
    assert "one of f16, bf16" in str(error)


def test_expect_device_messages():
    host = view_of((2,), (1,), device=None)
    error = raises(DeviceMismatch, "input", expect, host, "input", shape=(2,), element=E.f32,
                   device=0)
    assert str(error) == "input is in host memory; this plan runs on cuda:0"
    other = view_of((2,), (1,), device=1)
    error = raises(DeviceMismatch, "output", expect, other, "output", shape=(2,), element=E.f32,
                   device=0, like="input")
    assert str(error) == "output is on cuda:1; expected cuda:0 like input"
    raises(DeviceMismatch, "output", expect, other, "output", shape=(2,), element=E.f32,
           device=None)
    raises(DeviceMismatch, "input", expect, host, "input", shape=(2,), element=E.f32,
           device="any_gpu")
    expect(host, "input", shape=(2,), element=E.f32, device=None)


def test_expect_last_dim_stride():
    strided = view_of((2, 4), (8, 2))
    error = raises(LayoutMismatch, "input", expect, strided, "input", shape=(2, 4),
                   element=E.f32, device=0)
    assert "(8, 2)" in str(error)
    expect(strided, "input", shape=(2, 4), element=E.f32, device=0, contiguous_last_dim=False)
    expect(view_of((2, 1), (1, 5)), "input", shape=(2, 1), element=E.f32, device=0)


def test_expect_aligned():
    expect_aligned(view_of((4,), (1,), ptr=0x1000), "q", 16)
    error = raises(LayoutMismatch, "q", expect_aligned, view_of((4,), (1,), ptr=0x1004), "q", 16)
    assert "0x1004" in str(error) and "16-byte" in str(error)


def test_expect_no_overlaps_checks_every_output_against_every_other_argument():
    base = np.zeros(32, dtype=np.float32)
    x, w = wrap(base[:8], "x"), wrap(base[8:16], "w")
    out, aux = wrap(base[16:24], "out"), wrap(base[24:], "aux")
    expect_no_overlaps({"x": x, "w": w, "bias": None, "out": out, "aux": aux}, ("out", "aux"))
    error = raises(LayoutMismatch, "out", expect_no_overlaps,
                   {"x": x, "w": wrap(base[12:20], "w"), "out": out}, ("out",))
    assert "out overlaps w" in str(error)
    error = raises(LayoutMismatch, "grad_q", expect_no_overlaps,
                   {"q": x, "grad_q": out, "grad_k": wrap(base[20:28], "grad_k")},
                   ("grad_q", "grad_k"))
    assert "grad_q overlaps grad_k" in str(error)  # the pair is named once, in output order
    empty = wrap(base[16:16], "out")
    expect_no_overlaps({"x": wrap(base[:24], "x"), "out": empty}, ("out",))


def test_expect_args_type():
    expect_args_type(types.SimpleNamespace(), types.SimpleNamespace)
    error = raises(InvalidArgument, "args", expect_args_type, {"x": 1}, types.SimpleNamespace)
    assert "args must be SimpleNamespace, got dict" in str(error)


def test_expect_no_overlap():
    base = np.zeros(16, dtype=np.float32)
    out, inp = wrap(base[4:12], "output"), wrap(base[:8], "input")
    error = raises(LayoutMismatch, "output", expect_no_overlap, out, "output", inp, "input")
    assert "input" in str(error)
    expect_no_overlap(wrap(base[8:], "output"), "output", inp, "input")
    same = wrap(base[:8], "output")
    raises(LayoutMismatch, "output", expect_no_overlap, same, "output", inp, "input")
    expect_no_overlap(same, "output", inp, "input", allow_same=True)


# ----------------------------------------------------------------------------- streams


class PtrStream:
    ptr = 1234


class TorchLikeStream:
    cuda_stream = 5678


class ProtocolStream:
    def __cuda_stream__(self):
        return 0, 91011


def test_resolve_explicit_streams():
    assert resolve_stream(0, "cupy", 0) == 0
    assert resolve_stream(42, "torch", 1) == 42
    assert resolve_stream(PtrStream(), "torch", 0) == 1234
    assert resolve_stream(TorchLikeStream(), "cupy", 0) == 5678
    assert resolve_stream(ProtocolStream(), "cupy", 0) == 91011


@pytest.mark.parametrize("bad", [-1, True, 1.5, "default", object(), [0]])
def test_resolve_bad_streams(bad):
    raises(InvalidArgument, "stream", resolve_stream, bad, "cupy", 0)


def test_resolve_bad_stream_protocol():
    class Garbage:
        def __cuda_stream__(self):
            return "handle"

    class Negative:
        cuda_stream = -3

    raises(InvalidArgument, "stream", resolve_stream, Garbage(), "cupy", 0)
    raises(InvalidArgument, "stream", resolve_stream, Negative(), "cupy", 0)


@pytest.mark.parametrize("package", ["jax", "dlpack", "cuda_array_interface", "numpy"])
def test_default_stream_without_a_current_stream_is_legacy_default(package):
    assert resolve_stream(None, package, 0) == 0


class FakeDevice:
    entered: list[int] = []

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        FakeDevice.entered.append(self.device)
        return self

    def __exit__(self, *exc):
        return False


def fake_cupy(current_stream=777, with_from_external=True):
    module = types.ModuleType("cupy")
    made = []

    class Stream:
        def __init__(self, ptr, device_id=-1):
            self.ptr, self.device_id = ptr, device_id
            made.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    if with_from_external:
        Stream.from_external = classmethod(lambda cls, obj: cls(obj.__cuda_stream__()[1]))
    allocations = []

    def alloc(nbytes):
        allocations.append((nbytes, FakeDevice.entered[-1]))
        return types.SimpleNamespace(ptr=0xABC000, size=nbytes)

    asked = []

    def get_current_stream(device_id=-1):
        asked.append(FakeDevice.entered[-1] if device_id == -1 else device_id)
        return types.SimpleNamespace(ptr=current_stream)

    module.cuda = types.SimpleNamespace(
        Device=FakeDevice, Stream=Stream, ExternalStream=Stream, alloc=alloc,
        get_current_stream=get_current_stream)
    module.made, module.allocations, module.asked = made, allocations, asked
    return module


@pytest.fixture
def cupy_module(monkeypatch):
    module = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", module)
    FakeDevice.entered = []
    cupy_stream.clear()
    yield module
    cupy_stream.clear()


def test_default_stream_from_torch_and_cupy(monkeypatch, cupy_module, caplog):
    caplog.set_level(logging.DEBUG, logger="opfacade")
    asked = []

    def current_stream(device):
        asked.append(device)
        return types.SimpleNamespace(cuda_stream=4242)

    fake_torch = types.ModuleType("torch")
    fake_torch._C = types.SimpleNamespace()  # a torch without the raw-stream shortcut
    fake_torch.cuda = types.SimpleNamespace(current_stream=current_stream)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert resolve_stream(None, "torch", 1) == 4242 and asked == [1]
    assert "torch.cuda.current_stream" in caplog.text  # the public fallback is no silent one
    fake_torch._C._cuda_getCurrentRawStream = lambda device: asked.append(device) or 4343
    assert resolve_stream(None, "torch", 3) == 4343 and asked == [1, 3]
    assert torch_stream_reader(fake_torch) is fake_torch._C._cuda_getCurrentRawStream
    # CuPy's current stream of device 2, not of whichever device is current.
    assert resolve_stream(None, "cupy", 2) == 777 and cupy_module.asked == [2]


def test_owning_package():
    torch_dev = TensorView(0, (1,), (1,), E.f32, 0, "torch", None)
    cupy_dev = TensorView(0, (1,), (1,), E.f32, 0, "cupy", None)
    jax_dev = TensorView(0, (1,), (1,), E.f32, 0, "jax", None)
    numpy_host = TensorView(0, (1,), (1,), E.f32, None, "numpy", None)
    torch_host = TensorView(0, (1,), (1,), E.f32, None, "torch", None)
    error = raises(InvalidArgument, "stream", owning_package, [torch_dev, cupy_dev], None)
    assert "torch" in str(error) and "CuPy" in str(error)
    assert owning_package([cupy_dev, torch_dev], 5) == "torch"
    assert owning_package([cupy_dev, jax_dev]) == "cupy"
    assert owning_package([numpy_host, jax_dev]) == "jax"
    assert owning_package([torch_host, cupy_dev]) == "cupy"  # device tensors decide
    assert owning_package([numpy_host]) == "numpy"
    assert owning_package([]) == "cupy"


def test_cupy_stream_is_cached_per_handle_and_device(cupy_module):
    first = cupy_stream(1234, 0)
    assert first.ptr == 1234 and cupy_stream(1234, 0) is first
    assert cupy_stream(1234, 1) is not first
    assert FakeDevice.entered == [0, 1]


def test_cupy_stream_falls_back_to_external_stream(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="opfacade")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(with_from_external=False))
    cupy_stream.clear()
    try:
        stream = cupy_stream(55, 3)
        assert (stream.ptr, stream.device_id) == (55, 3)
        assert "cupy.cuda.ExternalStream" in caplog.text
    finally:
        cupy_stream.clear()


def test_stream_objects_are_made_once_and_bounded():
    made = []
    streams = StreamObjects(lambda handle, device: made.append((handle, device)) or object(),
                            capacity=2)
    first = streams(1, 0)
    assert streams(1, 0) is first and streams(1, 1) is not first and made == [(1, 0), (1, 1)]
    streams(2, 0)  # full: the oldest, (1, 0), goes
    assert len(streams) == 2 and streams(1, 0) is not first and made[-1] == (1, 0)
    streams.clear()
    assert len(streams) == 0


# ----------------------------------------------------------------------------- devices


class FakeRuntime:
    """CUDA's runtime as Devices reads it, with ``count`` GPUs and ``current`` current."""

    def __init__(self, count, current=0):
        self.count, self.current, self.asked = count, current, []

    def getDeviceCount(self):
        self.asked.append("count")
        if self.count is None:
            raise RuntimeError("cudaErrorNoDevice")
        return self.count

    def getDevice(self):
        self.asked.append("current")
        return self.current

    def setDevice(self, device):
        self.asked.append(("set", device))
        self.current = device

    def getDeviceProperties(self, device):
        self.asked.append(("properties", device))
        return {"major": 9, "minor": 0, "name": b"Fake H100"}


def test_one_gpu_is_device_zero_without_asking():
    runtime = FakeRuntime(1)
    devices = Devices(runtime)
    assert devices.current() == 0 and devices.count() == 1 and devices.current_reader()() == 0
    assert runtime.asked == ["count"]  # the count once, the current device never


def test_several_gpus_ask_the_runtime_each_time():
    runtime = FakeRuntime(2, current=1)
    devices = Devices(runtime)
    read = devices.current_reader()
    assert read() == 1 and devices.current() == 1
    runtime.current = 0
    assert read() == 0
    assert runtime.asked == ["count", "current", "current", "current"]
    assert Devices(FakeRuntime(None)).count() == 0  # no driver, no GPU: 0, never raises


def test_device_properties_are_read_once_until_cleared():
    runtime = FakeRuntime(1)
    devices = Devices(runtime)
    assert devices.arch(0) is ArchSku.sm90 and devices.name(0) == "Fake H100"
    assert devices.arch(0) is ArchSku.sm90 and devices.name(0) == "Fake H100"
    assert runtime.asked.count(("properties", 0)) == 2  # one read for each, then remembered
    devices.clear()
    devices.arch(0)
    assert runtime.asked.count(("properties", 0)) == 3


def test_the_module_functions_read_the_process_devices(monkeypatch):
    runtime = FakeRuntime(2, current=1)
    monkeypatch.setattr(device, "DEVICES", Devices(runtime))
    assert device.device_count() == 2 and device.current_device() == 1
    assert device.device_arch(1) is ArchSku.sm90 and device.device_name(1) == "Fake H100"
    with device.on_device(0):
        assert device.current_device() == 0
    assert runtime.current == 1 and ("set", 0) in runtime.asked
    with device.on_device(1):  # already current: nothing set
        pass
    assert runtime.asked.count(("set", 1)) == 1
    assert device.check_ordinal(1) == 1
    raises(InvalidArgument, "device", device.check_ordinal, 2)


def test_cupys_runtime_where_libcuda_does_not_open(monkeypatch):
    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(device, "driver_runtime", lambda: None)  # tests/test_driver.py: with it
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 1)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 1 / 0)
    devices = Devices()
    assert devices.runtime() is cupy.cuda.runtime
    assert devices.count() == 1 and devices.current() == 0
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 3)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 2)
    devices.clear()
    assert devices.count() == 3 and devices.current() == 2


# ----------------------------------------------------------------------------- memory


def test_allocate_bytes_edges():
    assert memory.allocate_bytes(0, 0, "cupy", 0) == (0, None)
    raises(InvalidArgument, "nbytes", memory.allocate_bytes, -1, 0, "cupy", 0)


def test_allocate_bytes_from_cupy_on_the_run_stream(cupy_module):
    ptr, owner = memory.allocate_bytes(4096, 1, "jax", 999)
    assert ptr == 0xABC000 and owner.size == 4096
    assert cupy_module.allocations == [(4096, 1)]
    assert [stream.ptr for stream in cupy_module.made] == [999]


def test_allocate_like():
    out = memory.allocate_like((2, 3), E.f16, None, "numpy", 0)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16 and out.shape == (2, 3)
    assert memory.allocate_like((2,), E.tf32, None, "numpy", 0).dtype == np.float32
    error = raises(Unsupported, "bf16", memory.allocate_like, (2,), E.bf16, 0, "cupy", 0)
    assert error.__class__ is Unsupported
    raises(Unsupported, "fp8_e4m3", memory.allocate_like, (2,), E.fp8_e4m3, 0, "jax", 0)


def test_allocate_like_zeroed():
    # An output whose kernel leaves some bytes as it found them (a ReLU bit-mask) asks for zeros.
    torch = pytest.importorskip("torch")
    for package in ("numpy", "torch"):
        out = memory.allocate_like((3, 5), E.u8, None, package, 0, zeroed=True)
        assert out.shape == (3, 5) and not out.any()
    like = torch.full((2, 4), 3.0)
    facts = operands.facts(like, "like")
    zeroed = operands.allocate(like, facts, (4, 2), E.f32, None, (1, 4), zeroed=True)
    assert zeroed.stride() == (1, 4) and not zeroed.any()


# ----------------------------------------------------------------------------- import hygiene


def test_importing_the_edge_imports_no_framework():
    code = (
        "import sys\n"
        "import opfacade, opfacade._internal.memory, opfacade.testing, opfacade.cli\n"
        "print(sorted(m for m in ('torch', 'jax', 'jaxlib', 'cupy') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(root), os.environ.get("PYTHONPATH")]))})
    assert result.stdout.strip() == "[]"


def test_host_buffer_is_plain_ctypes_memory():
    # A view over memory opfacade did not get from NumPy (ctypes) round-trips through as_numpy.
    buffer = (ctypes.c_int32 * 6)(*range(6))
    view = TensorView(ctypes.addressof(buffer), (2, 3), (3, 1), E.i32, None, "dlpack",
                      (buffer, None))
    assert as_numpy(view).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_torch_empty_takes_every_shape_form():
    # Tuples go to torch.empty as separate extents (faster to parse); an int (scratch bytes), a
    # torch.Size, the empty shape and strides take torch's other forms.
    torch = pytest.importorskip("torch")
    for shape in ((3, 5), (7,), 11, torch.Size((2, 4)), ()):
        out = memory.torch_empty(torch, shape, torch.float32, torch.device("cpu"))
        assert tuple(out.shape) == ((shape,) if isinstance(shape, int) else tuple(shape))
        assert out.dtype == torch.float32
        zeroed = memory.torch_empty(torch, shape, torch.float32, torch.device("cpu"),
                                    zeroed=True)
        assert zeroed.shape == out.shape and not zeroed.any()
    strided = memory.torch_empty(torch, (4, 2), torch.float16, torch.device("cpu"), (1, 4))
    assert strided.stride() == (1, 4)
    zeroed = memory.torch_empty(torch, (4, 2), torch.float16, torch.device("cpu"), (1, 4),
                                zeroed=True)
    assert zeroed.stride() == (1, 4) and not zeroed.any()

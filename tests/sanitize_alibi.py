"""Drives every ALiBi kernel once (vector and element paths, tails, in place, each optional
output) for compute-sanitizer: `compute-sanitizer --tool memcheck python3 tests/sanitize_alibi.py`.
Not a pytest file: the sanitizer wraps the whole process."""

import cupy

from opfacade import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    Plan,
)
from opfacade._internal.tensors import TensorView
from opfacade.types import ElementKind


def as_view(array, element):
    """CuPy has no bfloat16: describe the raw 16-bit buffer with the element type instead."""
    strides = tuple(s // array.itemsize for s in array.strides)
    return TensorView(array.data.ptr, array.shape, strides, ElementKind(element), 0, "cupy",
                      array)


STORAGE = {"f64": cupy.float64, "f32": cupy.float32, "f16": cupy.float16, "bf16": cupy.uint16}

for element, storage in STORAGE.items():
    slope_type = cupy.float64 if element == "f64" else cupy.float32
    for shape in ((2, 3, 17, 45), (1, 2, 64, 128)):
        b, h, q, k = shape
        a = as_view(cupy.random.uniform(-1, 1, shape).astype(storage), element)
        s = cupy.random.uniform(0, 1, h).astype(slope_type)
        for in_place in (False, True):
            desc = AlibiForwardDescriptor(batch=b, heads=h, query_len=q, key_len=k,
                                          element=element, in_place=in_place)
            out = None if in_place else as_view(cupy.empty(shape, storage), element)
            Plan.select(desc, device=0).run(AlibiForwardArgs(a, s, out))
        for d_in, d_s in ((True, True), (True, False), (False, True)):
            desc = AlibiBackwardDescriptor(batch=b, heads=h, query_len=q, key_len=k,
                                           element=element, need_input_grad=d_in,
                                           need_slope_grad=d_s)
            d_input = as_view(cupy.empty(shape, storage), element) if d_in else None
            d_slopes = cupy.empty(h, slope_type) if d_s else None
            Plan.select(desc, device=0).run(AlibiBackwardArgs(a, d_input, d_slopes))
cupy.cuda.runtime.deviceSynchronize()
print("sanitize_alibi: all kernels ran")

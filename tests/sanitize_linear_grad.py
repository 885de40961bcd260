"""Drives the linear backward's activation kernel (native/linear_grad.cu) once per element type,
activation, load path (16-byte packs and element by element), column tail and with and without
the bias gradient, and the forward's separate activation pass (native/linear_act.cu) from an aux
and in place, on buffers sized exactly, for compute-sanitizer:
`compute-sanitizer --tool memcheck python3 tests/sanitize_linear_grad.py`.
Not a pytest file: the sanitizer wraps the whole process."""

import cupy

from opfacade._backends.nvrtc.linear_act import ActivationPass
from opfacade._backends.nvrtc.linear_grad import ActivationGrad, partials_bytes
from opfacade.contracts.linear import ACTIVATIONS
from opfacade.types import ElementKind

GRADS = [spec for spec in ACTIVATIONS.values() if spec.d_pre is not None]
PASSES = [spec for spec in ACTIVATIONS.values() if spec.act_pass is not None]


def exact(rows: int, ld: int, n: int, itemsize: int):
    """A buffer ending right after the last row's n-th element: any overrun is caught."""
    return cupy.random.randint(0, 255, ((rows - 1) * ld + n) * itemsize, dtype=cupy.uint8)


for element in (ElementKind.bf16, ElementKind.f16, ElementKind.f32):
    item = element.itemsize
    for rows, n, pad in ((37, 72, 0), (300, 1000, 8), (64, 76, 4), (129, 13, 3)):
        ld = n + pad
        for spec in GRADS:
            saved = spec.aux  # the mask in its own 16-byte rows; the pre-activation in ld's
            ld_aux = saved.row_stride(n) if saved.mask else ld
            for bias_grad in (True, False):
                grad = exact(rows, ld, n, item)
                aux = exact(rows, ld_aux, saved.columns(n), 1 if saved.mask else item)
                d_pre = exact(rows, ld, n, item)
                partials = cupy.empty(partials_bytes(rows, n, element), cupy.uint8)
                grad_bias = cupy.empty(n * item, cupy.uint8)
                kernel = ActivationGrad(spec, element, 0, rows, n, ld, ld_aux, ld, 16,
                                        "d_pre", bias_grad)
                kernel.bind({"grad_out": grad.data.ptr, "aux": aux.data.ptr,
                             "d_pre": d_pre.data.ptr, "partials": partials.data.ptr,
                             "grad_bias": grad_bias.data.ptr}, 0)()
        for spec in PASSES:  # two batch entries of rows // 2, gapped by pad rows
            m = rows // 2
            batch_stride = (m + pad) * ld
            pre = exact(2 * m + pad, ld, n, item)  # ends at the last row's n-th element
            out = exact(2 * m + pad, ld, n, item)
            for source in (pre, out):  # from the aux, then in place
                ActivationPass(spec, element, 0, 2, m, n, (ld, batch_stride),
                               (ld, batch_stride), 16).bind(source.data.ptr, out.data.ptr, 0)()
cupy.cuda.runtime.deviceSynchronize()
print("sanitize_linear_grad: all kernels ran")

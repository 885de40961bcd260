"""Drives the linear backward's activation kernel (native/linear_grad.cu) once per element type,
activation, load path (16-byte packs and element by element), column tail and with and without
the bias gradient, and the forward's separate activation pass (native/linear_act.cu) from an aux
and in place, on buffers sized exactly, for compute-sanitizer:
`compute-sanitizer --tool memcheck python3 tests/sanitize_linear_grad.py`.
Not a pytest file: the sanitizer wraps the whole process."""

import cupy

from opfacade._backends.cublaslt.epilogues import relu_mask_bytes
from opfacade._backends.nvrtc.linear_act import ACTIVATIONS as PASS_ACTIVATIONS
from opfacade._backends.nvrtc.linear_act import ActivationPass
from opfacade._backends.nvrtc.linear_grad import ACTIVATIONS, ActivationGrad, partials_bytes
from opfacade.types import ElementKind


def exact(rows: int, ld: int, n: int, itemsize: int):
    """A buffer ending right after the last row's n-th element: any overrun is caught."""
    return cupy.random.randint(0, 255, ((rows - 1) * ld + n) * itemsize, dtype=cupy.uint8)


for element in (ElementKind.bf16, ElementKind.f16, ElementKind.f32):
    item = element.itemsize
    for rows, n, pad in ((37, 72, 0), (300, 1000, 8), (64, 76, 4), (129, 13, 3)):
        ld = n + pad
        for activation in ACTIVATIONS:
            ld_aux = relu_mask_bytes(n) if activation == "relu" else ld
            for bias_grad in (True, False):
                grad = exact(rows, ld, n, item)
                aux = (exact(rows, ld_aux, relu_mask_bytes(n), 1) if activation == "relu"
                       else exact(rows, ld_aux, n, item))
                d_pre = exact(rows, ld, n, item)
                partials = cupy.empty(partials_bytes(rows, n, element), cupy.uint8)
                grad_bias = cupy.empty(n * item, cupy.uint8)
                kernel = ActivationGrad(activation, element, 0, rows, n, ld, ld_aux, ld, 16,
                                        "d_pre", bias_grad)
                kernel.launch({"grad_out": grad.data.ptr, "aux": aux.data.ptr,
                               "d_pre": d_pre.data.ptr, "partials": partials.data.ptr,
                               "grad_bias": grad_bias.data.ptr}, 0)
        for activation in PASS_ACTIVATIONS:  # two batch entries of rows // 2, gapped by pad rows
            m = rows // 2
            batch_stride = (m + pad) * ld
            pre = exact(2 * m + pad, ld, n, item)  # ends at the last row's n-th element
            out = exact(2 * m + pad, ld, n, item)
            for source in (pre, out):  # from the aux, then in place
                ActivationPass(activation, element, 0, 2, m, n, (ld, batch_stride),
                               (ld, batch_stride), 16).bind(source.data.ptr, out.data.ptr, 0)()
cupy.cuda.runtime.deviceSynchronize()
print("sanitize_linear_grad: all kernels ran")

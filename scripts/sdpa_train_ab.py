"""sdpa's common-case training op against the general one, and the eager route's Function
without its second traced check against the one with it, interleaved in one process (issue 14
§3, §5; the bench's host problem, B1 H1 S64 d64 bf16).

- Through the dispatcher, as a graph compiled for training calls its forward (stats saved):
  ``opfacade::sdpa_train`` (6 arguments) against ``opfacade::sdpa`` (11), with torch's
  F.sdpa and the aten forward torch's own training graph calls as yardsticks.
- Eager with grad: the drop-in's call, and the Functions it may apply: each op's
  ``function`` (whose forward asks again whether the call is traced) and the twin that
  ``DefinedOp`` applies on its eager route (whose forward does not); ``DefinedOp.__call__``
  against ``with_grad`` (the drop-ins' entry, without __call__'s checks of the tensors); the
  same for linear (64x64x64 bf16, GELU).
- The backwards: the torch ops' guarded path (``ops.*.torch_backward``) against the functional
  full path, and a whole eager forward and backward (torch.autograd.grad) against torch's.

Host microseconds per call: the median of interleaved batches of 200 calls, each begun on an idle
GPU, rounds rotating the order (``opfacade._bench.common.host_us_interleaved``), so a host's
drift during the run reaches every case alike.

    python3 scripts/sdpa_train_ab.py [out.json]
"""

from __future__ import annotations

import importlib
import json
import sys

import torch

from opfacade._bench.common import host_us_interleaved
from opfacade._bench.host import torch_training_forward
from opfacade.torch._define import _c_apply


def cases() -> dict:
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    linear = importlib.import_module("opfacade.torch.linear")
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    xg, wg, bg = (torch.randn(*shape, **bf16, requires_grad=True)
                  for shape in ((64, 64), (64, 64), (64,)))
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    general, train = torch.ops.opfacade.sdpa.default, torch.ops.opfacade.sdpa_train.default
    general_fn, train_fn = _c_apply(sdpa._sdpa.function), _c_apply(sdpa._sdpa_train.function)
    general_twin, train_twin = sdpa._sdpa._apply, sdpa._sdpa_train._apply
    found = {
        "torch F.sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
        "sdpa op dispatched (11 args)": lambda: general(q, k, v, None, False, None, 0.0, None,
                                                        None, True, False),
        "sdpa_train op dispatched (6 args)": lambda: train(q, k, v, False, None, False),
        "sdpa_inference op dispatched": lambda: torch.ops.opfacade.sdpa_inference.default(
            q, k, v, False, None),
        "torch F.sdpa with grad": lambda: torch.nn.functional.scaled_dot_product_attention(
            qg, kg, vg),
        "oft.sdpa with grad": lambda: sdpa.sdpa(qg, kg, vg),
        "sdpa Function, traced check": lambda: general_fn(qg, kg, vg, None, False, None, 0.0,
                                                          None, None, True, False),
        "sdpa Function, eager twin": lambda: general_twin(qg, kg, vg, None, False, None, 0.0,
                                                          None, None, True, False),
        "sdpa_train Function, traced check": lambda: train_fn(qg, kg, vg, False, None, False),
        "sdpa_train Function, eager twin": lambda: train_twin(qg, kg, vg, False, None, False),
        "sdpa_train DefinedOp call": lambda: sdpa._sdpa_train(qg, kg, vg, False, None, False),
        "sdpa_train with_grad": lambda: sdpa._sdpa_train.with_grad(qg, kg, vg, False, None,
                                                                    False),
        "torch F.gelu(F.linear) with grad": lambda: torch.nn.functional.gelu(
            torch.nn.functional.linear(xg, wg, bg), approximate="tanh"),
        "oft.linear with grad": lambda: linear.linear(xg, wg, bg, activation="gelu_tanh"),
        "linear DefinedOp call": lambda: linear._linear(xg, wg, bg, "gelu_tanh", True, False),
        "linear with_grad": lambda: linear._linear.with_grad(xg, wg, bg, "gelu_tanh", True,
                                                              False),
    }
    # The backwards: the ops' kernels' guarded path (torch_backward) against the functional
    # full path, and a whole eager forward and backward against torch's.
    fsdpa, flinear = importlib.import_module("opfacade.ops.sdpa"), importlib.import_module(
        "opfacade.ops.linear")
    out, stats = train(q, k, v, False, None, False)
    g, gx = torch.randn_like(out), torch.randn(64, 64, **bf16)
    x, w, b = (t.detach() for t in (xg, wg, bg))
    lin_out, aux = torch.ops.opfacade.linear.default(x, w, b, "gelu_tanh", True, False)
    refuse_sdpa, refuse_linear = (sdpa._ON_GPU["sdpa_train_backward"],
                                  linear._ON_GPU["linear_backward"])
    grad = torch.autograd.grad
    F = torch.nn.functional
    found |= {
        "sdpa backward, full path": lambda: fsdpa.sdpa_backward(q, k, v, out, g, stats),
        "sdpa backward, guarded": lambda: fsdpa.torch_backward(q, k, v, out, g, stats, None,
                                                                None, False, refuse_sdpa),
        "linear backward, full path": lambda: flinear.linear_backward(
            gx, x, w, aux, activation="gelu_tanh"),
        "linear backward, guarded": lambda: flinear.torch_backward(
            gx, x, w, aux, "gelu_tanh", True, True, True, False, refuse_linear),
        "torch F.sdpa forward and backward": lambda: grad(
            F.scaled_dot_product_attention(qg, kg, vg), (qg, kg, vg), g),
        "oft.sdpa forward and backward": lambda: grad(sdpa.sdpa(qg, kg, vg), (qg, kg, vg), g),
        "torch F.gelu(F.linear) forward and backward": lambda: grad(
            F.gelu(F.linear(xg, wg, bg), approximate="tanh"), (xg, wg, bg), gx),
        "oft.linear forward and backward": lambda: grad(
            linear.linear(xg, wg, bg, activation="gelu_tanh"), (xg, wg, bg), gx),
    }
    name, training = torch_training_forward(q, k, v)
    if training is not None:
        found[f"torch training forward ({name})"] = training
    return found


def main(argv: list[str]) -> int:
    fns = cases()
    us = host_us_interleaved(fns, calls=200, rounds=15)
    for name, value in us.items():
        print(f"{value:7.2f} us  {name}", flush=True)
    if argv:
        with open(argv[0], "w") as out:
            json.dump({"device": torch.cuda.get_device_name(), "how": __doc__.split("\n\n")[2],
                       "host_us": {n: round(u, 2) for n, u in us.items()}}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

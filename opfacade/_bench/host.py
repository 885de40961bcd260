"""Host time per call on tiny problems (issue 14 §3), rows with op ``host``: what a framework
pays in Python and dispatch around the GPU work, opfacade's functional forms, plan.run and the
torch ops against torch's equivalent call in the same process ("torch"). Each figure is the
median of interleaved batches (common.host_us_interleaved); ``ours_ms`` and ``peers_ms`` hold
host milliseconds per call, so the ratio peer / ours above 1 means opfacade costs less."""

from __future__ import annotations

from .common import BenchRow, host_us_interleaved
from .python_floor import cudnn_sdpa_in_python_function, sdpa_training_backend

CALLS, ROUNDS = 200, 9

# The forward torch's training graph calls, by the backend F.scaled_dot_product_attention picks
# for inputs that require grad (torch.nn.attention.SDPBackend's values): each computes the
# logsumexp its backward reads, as our training op saves the softmax stats. (The arguments
# after q, k, v: attn_bias and compute_log_sumexp where the op has them.)
_TRAINING_FORWARDS = {
    1: ("_scaled_dot_product_flash_attention", ()),
    2: ("_scaled_dot_product_efficient_attention", (None, True)),
    3: ("_scaled_dot_product_cudnn_attention", (None, True)),
}


def torch_training_forward(q, k, v):
    """(name, call): the aten op a graph torch compiled for training calls for F.sdpa(q, k, v)
    (torch's choice for these tensors with requires_grad), with its logsumexp; (None, None)
    where torch would choose the math backend, which has no such op."""
    import torch

    choice = sdpa_training_backend(q, k, v)
    if choice not in _TRAINING_FORWARDS:
        return None, None
    name, extra = _TRAINING_FORWARDS[choice]
    op = getattr(torch.ops.aten, name).default
    return f"aten.{name}", lambda: op(q, k, v, *extra)


# The floor's contestant (python_floor.py), named in the eager sdpa training rows.
FLOOR = "torch kernels in a Python Function"
FLOOR_NOTE = (f"{FLOOR}: torch's own cuDNN forward and backward ops inside a Python "
              "autograd.Function, what any op with a Python autograd formula pays before its "
              "own code")


def _row(case: str, us: dict[str, float], ours: str, peers: dict[str, str], notes: str
         ) -> BenchRow:
    return BenchRow(op="host", case=case, ours_ms=us[ours] / 1e3,
                    figure=f"{us[ours]:.1f} us host per call",
                    peers_ms={peer: us[name] / 1e3 for peer, name in peers.items()}, notes=notes)


def run(quick: bool = False) -> list[BenchRow]:
    import torch
    import torch.nn.functional as F

    import opfacade
    import opfacade.torch as oft

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, w, b = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16), torch.randn(64, **bf16)
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    lin_plan = opfacade.LinearForwardPlan.cached(opfacade.LinearDescriptor(
        m=64, n=64, k=64, element="bf16", activation="gelu_tanh"))
    lin_args = opfacade.LinearArgs(x, w, b, out=torch.empty(64, 64, **bf16))
    lin_ws = torch.empty(max(lin_plan.workspace_size, 256), device="cuda", dtype=torch.uint8)
    att_plan = opfacade.SdpaForwardPlan.cached(opfacade.SdpaDescriptor(
        batch=1, heads_q=1, heads_kv=1, seq_q=64, seq_kv=64, head_dim=64, element="bf16"))
    att_args = opfacade.SdpaArgs(q, k, v, torch.empty(1, 1, 64, 64, **bf16))
    att_ws = torch.empty(max(att_plan.workspace_size, 256), device="cuda", dtype=torch.uint8)
    linear_op, sdpa_train = torch.ops.opfacade.linear.default, torch.ops.opfacade.sdpa_train.default
    linear_inference = torch.ops.opfacade.linear_inference.default
    sdpa_inference = torch.ops.opfacade.sdpa_inference.default
    training_forward, torch_training = torch_training_forward(q, k, v)
    # Eager training calls: inputs that require grad, so each call also records its autograd
    # node (and saves what the backward reads); the outputs are dropped, freeing the node.
    # Copies, not views of the rows' tensors, so each row has addresses of its own, as separate
    # tensors of a program would. (Views shared the no-grad rows' addresses: until run()'s memo
    # kept such calls apart, each batch restarted the other row's count towards the CUDA-graph
    # capture, and every call of both launched directly: scripts/host_rows_launch_probe.py.)
    xg, wg, bg, qg, kg, vg = (t.clone().requires_grad_() for t in (x, w, b, q, k, v))
    # A whole eager training call: forward, then torch.autograd.grad (the backward op too).
    grad_linear, grad_sdpa = torch.randn(64, 64, **bf16), torch.randn(1, 1, 64, 64, **bf16)
    grad = torch.autograd.grad
    extra = {} if torch_training is None else {"torch sdpa training forward": torch_training}
    training_peer = {"torch training forward": "torch sdpa training forward"} if extra else {}
    training_note = (f"torch training forward: {training_forward}, the op torch's graph "
                     f"compiled for training calls, its logsumexp saved" if extra else
                     "no torch training forward: torch picks its math backend here")
    # The eager sdpa training rows' floor: torch's own cuDNN ops in a Python autograd.Function.
    floor = cudnn_sdpa_in_python_function(q, k, v)
    floors = {} if floor is None else {
        "floor sdpa grad": lambda: floor(qg, kg, vg),
        "floor sdpa fwd+bwd": lambda: grad(floor(qg, kg, vg), (qg, kg, vg), grad_sdpa)}
    us = host_us_interleaved({**extra, **floors,
        "torch linear": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "linear functional": lambda: opfacade.linear(x, w, b, activation="gelu_tanh"),
        "linear torch op": lambda: oft.linear(x, w, b, activation="gelu_tanh"),
        "linear run": lambda: lin_plan.run(lin_args),
        "linear run ws": lambda: lin_plan.run(lin_args, workspace=lin_ws),
        "torch sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "sdpa functional": lambda: opfacade.sdpa(q, k, v),
        "sdpa torch op": lambda: oft.sdpa(q, k, v),
        # Through torch's dispatcher, as compiled graphs call them: the inference ops in a
        # graph compiled under no_grad, the training ops' forwards in one compiled with grad.
        "linear inference dispatched": lambda: linear_inference(x, w, b, "gelu_tanh", False),
        "sdpa inference dispatched": lambda: sdpa_inference(q, k, v, False, None),
        # The training ops as a graph compiled for training calls their forwards: saving what
        # the backward reads (the activation's aux, the softmax stats), as the drop-ins ask.
        "linear dispatched": lambda: linear_op(x, w, b, "gelu_tanh", True, False),
        "sdpa dispatched": lambda: sdpa_train(q, k, v, False, None, False),
        "torch linear grad": lambda: F.gelu(F.linear(xg, wg, bg), approximate="tanh"),
        "linear torch op grad": lambda: oft.linear(xg, wg, bg, activation="gelu_tanh"),
        "torch sdpa grad": lambda: F.scaled_dot_product_attention(qg, kg, vg),
        "sdpa torch op grad": lambda: oft.sdpa(qg, kg, vg),
        "torch linear fwd+bwd": lambda: grad(F.gelu(F.linear(xg, wg, bg), approximate="tanh"),
                                             (xg, wg, bg), grad_linear),
        "linear torch op fwd+bwd": lambda: grad(oft.linear(xg, wg, bg, activation="gelu_tanh"),
                                                (xg, wg, bg), grad_linear),
        "torch sdpa fwd+bwd": lambda: grad(F.scaled_dot_product_attention(qg, kg, vg),
                                           (qg, kg, vg), grad_sdpa),
        "sdpa torch op fwd+bwd": lambda: grad(oft.sdpa(qg, kg, vg), (qg, kg, vg), grad_sdpa),
        "sdpa run": lambda: att_plan.run(att_args),
        "sdpa run ws": lambda: att_plan.run(att_args, workspace=att_ws),
    }, calls=CALLS // 4 if quick else CALLS, rounds=3 if quick else ROUNDS)
    linear = "linear 64x64x64 bf16 gelu_tanh"
    attention = "sdpa B1 H1 S64 d64 bf16"
    peer = "torch F.gelu(F.linear(...), approximate='tanh')"
    return [
        _row(f"{linear}, functional", us, "linear functional", {"torch": "torch linear"}, peer),
        _row(f"{linear}, torch op", us, "linear torch op", {"torch": "torch linear"}, peer),
        _row(f"{attention}, functional", us, "sdpa functional", {"torch": "torch sdpa"},
             "torch F.scaled_dot_product_attention"),
        _row(f"{attention}, torch op", us, "sdpa torch op", {"torch": "torch sdpa"},
             "torch F.scaled_dot_product_attention"),
        _row(f"{linear}, torch.ops.opfacade.linear_inference", us, "linear inference dispatched",
             {"torch": "torch linear"}, f"through torch's dispatcher, as a graph compiled for "
             f"inference calls it; {peer}"),
        _row(f"{attention}, torch.ops.opfacade.sdpa_inference", us, "sdpa inference dispatched",
             {"torch": "torch sdpa"}, "through torch's dispatcher, as a graph compiled for "
             "inference calls it; torch F.scaled_dot_product_attention"),
        _row(f"{linear}, torch.ops.opfacade.linear", us, "linear dispatched",
             {"torch": "torch linear"}, f"the training op through torch's dispatcher, as a "
             f"graph compiled for training calls its forward (the GELU aux saved); {peer}"),
        _row(f"{attention}, torch.ops.opfacade.sdpa_train", us, "sdpa dispatched",
             {"torch": "torch sdpa", **training_peer}, "the common case's training op through "
             "torch's dispatcher, as a graph compiled for training calls its forward (the "
             "softmax stats saved); torch: F.scaled_dot_product_attention; "
             f"{training_note}"),
        # Eager training calls, each drop-in against torch's call on the same inputs.
        *(_row(f"{case}, oft.{name} {what}", us, f"{name} torch op {key}",
               {"torch": f"torch {name} {key}",
                **({FLOOR: f"floor {name} {key}"} if f"floor {name} {key}" in us else {})},
               f"eager training: {how}; {peer_call} on the same inputs"
               + (f"; {FLOOR_NOTE}" if f"floor {name} {key}" in us else ""))
          for what, key, how in (
              ("with grad", "grad", "inputs that require grad, each call recording its "
                                    "autograd node"),
              ("forward and backward", "fwd+bwd", "the forward, then torch.autograd.grad "
                                                  "through its backward op"))
          for case, name, peer_call in (
              (linear, "linear", peer),
              (attention, "sdpa", "torch F.scaled_dot_product_attention"))),
        _row(f"{linear}, run() without a workspace", us, "linear run",
             {"run() with one": "linear run ws"},
             f"+{us['linear run'] - us['linear run ws']:.1f} us over run() with a workspace "
             f"({lin_plan.workspace_size} bytes); target <= 3 us"),
        _row(f"{attention}, run() without a workspace", us, "sdpa run",
             {"run() with one": "sdpa run ws"},
             f"+{us['sdpa run'] - us['sdpa run ws']:.1f} us over run() with a workspace "
             f"({att_plan.workspace_size} bytes); target <= 3 us"),
    ]

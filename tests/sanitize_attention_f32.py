"""Drives the true-f32 attention kernels (native/flash_f32.cu) and the varlen offsets check
(native/varlen_checks.cu) for compute-sanitizer: dense and packed, masks, GQA, odd lengths, and
packed runs on garbage offsets, which must stay inside the tensors.
`compute-sanitizer --tool memcheck python3 tests/sanitize_attention_f32.py`. Not a pytest file:
the sanitizer wraps the whole process."""

import cupy
import numpy as np

from opfacade import (
    Plan,
    PlanPreference,
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from opfacade.errors import InvalidArgument

F32 = PlanPreference(backends={"nvrtc"})


def uniform(*shape):
    return cupy.random.uniform(-1, 1, shape).astype(cupy.float32)


# Dense: odd lengths (tails of the 64-row tiles), GQA, each mask.
for causal, window in ((None, None), ("top_left", None), ("bottom_right", None), (None, (9, 3))):
    shape = dict(batch=2, heads_q=4, heads_kv=2, seq_q=37, seq_kv=70, head_dim=64,
                 element="f32", causal=causal, window=window)
    q, k, v, d_out = uniform(2, 4, 37, 64), uniform(2, 2, 70, 64), uniform(2, 2, 70, 64), \
        uniform(2, 4, 37, 64)
    out, stats = cupy.empty_like(q), cupy.empty((2, 4, 37, 1), cupy.float32)
    grads = [cupy.empty_like(t) for t in (q, k, v)]
    Plan.select(SdpaDescriptor(**shape, save_stats=True), F32, device=0).run(
        SdpaArgs(q, k, v, out, stats))
    Plan.select(SdpaBackwardDescriptor(**shape), F32, device=0).run(
        SdpaBackwardArgs(q, k, v, out, d_out, stats, *grads))

# Packed: valid offsets with empty and single-token sequences, then garbage ones.
fields = dict(batch=4, heads_q=4, heads_kv=1, head_dim=128, max_seqlen_q=70, max_seqlen_kv=90,
              element="f32", causal="bottom_right")
forward = Plan.select(VarlenAttentionDescriptor(**fields, save_lse=True), F32, device=0)
backward = Plan.select(VarlenAttentionBackwardDescriptor(**fields), F32, device=0)
tq, tk = 140, 180
q, k, v, d_out = uniform(tq, 4, 128), uniform(tk, 1, 128), uniform(tk, 1, 128), \
    uniform(tq, 4, 128)
out, lse = cupy.empty_like(q), cupy.empty((4, tq), cupy.float32)
grads = [cupy.empty_like(t) for t in (q, k, v)]
rng = np.random.default_rng(0)
for cu_q, cu_kv in (([0, 70, 70, 71, 140], [0, 90, 91, 91, 180]),
                    (rng.integers(-2**31, 2**31 - 1, 5), rng.integers(-2**31, 2**31 - 1, 5)),
                    ([0, 10**6, 3, 2**31 - 1, -5], [0, 0, 0, 0, 2**30])):
    offsets_q = cupy.asarray(np.asarray(cu_q, np.int64).astype(np.int32))
    offsets_kv = cupy.asarray(np.asarray(cu_kv, np.int64).astype(np.int32))
    forward.run(VarlenAttentionArgs(q, k, v, offsets_q, offsets_kv, out, lse))
    backward.run(VarlenAttentionBackwardArgs(q, k, v, out, d_out, lse, offsets_q, offsets_kv,
                                             *grads))

# Checked mode on garbage: the device check runs, the attention does not.
checked = Plan.select(VarlenAttentionDescriptor(**fields, checked=True), F32, device=0)
try:
    checked.run(VarlenAttentionArgs(q, k, v, cupy.asarray(np.array([0, 9, 3, 4, 5], np.int32)),
                                    offsets_kv, out))
except InvalidArgument as error:
    assert error.argument == "cu_seqlens_q", error
else:
    raise SystemExit("checked mode let decreasing offsets through")
cupy.cuda.runtime.deviceSynchronize()
print("sanitize_attention_f32: all kernels ran")

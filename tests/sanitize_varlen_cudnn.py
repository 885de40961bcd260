"""Drives the cuDNN ragged varlen SKUs and the kernels around them (native/varlen_ragged.cu) for
compute-sanitizer: bf16 and f16, both backwards, empty, single-token and query-heavy sequences
under a bottom-right mask, tensors holding exactly the packed tokens (so a read past the last
sequence is outside the allocation), then garbage offsets, which must stay inside the tensors.
`compute-sanitizer --tool memcheck --report-api-errors no python3 tests/sanitize_varlen_cudnn.py`
(torch's driver probing makes API errors that are not ours). Not a pytest file: the sanitizer
wraps the whole process."""

import numpy as np
import torch

from opfacade import (
    Plan,
    PlanPreference,
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)

rng = np.random.default_rng(0)
for element, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
    fields = dict(batch=4, heads_q=4, heads_kv=1, head_dim=64, max_seqlen_q=70,
                  max_seqlen_kv=90, element=element, causal="bottom_right")
    cudnn = PlanPreference(backends={"cudnn"})
    forward = Plan.select(VarlenAttentionDescriptor(**fields, save_lse=True), cudnn, device=0)
    backwards = [Plan.select(VarlenAttentionBackwardDescriptor(**fields),
                             PlanPreference(backends={"cudnn"}, deterministic=d), device=0)
                 for d in (False, True)]
    tq, tk = 141, 101  # exactly the tokens the valid offsets pack

    def uniform(*shape, dtype=dtype):
        return (torch.rand(shape, device="cuda") * 2 - 1).to(dtype)

    q, k, v, d_out = uniform(tq, 4, 64), uniform(tk, 1, 64), uniform(tk, 1, 64), \
        uniform(tq, 4, 64)
    out, lse = uniform(tq, 4, 64), torch.empty((4, tq), device="cuda")
    grads = [uniform(*t.shape) for t in (q, k, v)]
    for cu_q, cu_kv in (([0, 70, 70, 71, 141], [0, 90, 91, 91, 101]),  # 70 queries over 10 keys
                        (rng.integers(-2**31, 2**31 - 1, 5), rng.integers(-2**31, 2**31 - 1, 5)),
                        ([0, 10**6, 3, 2**31 - 1, -5], [0, 0, 0, 0, 2**30])):
        offsets_q = torch.tensor(np.asarray(cu_q, np.int64).astype(np.int32), device="cuda")
        offsets_kv = torch.tensor(np.asarray(cu_kv, np.int64).astype(np.int32), device="cuda")
        forward.run(VarlenAttentionArgs(q, k, v, offsets_q, offsets_kv, out, lse))
        for backward in backwards:
            backward.run(VarlenAttentionBackwardArgs(q, k, v, out, d_out, lse, offsets_q,
                                                     offsets_kv, *grads))
        torch.cuda.synchronize()
print("sanitize_varlen_cudnn: done")

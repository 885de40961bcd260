"""How accurate torch's f32 scaled_dot_product_attention is on this GPU, per backend, against
float64 (the bench's dense f32 peer): `python3 scripts/torch_f32_sdpa_probe.py`."""

import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
q, k, v = (torch.rand(2, 16, 1024, 128, device="cuda") * 2 - 1 for _ in range(3))
reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
errors = {}
for name, backend in (("default", None), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                      ("math", SDPBackend.MATH), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    try:
        if backend is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v)
        errors[name] = float((out.double() - reference).norm() / reference.norm())
    except RuntimeError as error:
        errors[name] = str(error).splitlines()[0][:100]
print(json.dumps(errors, indent=1))

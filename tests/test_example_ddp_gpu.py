"""examples/gpt_ddp.py on two GPUs (skipped with fewer): DDP over NCCL gives the single-GPU
gradients of the global batch, two deterministic runs are bitwise equal on every rank, and a plan
refuses another GPU's tensors with DeviceMismatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_ddp_on_two_gpus(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    script = Path(__file__).parent.parent / "examples" / "gpt_ddp.py"
    out = tmp_path / "ddp.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           "2", str(script), "--steps", "4", "--small", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(out.read_text())
    assert len(reports) == 2
    for report in reports:
        assert report["bitwise_losses"] and report["bitwise_weights"]
        assert report["device_mismatch_typed"]
        assert report["grad_vs_single_gpu_worst"] < 2e-2  # bf16: shard-wise sums in new orders

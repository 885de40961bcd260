"""examples/gpt.py under torch.distributed: DDP over NCCL, one process per GPU, each rank on its
shard of the same global batch. It checks what issue 14 asks of the multi-GPU run:

- the first step's gradients (all-reduced) equal the single-GPU gradients of the global batch,
  within tolerance;
- with deterministic SKUs, two runs give bitwise-equal losses and weights;
- plans and caches are per device: a plan selected on this rank's GPU, run with a tensor on
  another rank's, raises DeviceMismatch.

    python3 -m torch.distributed.run --nproc-per-node 2 examples/gpt_ddp.py --steps 50

Rank 0 prints a JSON report (and writes it to --json), with each run's global tokens/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def _gpt():
    spec = importlib.util.spec_from_file_location("example_gpt", Path(__file__).with_name(
        "gpt.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpt = _gpt()


def shard(tensor: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    rows = tensor.shape[0] // world
    return tensor[rank * rows:(rank + 1) * rows]


def train(config, steps: int, rank: int, world: int, seed: int = 0, warmup: int = 3):
    """DDP training on this rank's shard of each global batch: (losses, weights, global
    tokens/s after ``warmup`` steps)."""
    device = torch.device("cuda", rank)
    with gpt.deterministic_torch(True):
        model = gpt.make_model(config, "opfacade", True, seed, device=device)
        ddp = DistributedDataParallel(model, device_ids=[rank])
        optimizer = gpt.make_optimizer(ddp.parameters())
        losses, start = [], None
        for index, (tokens, targets) in enumerate(gpt.batches(config, steps, seed + 1,
                                                              device=device)):
            if index == warmup:
                torch.cuda.synchronize(device)
                start = time.perf_counter()
            loss = gpt.step(ddp, optimizer, shard(tokens, rank, world),
                            shard(targets, rank, world))
            losses.append(loss.detach())
        # Each rank's mean loss, averaged over the ranks once at the end (a read per step would
        # synchronize every step).
        local = torch.stack(losses)
        dist.all_reduce(local)
        torch.cuda.synchronize(device)
        timed = steps - warmup
        rate = (timed * config.batch * config.seq / (time.perf_counter() - start)
                if start is not None and timed > 0 else float("nan"))
        return ([float(v) / world for v in local.cpu()],
                {name: p.detach().clone() for name, p in model.named_parameters()}, rate)


def first_step_gradients(config, rank: int, world: int, seed: int = 0) -> dict[str, float]:
    """The all-reduced first-step gradients against one GPU's on the whole global batch."""
    device = torch.device("cuda", rank)
    with gpt.deterministic_torch(True):
        model = gpt.make_model(config, "opfacade", True, seed, device=device)
        single = gpt.make_model(config, "opfacade", True, seed, device=device)
        single.load_state_dict(model.state_dict())
        ddp = DistributedDataParallel(model, device_ids=[rank])
        tokens, targets = next(gpt.batches(config, 1, seed + 1, device=device))
        gpt.loss_of(ddp, shard(tokens, rank, world), shard(targets, rank, world)).backward()
        gpt.loss_of(single, tokens, targets).backward()
        return {name: float((p.grad.double() - q.grad.double()).norm()
                            / q.grad.double().norm())
                for (name, p), q in zip(model.named_parameters(), single.parameters(),
                                        strict=True)}


def device_mismatch_is_typed(rank: int, world: int) -> bool:
    """A plan selected for this rank's GPU refuses tensors on the next rank's GPU."""
    from opfacade import LinearArgs, LinearDescriptor, LinearForwardPlan
    from opfacade.errors import DeviceMismatch

    plan = LinearForwardPlan.select(LinearDescriptor(m=16, n=16, k=16, element="bf16",
                                                     bias=False),
                                    device=rank)
    other = torch.device("cuda", (rank + 1) % world)
    x, w = (torch.randn(16, 16, device=other, dtype=torch.bfloat16) for _ in range(2))
    try:
        plan.run(LinearArgs(x, w, None, out=torch.empty_like(x)))
    except DeviceMismatch:
        return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--small", action="store_true", help="the GPU test's size")
    parser.add_argument("--json")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    config = gpt.Config()
    if args.small:
        config = replace(config, layers=2, width=128, heads=4, heads_kv=2, seq=128, vocab=512,
                         batch=2 * world)
    if config.batch % world:
        raise SystemExit(f"the global batch {config.batch} must split over {world} ranks")
    errors = first_step_gradients(config, rank, world)
    first = train(config, args.steps, rank, world)
    second = train(config, args.steps, rank, world)
    report = {
        "rank": rank, "world": world, "config": asdict(config), "steps": args.steps,
        "device": torch.cuda.get_device_name(rank),
        "grad_vs_single_gpu_worst": max(errors.values()),
        "bitwise_losses": first[0] == second[0],
        "bitwise_weights": all(torch.equal(first[1][n], second[1][n]) for n in first[1]),
        "losses": {"first": first[0][0], "last": first[0][-1]},
        "tokens_per_s": {"first": first[2], "second": second[2]},
        "device_mismatch_typed": device_mismatch_is_typed(rank, world),
    }
    reports = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        print(json.dumps(reports, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(reports, indent=2))
    dist.destroy_process_group()
    ok = all(r["bitwise_losses"] and r["bitwise_weights"] and r["device_mismatch_typed"]
             for r in reports)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    raise SystemExit(main())

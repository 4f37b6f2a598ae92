#!/usr/bin/env python3
"""The collectives torch.optim.Muon issues on FSDP2's Shard(0) DTensor parameters, per matrix kind.

Runs one optimizer step per matrix shape (tall, wide, square) on a W-rank fake process group (one
process, no data moved) and prints each collective with its local input shape and dtype. This is
what planner/projection.cpp's row_sharded baseline counts. Needs PyTorch (scripts/torch_venv.sh):
    .venv-torch/bin/python scripts/muon_dtensor_collectives.py [--world 8] [--ns-steps 2]
"""
import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

LOG = []


def log_calls(name):
    f = getattr(funcol, name)

    def wrapped(t, *a, **k):
        LOG.append((name, tuple(t.shape), str(t.dtype).replace("torch.", "")))
        return f(t, *a, **k)

    setattr(funcol, name, wrapped)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--ns-steps", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.world)
    mesh = init_device_mesh("cpu", (args.world,))
    for name in dir(funcol):
        if name.startswith(("all_gather", "all_reduce", "reduce_scatter", "all_to_all")) and callable(getattr(funcol, name)):
            log_calls(name)
    W = args.world
    for kind, shape in [("tall", (12 * W, 4 * W)), ("wide", (4 * W, 16 * W)), ("square", (4 * W, 4 * W))]:
        p = torch.nn.Parameter(distribute_tensor(torch.randn(*shape), mesh, [Shard(0)]))
        p.grad = distribute_tensor(torch.randn(*shape), mesh, [Shard(0)])
        opt = torch.optim.Muon([p], lr=0.02, ns_steps=args.ns_steps, adjust_lr_fn="match_rms_adamw")
        LOG.clear()
        opt.step()
        print(f"{kind} {list(shape)} Shard(0) over {W} ranks, NS {args.ns_steps} (torch {torch.__version__}):")
        for op, local, dtype in LOG:
            print(f"  {op:20s} local input {list(local)} {dtype}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

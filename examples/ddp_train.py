#!/usr/bin/env python3
"""DDP + neuraldbg-track: each rank watches its own activations, rank 0 writes (CPU, gloo, seconds).

From step ``--bad-from`` the last rank's inputs are scaled x1000 (one rank's data going bad): that
rank's activations turn ANOMALOUS, and rank 0's journal records it with ``metadata["rank"]``.
Gradients are clipped, so the shared weights stay finite and the other ranks stay NORMAL.

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neuraldbg_track import NeuralDbg


def main(steps: int = 30, bad_from: int = 15) -> None:
    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    # The same line on every rank: under a process group NeuralDbg relays the events to rank 0.
    with NeuralDbg(model, optimizer) as dbg:
        for step in range(steps):
            x = torch.randn(64, 16, generator=data)
            y = x[:, :4].argmax(dim=1)
            if rank == world - 1 and step >= bad_from:
                x = x * 1000.0
            loss = nn.functional.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    if rank == 0:
        print(f"\nrank 0 recorded {len(dbg.events)} events; journal: {dbg.journal_path}")
        for e in dbg.events:
            rank = e.metadata["rank"]
            print(f"  step {e.step:3d}  rank {rank}  layer {e.layer_name:4}  {e.from_state} -> {e.to_state}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bad-from", type=int, default=15)
    options = parser.parse_args()
    main(options.steps, options.bad_from)

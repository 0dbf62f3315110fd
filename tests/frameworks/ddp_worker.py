"""One rank of the DDP test: a small MLP under DistributedDataParallel (gloo, CPU), watched by NeuralDbg.

Rank ``bad_rank``'s inputs are scaled x1e4 from step ``bad_from``: its activations turn ANOMALOUS while
the other rank's stay normal. The learning rate is 0, so the weights (and the healthy rank's
activations) never change: whatever the journal says about ANOMALOUS activations comes from the bad rank.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from neuraldbg_track import ConfigError, NeuralDbg
from neuraldbg_track.distributed import EventRelay


def train(rank: int, root: Path, run_id: str, steps: int, bad_rank: int, bad_from: int, relay=None) -> NeuralDbg:
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.0)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    with NeuralDbg(model, optimizer, journal=root, run_id=run_id, console=False, distributed=relay) as dbg:
        for step in range(steps):
            x = torch.randn(64, 8, generator=data)
            if rank == bad_rank and step >= bad_from:
                x = x * 1e4
            loss = ddp(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return dbg


def train_fsdp(rank: int, root: Path, steps: int, bad_rank: int, bad_from: int) -> dict:
    """FSDP2 (``fully_shard``): sharded gradients are refused; activations are watched on every rank."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    try:
        NeuralDbg(model, journal=False, console=False)
        refused = ""
    except ConfigError as exc:
        refused = str(exc)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    data = torch.Generator().manual_seed(1000 + rank)
    with NeuralDbg(model, optimizer, gradients=False, journal=root, run_id="fsdp", console=False) as dbg:
        for step in range(steps):
            x = torch.randn(64, 8, generator=data)
            if rank == bad_rank and step >= bad_from:
                x = x * 1e4
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    return {"refused": refused, "steps": dbg.step_count}


def run(rank: int, world_size: int, init_file: str, root: str, steps: int, bad_rank: int, bad_from: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        report = {}
        for run_id, relay in (("every1", None), ("every4", EventRelay(every=4))):
            dbg = train(rank, Path(root), run_id, steps, bad_rank, bad_from, relay)
            report[run_id] = {"events": [e.to_dict() for e in dbg.events], "steps": dbg.step_count,
                              "exchanges": dbg._relay.exchanges, "received": dbg._relay.received}
        report["fsdp"] = train_fsdp(rank, Path(root), steps, bad_rank, bad_from)
        Path(root, f"rank{rank}.json").write_text(json.dumps(report))  # written only when the rank finished
    finally:
        dist.destroy_process_group()

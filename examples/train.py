#!/usr/bin/env python3
"""Demo: a deep sigmoid MLP whose early layers' gradients vanish, watched by neuraldbg-track.

Runs on CPU in a few seconds with the embedded default (JSONL journal + console): events are
printed as they happen, then a summary says which layers failed, how, when, and where the journal is.

    python3 run.py demo                 # from the repository root (sets itself up)
    python examples/train.py --steps 300 --depth 12
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from neuraldbg_track import NeuralDbg


class DeepSigmoidNet(nn.Module):
    """``depth`` blocks of Linear + Sigmoid: the classic vanishing-gradient network."""

    def __init__(self, inputs: int = 16, width: int = 64, depth: int = 12, classes: int = 4) -> None:
        super().__init__()
        sizes = [inputs] + [width] * depth
        self.blocks = nn.ModuleList(
            nn.Sequential() for _ in range(depth))
        for i, block in enumerate(self.blocks):
            block.add_module("fc", nn.Linear(sizes[i], sizes[i + 1]))
            block.add_module("act", nn.Sigmoid())
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> NeuralDbg:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--journal-dir", default=None, help="journal root (default: ./neuraldbg)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    model = DeepSigmoidNet(depth=args.depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.randn(2048, 16)
    labels = data[:, :4].argmax(dim=1)

    journal = args.journal_dir if args.journal_dir else True
    with NeuralDbg(model, optimizer, journal=journal) as dbg:
        for step in range(args.steps):
            idx = torch.randint(0, len(data), (64,))
            loss = nn.functional.cross_entropy(model(data[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    failing = sorted({(e.layer_name, e.to_state) for e in dbg.events if e.is_failure})
    print(f"\n{len(dbg.events)} events in {dbg.step_count} steps; final loss {loss.item():.3f}")
    for layer, state in failing:
        first = next(e for e in dbg.events if e.layer_name == layer and e.to_state == state)
        print(f"  {layer:<14} {state:<10} from step {first.metadata['onset_step']} "
              f"(confirmed at {first.step}, confidence {first.confidence:.2f})")
    print(f"journal: {dbg.journal_path}")
    return dbg


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Demo: a deep sigmoid MLP whose early layers' gradients vanish, watched by neuraldbg-track.

A Hydra app: runs on CPU in a few seconds with the embedded default (JSONL journal + console);
events are printed as they happen, then a summary says which layers failed, how, when, where the
journal is, and why: the post-mortem's ranked causal hypotheses.

    python3 run.py demo                                  # from the repository root (sets itself up)
    python examples/train.py steps=100 depth=16
    python examples/train.py neuraldbg.sink=tensorboard  # or mlflow, wandb; neuraldbg=strict; ...
"""
from __future__ import annotations

import hydra
import torch
from omegaconf import DictConfig
from torch import nn

from neuraldbg_track import NeuralDbg
from neuraldbg_track.postmortem import format_hypotheses


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


def run(cfg: DictConfig) -> NeuralDbg:
    torch.manual_seed(cfg.seed)
    model = DeepSigmoidNet(depth=cfg.depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    data = torch.randn(2048, 16)
    labels = data[:, :4].argmax(dim=1)

    with NeuralDbg.from_config(cfg.neuraldbg, model, optimizer) as dbg:
        for step in range(cfg.steps):
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
    if dbg.journal_path is not None:
        print(f"journal: {dbg.journal_path}")
    print("why (post-mortem, most likely first):")
    print(format_hypotheses(dbg.explain(), limit=3))
    return dbg


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()

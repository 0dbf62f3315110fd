#!/usr/bin/env python3
"""Per-step overhead of neuraldbg-track against the same loop without it, in one process.

Variants run interleaved in rounds (each round: a block of steps per variant, order rotated), so
machine noise hits all of them alike; the figure is the median step time over all measured steps,
reported as a ratio to the plain loop. Journal and console are off: this measures the extractor.

    .venv/bin/python benchmarks/bench_overhead.py            # 20-layer MLP, width 256, batch 64
    .venv/bin/python benchmarks/bench_overhead.py --rounds 40 --block 25
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack

import torch
from torch import nn

from neuraldbg_track import NeuralDbg


def mlp20(width: int = 256) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(20):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Variant:
    def __init__(self, name: str, make_model, batch: int, width: int, stack: ExitStack, **dbg_kw) -> None:
        torch.manual_seed(0)
        self.name, self.model = name, make_model(width)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.x, self.y = torch.randn(batch, width), torch.randn(batch, width)
        self.times: list[float] = []
        self.dbg = stack.enter_context(NeuralDbg(self.model, self.opt, console=False, journal=False, **dbg_kw)) \
            if dbg_kw.get("enabled", True) and name != "plain" else None

    def run(self, steps: int, record: bool) -> None:
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = nn.functional.mse_loss(self.model(self.x), self.y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            if record:
                self.times.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    with ExitStack() as stack:
        variants = [Variant("plain", mlp20, args.batch, args.width, stack),
                    Variant("neuraldbg every step", mlp20, args.batch, args.width, stack, every_n_steps=1),
                    Variant("neuraldbg every 10 steps", mlp20, args.batch, args.width, stack, every_n_steps=10)]
        for v in variants:
            v.run(args.warmup, record=False)
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for v in order:
                v.run(args.block, record=True)
    base = statistics.median(variants[0].times)
    print(f"20-layer MLP (width {args.width}, batch {args.batch}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads), {args.rounds}x{args.block} steps per variant")
    print(f"{'variant':<28}{'median ms':>10}{'ratio':>8}")
    for v in variants:
        med = statistics.median(v.times)
        print(f"{v.name:<28}{med * 1e3:>10.3f}{med / base:>8.3f}")


if __name__ == "__main__":
    main()

"""Two real training runs whose failures differ by a known number of steps.

A sigmoid MLP (Linear layers "0", "2", "4", "6", "8"; Sigmoid layers "1", "3", "5", "7") trains
healthily until the bias of Linear "6" is set to -30: the Sigmoid "7" after it saturates and the
gradients of every layer before it vanish, from that step on. Run "early" cuts before training
(onset 0) and runs 80 steps; run "late" cuts after step 39 (onset 40) and runs 120 steps.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from neuraldbg_track import NeuralDbg
from tests.helpers import mlp, regression_data, train

WIDTHS = [16, 32, 32, 32, 32, 1]
LAYERS = [str(i) for i in range(9)]
VANISHING = ["0", "2", "4", "6"]
SHIFT = 40
RUNS = {"early": (0, 80), "late": (SHIFT, 120)}  # name: (step of the cut, steps)


def saturating_run(journal_root: Path, name: str, sinks=()) -> NeuralDbg:
    cut_at, steps = RUNS[name]
    torch.manual_seed(0)
    model = mlp(WIDTHS, act=nn.Sigmoid)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def cut(i: int) -> None:  # after optimizer step i: the next observed step is i + 1
        if i + 1 == cut_at:
            with torch.no_grad():
                model[6].bias.fill_(-30.0)

    cut(-1)
    with NeuralDbg(model, opt, sinks=list(sinks), console=False, journal=journal_root, run_id=name) as dbg:
        train(model, opt, *regression_data(), steps=steps, on_step=cut)
    return dbg

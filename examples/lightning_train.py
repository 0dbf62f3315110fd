#!/usr/bin/env python3
"""Lightning + neuraldbg-track: one callback watches ``Trainer.fit`` (CPU, a few seconds).

A deep sigmoid MLP whose early layers' gradients vanish. Events are printed as they happen, written
to ./neuraldbg/<run_id>/events.jsonl and into the TensorBoard logger's own run.

    pip install "neuraldbg-track[lightning,tensorboard]"
    python examples/lightning_train.py --steps 40
    tensorboard --logdir lightning_logs      # the neuraldbg/* tags sit beside train_loss
"""
from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from neuraldbg_track.integrations.lightning import NeuralDbgCallback


class DeepSigmoid(pl.LightningModule):
    """``depth`` Linear + Sigmoid layers: the classic vanishing-gradient network."""

    def __init__(self, depth: int = 12, width: int = 64, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(16 if i == 0 else width, width), nn.Sigmoid()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def main(steps: int = 40, root_dir: str = ".") -> NeuralDbgCallback:
    torch.manual_seed(0)
    x = torch.randn(2048, 16)
    y = x[:, :4].argmax(dim=1)
    callback = NeuralDbgCallback()  # NeuralDbg's options go here: thresholds=..., sinks=[...], ...
    trainer = pl.Trainer(max_steps=steps, callbacks=[callback], logger=TensorBoardLogger(root_dir),
                         accelerator="cpu", devices=1, default_root_dir=root_dir, log_every_n_steps=1,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(DeepSigmoid(), DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    dbg = callback.dbg
    failing = list(dict.fromkeys(e.layer_name for e in dbg.events if e.is_failure))  # in order of failure
    steps = trainer.global_step
    print(f"\n{len(dbg.events)} events in {steps} steps; failing layers: {', '.join(failing) or 'none'}")
    print(f"journal: {dbg.journal_path}\ntensorboard: {trainer.logger.log_dir}")
    return callback


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    main(parser.parse_args().steps)

"""Lightning: a real Trainer.fit, gradients read once per optimizer step, events in the loggers' runs."""
from __future__ import annotations

import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger
from lightning.pytorch.plugins.precision import MixedPrecision

from neuraldbg_track import ConfigError, read_journal
from neuraldbg_track.sinks import read_run_info
from neuraldbg_track.integrations.lightning import NeuralDbgCallback
from tests.helpers import regression_data
from tests.integrations.trackers import vanishing_sigmoid_mlp

from .expected import VANISHING, tensorboard_events, vanishing


class VanishingModule(pl.LightningModule):
    """Trains the vanishing MLP. Validation feeds ``val_probe`` (unused in training) an all-negative
    input, so its ReLU would be DEAD if validation forwards were judged."""

    def __init__(self, inf_loss_at: int | None = None) -> None:
        super().__init__()
        self.net = vanishing_sigmoid_mlp()
        self.val_probe = nn.ReLU()
        self.inf_loss_at = inf_loss_at

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, index):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss * float("inf") if index == self.inf_loss_at else loss

    def validation_step(self, batch, index):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y) + self.val_probe(x - 100.0).sum())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RankFailureModule(pl.LightningModule):
    """Under DDP, rank 1's inputs are scaled x1e4 from step 6 (learning rate 0: rank 0 stays normal)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, index):
        x, y = batch
        if self.global_rank == 1 and self.global_step >= 6:
            x = x * 1e4
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(tmp_path, callback, max_steps, module=None, **trainer_args):
    torch.manual_seed(0)
    x, y = regression_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=64)  # 8 batches per epoch
    args = dict(max_steps=max_steps, callbacks=[callback], accelerator="cpu", devices=1,
                default_root_dir=tmp_path, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, limit_val_batches=2, val_check_interval=4, log_every_n_steps=1)
    trainer = pl.Trainer(**{**args, **trainer_args})
    trainer.fit(module or VanishingModule(), loader, DataLoader(TensorDataset(x, y), batch_size=64))
    return trainer, callback.dbg


def test_fit_reports_events_into_the_tensorboard_and_mlflow_loggers_runs(tmp_path, mlflow_uri):
    tb = TensorBoardLogger(tmp_path, name="tb")
    mlf = MLFlowLogger(experiment_name="lightning", tracking_uri=mlflow_uri)
    trainer, dbg = _fit(tmp_path, NeuralDbgCallback(console=False), 8, logger=[tb, mlf])
    assert vanishing(dbg.events) == VANISHING  # at the optimizer step (global_step) they were confirmed
    assert ("net.23", "SATURATED") in {(e.layer_name, e.to_state) for e in dbg.events}
    assert not any(e.layer_name == "val_probe" for e in dbg.events)  # validation (and sanity check) ignored
    assert dbg.observed_steps == 8 == trainer.global_step and read_journal(dbg.journal_path) == dbg.events
    tb_events, tags = tensorboard_events(tb.log_dir)
    assert tb_events == dbg.events
    assert "train_loss" in tags  # the logger's own run directory
    from mlflow import MlflowClient
    run = MlflowClient(mlflow_uri).get_run(mlf.run_id)
    assert run.data.tags["neuraldbg.status"] == "VANISHING" and "train_loss" in run.data.metrics


def test_accumulated_bf16_fit_observes_once_per_optimizer_step(tmp_path):
    trainer, dbg = _fit(tmp_path, NeuralDbgCallback(console=False), 6, logger=False,
                        accumulate_grad_batches=2, precision="bf16-mixed")
    assert trainer.global_step == 6 and dbg.observed_steps == 6  # 12 batches, 6 optimizer steps
    assert vanishing(dbg.events) == VANISHING


def test_fp16_step_skipped_by_the_grad_scaler_is_not_observed(tmp_path):
    trainer, dbg = _fit(tmp_path, NeuralDbgCallback(console=False), 8, module=VanishingModule(inf_loss_at=4),
                        logger=False, plugins=[MixedPrecision("16-mixed", "cpu")])
    assert trainer.precision_plugin.scaler.get_scale() == 2.0 ** 15  # the scaler skipped one step
    assert dbg.observed_steps == 7 and not any(e.to_state == "NON_FINITE" for e in dbg.events)
    assert vanishing(dbg.events) == VANISHING


def test_ddp_rank1_anomaly_reaches_rank0s_journal(tmp_path):
    trainer, _ = _fit(tmp_path, NeuralDbgCallback(console=False), 12, module=RankFailureModule(), logger=False,
                      devices=2, strategy="ddp_spawn", limit_val_batches=0)
    (run_dir,) = (tmp_path / "neuraldbg").iterdir()  # only rank 0 wrote a journal
    events = read_journal(run_dir)
    anomalous = {(e.layer_name, e.step, e.metadata["rank"]) for e in events if e.to_state == "ANOMALOUS"}
    assert anomalous == {(layer, 8, 1) for layer in ("net.0", "net.1", "net.2")}
    assert all(e.metadata["rank"] == 0 for e in events if e.event_type == "gradient_health")
    assert read_run_info(run_dir)["steps"] == 12


def test_options_are_checked_when_the_callback_is_built():
    with pytest.raises(ConfigError, match="every_n_step"):
        NeuralDbgCallback(every_n_step=2)
    with pytest.raises(ConfigError, match="optimizer"):
        NeuralDbgCallback(optimizer=None)


def test_logger_reuse_maps_each_logger_to_its_sink():
    from neuraldbg_track.integrations._callbacks import lightning_logger_sinks
    from neuraldbg_track.integrations.wandb import WandbSink

    run = object()
    WandbLogger = type("WandbLogger", (), {"experiment": run})
    CSVLogger = type("CSVLogger", (), {})
    (sink,) = lightning_logger_sinks([WandbLogger(), CSVLogger()])
    assert isinstance(sink, WandbSink) and sink.run is run


@pytest.mark.parametrize("module, blocked, extra", [
    ("lightning", ["lightning.pytorch.callbacks", "pytorch_lightning.callbacks"], "neuraldbg-track[lightning]"),
    ("transformers", ["transformers"], "neuraldbg-track[transformers]"),
])
def test_a_missing_framework_names_the_extra(monkeypatch, module, blocked, extra):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail
    monkeypatch.delitem(sys.modules, f"neuraldbg_track.integrations.{module}", raising=False)
    with pytest.raises(ImportError, match=extra.replace("[", r"\[")):
        __import__(f"neuraldbg_track.integrations.{module}")

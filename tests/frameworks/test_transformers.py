"""Hugging Face: a real Trainer.train on a model built from a config (no downloads), events in the
runs of the report_to trackers."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

from neuraldbg_track import read_journal
from neuraldbg_track.integrations.transformers import NeuralDbgCallback
from tests.helpers import regression_data
from tests.integrations.trackers import vanishing_sigmoid_mlp

from .expected import VANISHING, tensorboard_events, vanishing


class DeepSigmoidConfig(PretrainedConfig):
    model_type = "neuraldbg-deep-sigmoid"


class DeepSigmoid(PreTrainedModel):
    config_class = DeepSigmoidConfig

    def __init__(self, config: DeepSigmoidConfig) -> None:
        super().__init__(config)
        self.net = vanishing_sigmoid_mlp()

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def _train(tmp_path, callback, **args):
    torch.manual_seed(0)
    x, y = regression_data()
    data = [{"x": a, "labels": b} for a, b in zip(x, y)]
    defaults = dict(output_dir=str(tmp_path / "out"), max_steps=8, per_device_train_batch_size=64,
                    learning_rate=0.1, lr_scheduler_type="constant", report_to=[], save_strategy="no",
                    use_cpu=True, disable_tqdm=True, logging_steps=1)
    trainer = Trainer(model=DeepSigmoid(DeepSigmoidConfig()), args=TrainingArguments(**{**defaults, **args}),
                      train_dataset=data, callbacks=[callback])
    trainer.train()
    return trainer, callback.dbg


def test_train_reports_events_into_the_report_to_runs(tmp_path, mlflow_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "false")
    trainer, dbg = _train(tmp_path, NeuralDbgCallback(console=False), report_to=["mlflow", "tensorboard"])
    assert vanishing(dbg.events) == VANISHING and dbg.observed_steps == 8 == trainer.state.global_step
    assert read_journal(dbg.journal_path) == dbg.events
    (log_dir,) = (tmp_path / "out" / "runs").iterdir()  # the HF TensorBoardCallback's run directory
    tb_events, tags = tensorboard_events(log_dir)
    assert tb_events == dbg.events and "train/loss" in tags
    from mlflow import MlflowClient
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("hf").experiment_id])
    assert run.data.tags["neuraldbg.status"] == "VANISHING" and "loss" in run.data.metrics  # HF's own run


@pytest.mark.parametrize("accumulation", [1, 2])
def test_one_observation_per_optimizer_step(tmp_path, accumulation):
    trainer, dbg = _train(tmp_path, NeuralDbgCallback(console=False), max_steps=6,
                          gradient_accumulation_steps=accumulation)
    assert trainer.state.global_step == 6 and dbg.observed_steps == 6
    assert vanishing(dbg.events) == VANISHING  # steps are optimizer steps, whatever the accumulation


def test_grad_scaler_overflow_is_seen_through_the_optimizer_wrapper():
    from neuraldbg_track.integrations._callbacks import scaler_skips_step

    layer = nn.Linear(2, 2)
    inner = torch.optim.SGD(layer.parameters(), lr=0.1)
    wrapper = type("AcceleratedOptimizer", (), {"optimizer": inner})()  # accelerate unscales the inner one
    for bad, expected in ((False, False), (True, True)):
        scaler = torch.amp.GradScaler("cpu")
        assert not scaler_skips_step(scaler, wrapper)  # not unscaled yet: nothing known, observe
        layer.zero_grad()
        scaler.scale(layer(torch.ones(1, 2)).sum() * (float("inf") if bad else 1.0)).backward()
        scaler.unscale_(inner)
        assert scaler_skips_step(scaler, wrapper) is expected
    assert not scaler_skips_step(None, wrapper)
    assert not scaler_skips_step(torch.amp.GradScaler("cpu", enabled=False), inner)

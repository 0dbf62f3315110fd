#!/usr/bin/env python3
"""Hugging Face Transformers + neuraldbg-track: one callback watches ``Trainer.train`` (CPU, seconds).

The model is built from a config (nothing is downloaded): a deep sigmoid MLP whose early layers'
gradients vanish. Events are printed, written to ./neuraldbg/<run_id>/events.jsonl, and into the
runs of the ``report_to`` trackers (here TensorBoard, under <output_dir>/runs).

    pip install "neuraldbg-track[transformers,tensorboard]"
    python examples/hf_train.py --steps 40
"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

from neuraldbg_track.integrations.transformers import NeuralDbgCallback


class DeepSigmoidConfig(PretrainedConfig):
    model_type = "deep-sigmoid-demo"

    def __init__(self, depth: int = 12, width: int = 64, inputs: int = 16, classes: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        self.depth, self.width, self.inputs, self.classes = depth, width, inputs, classes


class DeepSigmoidClassifier(PreTrainedModel):
    config_class = DeepSigmoidConfig

    def __init__(self, config: DeepSigmoidConfig) -> None:
        super().__init__(config)
        layers: list[nn.Module] = []
        for i in range(config.depth):
            layers += [nn.Linear(config.inputs if i == 0 else config.width, config.width), nn.Sigmoid()]
        self.net = nn.Sequential(*layers, nn.Linear(config.width, config.classes))

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def main(steps: int = 40, output_dir: str = "hf_out") -> NeuralDbgCallback:
    torch.manual_seed(0)
    x = torch.randn(2048, 16)
    data = [{"x": row, "labels": int(row[:4].argmax())} for row in x]
    callback = NeuralDbgCallback()  # NeuralDbg's options go here: thresholds=..., sinks=[...], ...
    args = TrainingArguments(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=64,
                             learning_rate=0.1, lr_scheduler_type="constant", logging_steps=10,
                             report_to=["tensorboard"], save_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=DeepSigmoidClassifier(DeepSigmoidConfig()), args=args, train_dataset=data,
                      callbacks=[callback])
    trainer.train()
    dbg = callback.dbg
    failing = list(dict.fromkeys(e.layer_name for e in dbg.events if e.is_failure))  # in order of failure
    steps = trainer.state.global_step
    print(f"\n{len(dbg.events)} events in {steps} steps; failing layers: {', '.join(failing) or 'none'}")
    print(f"journal: {dbg.journal_path}")
    return callback


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--output-dir", default="hf_out")
    options = parser.parse_args()
    main(options.steps, options.output_dir)

"""Shared set-up for the tracker tests: an offline W&B environment and TensorBoard read-back."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import mlp


@contextlib.contextmanager
def offline_wandb(root: Path):
    """W&B offline, silent, writing under ``root`` (also the working directory meanwhile)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
                           "WANDB_CONSOLE": "off", "WANDB_DISABLE_GIT": "true",
                           "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true"}.items():
            mp.setenv(key, value)
        mp.delenv("WANDB_PROJECT", raising=False)
        mp.delenv("WANDB_RUN_ID", raising=False)
        mp.chdir(root)
        try:
            yield root
        finally:
            import wandb

            wandb.teardown()  # wandb caches its settings (WANDB_DIR) per process: start clean next time


def run_dir(root: Path, run) -> Path:
    """The offline run directory of ``run`` under ``root``."""
    (found,) = (root / "wandb").glob(f"offline-run-*-{run.id}")
    return found


def vanishing_sigmoid_mlp() -> nn.Module:
    """12 sigmoid layers with a saturated last one: every Linear vanishes at once (step 2) and the
    last sigmoid saturates (13 events, gradient and activation)."""
    model = mlp([16] + [32] * 12 + [1], act=nn.Sigmoid)
    with torch.no_grad():
        model[22].bias.fill_(-30.0)
    return model


def tb_reader(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def tb_texts(acc, tag: str) -> list[tuple[int, str]]:
    from tensorboard.util import tensor_util

    return [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
            for e in acc.Tensors(f"{tag}/text_summary")]

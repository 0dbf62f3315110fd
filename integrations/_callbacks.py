"""What the Lightning and Hugging Face callbacks share: the NeuralDbg they drive, the AMP check, and the
sinks that write into the run the framework already logs to.

Nothing here imports a framework or a tracker at module import.
"""
from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from neuraldbg_track.config import ConfigError, WatchConfig
from neuraldbg_track.debugger import NeuralDbg

_NOT_OPTIONS = {"self", "model", "optimizer", "sinks", "settings"}
OPTIONS = frozenset(set(inspect.signature(NeuralDbg.__init__).parameters) - _NOT_OPTIONS
                    | set(WatchConfig.__dataclass_fields__))


def check_options(options: dict[str, Any], owner: str) -> None:
    """Fail at construction, not at the first step, on an option NeuralDbg does not take."""
    if "optimizer" in options:
        raise ConfigError(f"{owner} counts steps from the trainer; do not pass optimizer=")
    unknown = set(options) - OPTIONS
    if unknown:
        raise ConfigError(f"{owner}: unknown option(s) {sorted(unknown)}; allowed: {sorted(OPTIONS)}")


def _base_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (accelerate's AcceleratedOptimizer, Lightning's)."""
    for _ in range(4):
        if isinstance(optimizer, torch.optim.Optimizer):
            break
        optimizer = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
    return optimizer


def scaler_skips_step(scaler: Any, optimizer: Any) -> bool:
    """True when an fp16 ``GradScaler`` found inf/NaN in the (unscaled) gradients: it will skip this
    optimizer step, so the step is not observed (as NeuralDbg does with its own optimizer hooks)."""
    if scaler is None or not callable(getattr(scaler, "is_enabled", None)) or not scaler.is_enabled():
        return False
    try:  # private since torch 1.6 with the same shape ({device: tensor}); without it, observe the step
        found = scaler._found_inf_per_device(_base_optimizer(optimizer))
    except (AttributeError, AssertionError, KeyError, RuntimeError, TypeError):
        return False
    return any(bool(v.item()) for v in found.values())  # at most one small sync per device, fp16 AMP only


class Session:
    """The NeuralDbg a framework callback drives: built when training starts, stepped with the
    framework's global step (no optimizer hooks), closed when training ends."""

    def __init__(self, owner: str, sinks: Iterable[Any], options: dict[str, Any]) -> None:
        check_options(options, owner)
        self.owner, self.sinks, self.options = owner, list(sinks), dict(options)
        self.dbg: NeuralDbg | None = None

    def start(self, model: torch.nn.Module, tracker_sinks: Iterable[Any] = ()) -> NeuralDbg:
        if self.dbg is not None:
            self.dbg.close("stopped: a new training run started")
        self.dbg = NeuralDbg(model, None, sinks=[*self.sinks, *tracker_sinks], **self.options).attach()
        return self.dbg

    def observe(self, step: int, scaler: Any = None, optimizer: Any = None) -> None:
        if self.dbg is None or not self.dbg.enabled or scaler_skips_step(scaler, optimizer):
            return
        self.dbg.step(int(step))

    def close(self, status: str = "completed") -> None:
        if self.dbg is not None:
            self.dbg.close(status)


# ---- the trackers a framework already logs to ----------------------------------------------------
def _kinds(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def _tensorboard_sink(writer: Any = None, log_dir: str | None = None) -> Any:
    from .tensorboard import TensorBoardSink
    if writer is not None and "torch.utils.tensorboard" in type(writer).__module__:
        return TensorBoardSink(writer=writer)
    return TensorBoardSink(log_dir=log_dir)  # tensorboardX writer: its own file in the same run directory


def lightning_logger_sinks(loggers: Iterable[Any]) -> list[Any]:
    """A sink into each MLflow, W&B or TensorBoard logger's own run (call on global rank 0 only)."""
    sinks: list[Any] = []
    for logger in loggers:
        kinds = _kinds(logger)
        if "MLFlowLogger" in kinds:
            from .mlflow import MLflowSink
            sinks.append(MLflowSink(tracking_uri=getattr(logger, "_tracking_uri", None), run_id=logger.run_id))
        elif "WandbLogger" in kinds:
            from .wandb import WandbSink
            sinks.append(WandbSink(run=logger.experiment))
        elif "TensorBoardLogger" in kinds:
            sinks.append(_tensorboard_sink(logger.experiment, logger.log_dir))
    return sinks


def _report_to(args: Any) -> set[str]:
    names = getattr(args, "report_to", None) or []
    names = {names} if isinstance(names, str) else set(names)
    return {"mlflow", "wandb", "tensorboard"} if "all" in names else names


def _newest_run_dir(output_dir: str) -> str | None:
    runs = Path(output_dir, "runs")
    dirs = [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []
    return str(max(dirs, key=lambda p: p.stat().st_mtime)) if dirs else None


def report_to_sinks(args: Any) -> list[Any]:
    """A sink into each ``report_to`` tracker's active run: the MLflow run and the W&B run the HF
    callbacks started, and the log dir of HF's TensorBoard writer (``$TENSORBOARD_LOGGING_DIR`` or the
    newest ``<output_dir>/runs/*``). Call on the main process, after those callbacks' ``on_train_begin``."""
    names, sinks = _report_to(args), []
    mlflow = sys.modules.get("mlflow")
    active = mlflow.active_run() if "mlflow" in names and mlflow is not None else None
    if active is not None:
        from .mlflow import MLflowSink
        sinks.append(MLflowSink(tracking_uri=mlflow.get_tracking_uri(), run_id=active.info.run_id))
    wandb = sys.modules.get("wandb")
    if "wandb" in names and wandb is not None and getattr(wandb, "run", None) is not None:
        from .wandb import WandbSink
        sinks.append(WandbSink(run=wandb.run))
    if "tensorboard" in names:
        log_dir = os.environ.get("TENSORBOARD_LOGGING_DIR") or _newest_run_dir(args.output_dir)
        if log_dir is not None:
            sinks.append(_tensorboard_sink(log_dir=os.path.expanduser(log_dir)))
    return sinks

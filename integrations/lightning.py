"""PyTorch Lightning: ``NeuralDbgCallback`` watches ``Trainer.fit`` with one line.

    from neuraldbg_track.integrations.lightning import NeuralDbgCallback
    trainer = Trainer(callbacks=[NeuralDbgCallback()], ...)

It takes NeuralDbg's options (``sinks``, ``thresholds``, ``every_n_steps``, ``include``, ...). Steps
are the trainer's ``global_step`` (optimizer steps, from 0). Gradients are read in
``on_before_optimizer_step``: after the last micro-batch's backward (one observation per optimizer step
with ``accumulate_grad_batches``), after AMP unscaling, before gradient clipping; a step that fp16's
``GradScaler`` skips (inf/NaN found) is not observed. Only training forwards count: validation, test
and predict run in eval mode without grad and are ignored. Under DDP each rank watches its own
activations and rank 0 writes (see :mod:`neuraldbg_track.distributed`).

With ``reuse_logger=True`` (default) events also go into the run of the trainer's MLflow, W&B or
TensorBoard logger (``MLFlowLogger``, ``WandbLogger``, ``TensorBoardLogger``); other loggers, and
``logger=False``, leave the journal (and your ``sinks``) as the record. ``callback.dbg`` is the
NeuralDbg of the latest ``fit`` (its ``events``, ``journal_path``, ``states()``).
"""
from __future__ import annotations

from typing import Any, Iterable

from ._callbacks import Session, lightning_logger_sinks

_INSTALL = 'NeuralDbgCallback for Lightning needs lightning: pip install "neuraldbg-track[lightning]"'

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone ``pytorch_lightning`` package
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc


class NeuralDbgCallback(Callback):
    """Watches training during ``Trainer.fit``; takes NeuralDbg's options (see the module doc)."""

    def __init__(self, *, sinks: Iterable[Any] = (), reuse_logger: bool = True, **options: Any) -> None:
        self.reuse_logger = reuse_logger
        self._session = Session("NeuralDbgCallback", sinks, options)

    @property
    def dbg(self):
        """The NeuralDbg of the latest fit (None before the first)."""
        return self._session.dbg

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        trackers = lightning_logger_sinks(trainer.loggers) if self.reuse_logger and trainer.is_global_zero else []
        self._session.start(pl_module, trackers)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._session.observe(trainer.global_step, scaler, optimizer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._session.close("completed")  # before the loggers are finalized

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._session.close(f"stopped by {type(exception).__name__}")

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._session.close("stopped before the end of training")  # no-op when already closed

    def close(self, status: str = "completed") -> None:
        """Remove the hooks and close the sinks now (the callback does it when training ends)."""
        self._session.close(status)

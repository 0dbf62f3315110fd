"""Hugging Face Transformers: ``NeuralDbgCallback`` watches ``Trainer.train`` with one line.

    from neuraldbg_track.integrations.transformers import NeuralDbgCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[NeuralDbgCallback()])

It takes NeuralDbg's options (``sinks``, ``thresholds``, ``every_n_steps``, ``include``, ...). Steps
are ``state.global_step`` (optimizer steps, from 0). Gradients are read in ``on_pre_optimizer_step``
(transformers >= 4.45): once per optimizer step with ``gradient_accumulation_steps``, unscaled under
fp16, and a step that fp16's ``GradScaler`` skips is not observed. **The Trainer clips gradients
before that hook** (``max_grad_norm``, default 1.0): norms are judged after clipping, so EXPLODING can
only show when ``max_grad_norm`` is 0 or above the ``exploding`` threshold, and a large clip factor
can push small layers below ``vanishing``. Only training forwards count (evaluation and prediction
run in eval mode without grad). Under DDP each rank watches its own activations and the main process
writes (see :mod:`neuraldbg_track.distributed`).

With ``reuse_trackers=True`` (default) events also go into the runs of the ``report_to`` trackers that
are active when training starts: the MLflow run and the W&B run the Trainer's own callbacks started,
and the directory of its TensorBoard writer. ``callback.dbg`` is the NeuralDbg of the latest
``train()``. The Trainer has no hook for exceptions: if ``train()`` raises, call ``callback.close()``.
"""
from __future__ import annotations

from typing import Any, Iterable

from ._callbacks import Session, report_to_sinks

_INSTALL = ('NeuralDbgCallback for Transformers needs transformers>=4.45 and accelerate: '
            'pip install "neuraldbg-track[transformers]"')

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError(_INSTALL) from exc
if not hasattr(TrainerCallback, "on_pre_optimizer_step"):
    raise ImportError(f"{_INSTALL} (this transformers has no on_pre_optimizer_step hook)")


class NeuralDbgCallback(TrainerCallback):
    """Watches training during ``Trainer.train``; takes NeuralDbg's options (see the module doc)."""

    def __init__(self, *, sinks: Iterable[Any] = (), reuse_trackers: bool = True, **options: Any) -> None:
        self.reuse_trackers = reuse_trackers
        self._session = Session("NeuralDbgCallback", sinks, options)

    @property
    def dbg(self):
        """The NeuralDbg of the latest ``train()`` (None before the first)."""
        return self._session.dbg

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("the Trainer passed no model to on_train_begin; NeuralDbgCallback needs a "
                               "transformers.Trainer (>= 4.45) that passes model= to its callbacks")
        trackers = report_to_sinks(args) if self.reuse_trackers and state.is_world_process_zero else []
        self._session.start(model, trackers)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                              **kwargs: Any) -> None:
        self._session.observe(state.global_step, getattr(optimizer, "scaler", None), optimizer)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._session.close("completed")

    def close(self, status: str = "stopped") -> None:
        """Remove the hooks and close the sinks now (the callback does it when training ends)."""
        self._session.close(status)

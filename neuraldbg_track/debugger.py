"""``NeuralDbg``: attach to a model, watch each optimizer step, emit events on state changes.

Data flows one way: hooks -> stats (device) -> one transfer -> classify -> transitions -> sinks.
"""
from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .classify import (
    ANOMALOUS,
    Baseline,
    NormWindow,
    activation_state,
    classify_activation,
    classify_gradient,
    gradient_state,
)
from .config import ConfigError, Thresholds, WatchConfig, thresholds_from
from .delivery import delivery_summary, prepare_sink
from .distributed import EventRelay
from .events import EventType, SemanticEvent
from .hooks import Gate, HookSet, Layer, select_layers
from .sinks import ConsoleSink, FanOut, JsonlSink
from .sinks.jsonl import DEFAULT_ROOT
from .buffer import StepBuffer
from .stats import recheck_nonfinite
from .transitions import TransitionDetector

if TYPE_CHECKING:
    from .reasoner import CausalHypothesis

GRAD = EventType.GRADIENT_HEALTH.value
ACT = EventType.ACTIVATION_REGIME.value
_ATTACHED: weakref.WeakKeyDictionary[nn.Module, NeuralDbg] = weakref.WeakKeyDictionary()


def _is_compiled(model: nn.Module) -> bool:
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


class NeuralDbg:
    """Watches ``model`` (and counts steps from ``optimizer``) while the context is open.

    ``sinks`` are added beside the JSONL journal (``journal=False`` turns it off, a path or
    :class:`JsonlSink` relocates it; the default root is ``$NEURALDBG_DIR`` or ``./neuraldbg``).
    Keyword settings (``every_n_steps``, ``max_events``, ``include``, ``exclude``,
    ``module_types``, ``activations``, ``gradients``) override ``config``; ``thresholds`` is a
    :class:`Thresholds` or a mapping of its fields. ``enabled=False`` installs nothing at all.
    Attach before ``torch.compile(model)``: a compiled module is refused.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 sinks: Iterable[Any] = (), journal: bool | str | os.PathLike | JsonlSink = True,
                 console: bool = True, config: WatchConfig | None = None,
                 thresholds: Thresholds | Mapping[str, Any] | None = None, run_id: str | None = None,
                 enabled: bool = True, distributed: Any = None, **settings: Any) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if _is_compiled(model):
            raise TypeError("NeuralDbg was given a torch.compile'd module, whose hooks it cannot add after "
                            "compilation. Attach first, then compile: "
                            "dbg = NeuralDbg(model, opt); model = torch.compile(model)")
        cfg = config or WatchConfig()
        if thresholds is not None:
            cfg = replace(cfg, thresholds=thresholds if isinstance(thresholds, Thresholds)
                          else thresholds_from(thresholds))
        unknown = set(settings) - set(WatchConfig.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}; allowed: "
                              f"{sorted(WatchConfig.__dataclass_fields__)}")
        self.config = replace(cfg, **settings) if settings else cfg
        # Under DDP (see distributed.py) rank 0 writes; other ranks judge their activations and relay the events.
        self._relay = EventRelay.resolve(distributed, model, self.config.gradients) if enabled else None
        if self._relay is not None and not self._relay.is_writer:
            journal, console, sinks = False, False, ()
            self.config = replace(self.config, gradients=False)  # all-reduced: rank 0 judges them once
        self.model, self.optimizer, self.enabled = model, optimizer, enabled
        self.layers: list[Layer] = select_layers(model, self.config) if enabled else []
        self.journal = self._make_journal(journal, run_id) if enabled else None
        self.sinks = FanOut([s for s in (self.journal,) if s is not None])
        if enabled and console:
            self.sinks.add(ConsoleSink())
        for sink in sinks:
            self.sinks.add(prepare_sink(sink, self.journal))
        self.step_count = 0
        self.observed_steps = 0
        self.execution_order: list[str] = []  # layer names in the order the first observed forward ran them
        self.dropped_events = 0
        self._events: deque[SemanticEvent] = deque(maxlen=self.config.max_events)
        self._detector = TransitionDetector(self.config.thresholds.patience)
        th = self.config.thresholds
        self._windows = {l.index: NormWindow(th.saturation_window) for l in self.layers if l.params}
        self._baselines = {l.index: Baseline(th.baseline_decay, th.anomaly_warmup, th.anomaly_rebaseline)
                           for l in self.layers if l.probe is not None}
        self._grad_layers = [l for l in self.layers if l.params]
        self._buffer = StepBuffer()
        self._gate = Gate(model)
        self._hooks = HookSet()
        self._open = False

    @classmethod
    def from_config(cls, cfg: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    **extra: Any) -> NeuralDbg:
        """Build from a Hydra/OmegaConf node such as ``cfg.neuraldbg`` (needs ``[hydra]``); bad
        values fail here, naming the key, the value and what is allowed."""
        from .configure import from_config
        return from_config(cfg, model, optimizer, **extra)

    @staticmethod
    def _make_journal(journal: Any, run_id: str | None) -> JsonlSink | None:
        if journal is False or journal is None:
            return None
        if isinstance(journal, JsonlSink):
            return journal
        root = Path(os.environ.get("NEURALDBG_DIR", DEFAULT_ROOT)) if journal is True else Path(journal)
        return JsonlSink(root, run_id)

    # ---- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> NeuralDbg:
        return self.attach()

    def __exit__(self, exc_type, exc, tb) -> None:
        status = "completed" if exc_type is None else f"stopped by {exc_type.__name__}"
        self.close(status)

    def attach(self) -> NeuralDbg:
        """Install the hooks and open the journal (the ``with`` statement calls this)."""
        if self._open or not self.enabled:
            return self
        other = _ATTACHED.get(self.model)
        if other is not None and other is not self:
            raise RuntimeError("this model is already watched by another open NeuralDbg; close it first "
                               "(nested NeuralDbg contexts on one model would double every event)")
        _ATTACHED[self.model] = self
        try:
            self._hooks.install_forward(self.layers, self._buffer, self._gate)
            if self.optimizer is not None:
                self._hooks.install_optimizer(self.optimizer, self._before_step, self._after_step)
        except BaseException:
            self._hooks.remove()
            _ATTACHED.pop(self.model, None)
            raise
        if self.journal is not None:
            self.journal.open(self.run_info())
        self._open = True
        return self

    def close(self, status: str = "completed") -> None:
        """Remove every hook, flush and close the sinks; safe to call twice."""
        if not self._open:
            return
        self._open = False
        self._hooks.remove()
        self._buffer.clear()
        for event in self._relay.finish(status == "completed") if self._relay is not None else ():
            self._record(event)
        if _ATTACHED.get(self.model) is self:
            del _ATTACHED[self.model]
        self.sinks.flush()
        self.sinks.report(self.explain())  # the post-mortem reaches every sink (journal included) before close
        for sink in self.sinks.sinks:
            if sink is self.journal:
                continue
            self.sinks._call(sink, "close")
        if self.journal is not None:
            self.journal.close({"status": status, "steps": self.step_count, "dropped_events": self.dropped_events,
                                "execution_order": self.execution_order,
                                "sink_failures": dict(self.sinks.failures),
                                "delivery": delivery_summary(self.sinks.sinks)})

    def run_info(self) -> dict[str, Any]:
        return {"model_class": type(self.model).__name__, "optimizer_class": type(self.optimizer).__name__
                if self.optimizer is not None else None, "thresholds": asdict(self.config.thresholds),
                "every_n_steps": self.config.every_n_steps, "layers": [l.name for l in self.layers],
                "layer_sizes": self.layer_sizes(), "torch_version": torch.__version__}

    # ---- what users read ----------------------------------------------------------------------
    @property
    def events(self) -> list[SemanticEvent]:
        """Events kept in memory, oldest first (at most ``max_events``; see ``dropped_events``)."""
        return list(self._events)

    @property
    def journal_path(self) -> Path | None:
        return self.journal.path if self.journal is not None else None

    def states(self) -> dict[str, dict[str, str]]:
        """The confirmed state of every layer that has one: ``{layer: {event_type: state}}``."""
        out: dict[str, dict[str, str]] = {}
        for (event_type, layer), state in self._detector.states().items():
            out.setdefault(layer, {})[event_type] = state
        return out

    def layer_sizes(self) -> dict[str, int]:
        """Parameters judged per layer, for the layers that have any: ``{layer: count}``."""
        return {l.name: sum(p.numel() for p in l.params) for l in self.layers if l.params}

    def explain(self) -> list[CausalHypothesis]:
        """This run's failures as ranked causal hypotheses, most likely first; a healthy run gets one
        "no failure found" hypothesis. See :mod:`neuraldbg_track.reasoner`."""
        from .reasoner import explain
        return explain(self.events, self.execution_order, layers=[l.name for l in self.layers],
                       sizes=self.layer_sizes(), window=10 * self.config.every_n_steps)

    # ---- stepping -----------------------------------------------------------------------------
    def step(self, step: int | None = None) -> None:
        """Mark the end of a training step when no optimizer was given: observe it (the gradients as
        they are now, the activations of its last training forward) and count it. ``step`` numbers it
        when the loop counts its own steps (a framework's global step); by default steps count from 0."""
        if self.optimizer is not None:
            raise RuntimeError("steps are counted from the optimizer given to NeuralDbg; do not call dbg.step()")
        if not self._open:
            raise RuntimeError("dbg.step() outside the NeuralDbg context: use `with NeuralDbg(model) as dbg:`")
        if step is not None and step != self.step_count:
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise ValueError(f"dbg.step(step={step!r}); expected an integer >= 0 (the training step number)")
            self.step_count = step  # a loop that resumed or skipped numbers: judge every_n_steps on its count
            self._gate.observing = step % self.config.every_n_steps == 0
        self._before_step()
        self._after_step()

    def _before_step(self) -> None:
        if self._gate.observing:
            self._observe(self.step_count)

    def _after_step(self) -> None:
        self.step_count += 1
        self._gate.observing = self.step_count % self.config.every_n_steps == 0

    @torch.no_grad()
    def _observe(self, step: int) -> None:
        self.observed_steps += 1
        groups = []
        for layer in self._grad_layers:
            grads = [p.grad for p in layer.params if p.grad is not None]
            if grads:
                groups.append((layer.index, grads))
        acts, grads = self._buffer.gather(groups)
        if acts and not self.execution_order:  # hooks fire in forward order: the model's real layer order
            self.execution_order = [self.layers[i].name for i in self._buffer.order or acts]  # (compiled: acts)
            self._buffer.record_order = False
        th, detector, layers = self.config.thresholds, self._detector, self.layers
        for index, stats in grads.items():
            name = layers[index].name
            if stats.nonfinite:  # rare path: count the bad values (more transfers, only now)
                stats = recheck_nonfinite(stats, dict(groups)[index])
            window = self._windows[index]
            window.add(stats.norm)
            track = detector.track(GRAD, name)
            if not detector.settled(track, gradient_state(stats, track.confirmed, th, window)):
                verdict = classify_gradient(stats, track.confirmed, th, window)
                self._record(detector.observe(GRAD, name, step, verdict))
        for index, stats in acts.items():
            name = layers[index].name
            baseline = self._baselines[index]
            track = detector.track(ACT, name)
            state = activation_state(stats, track.confirmed, th, baseline)
            if not detector.settled(track, state):
                self._record(detector.observe(ACT, name, step, classify_activation(stats, track.confirmed, th, baseline)))
            baseline.update(stats.rms, anomalous=state == ANOMALOUS)
        for event in self._relay.exchange() if self._relay is not None else ():  # same calls on every rank
            self._record(event)

    def _record(self, event: SemanticEvent | None) -> None:
        if event is None:
            return
        if self._relay is not None:  # stamps metadata["rank"]; off rank 0, holds it for the next exchange
            event = self._relay.outgoing(event)
        if len(self._events) == self._events.maxlen:
            self.dropped_events += 1
        self._events.append(event)
        self.sinks.emit(event)

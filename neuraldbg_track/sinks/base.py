"""The sink interface and the fan-out that keeps one failing sink from hurting the others.

A sink is anything with ``emit(event)``; ``flush()``, ``close()`` and ``report(hypotheses)`` (the
run's ranked :class:`~neuraldbg_track.reasoner.CausalHypothesis` list, given once, at close, before
``close()``) are optional. A plain callable ``fn(event)`` is a sink too. :class:`FanOut` calls each
sink in turn; a sink that raises is reported once (a warning naming it and the error), counted, and
the others and the training go on.
"""
from __future__ import annotations

import logging
import warnings
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Sequence

from ..events import SemanticEvent

log = logging.getLogger("neuraldbg_track")


class SinkWarning(UserWarning):
    """A sink failed; training goes on and the journal still holds every event."""


def warn_sink(message: str, stacklevel: int = 3) -> None:
    """Tell the user about a sink problem on both channels: a :class:`SinkWarning` and the log."""
    warnings.warn(message, SinkWarning, stacklevel=stacklevel + 1)
    log.warning(message)


class Sink(ABC):
    """Receives events. Only ``emit`` is required; ``flush``/``close``/``report`` default to no-ops."""

    @abstractmethod
    def emit(self, event: SemanticEvent) -> None: ...

    def flush(self) -> None:
        pass

    def report(self, hypotheses: Sequence[Any]) -> None:
        """The run's post-mortem: ranked causal hypotheses, most likely first (called once, at close)."""

    def close(self) -> None:
        self.flush()

    @property
    def name(self) -> str:
        return type(self).__name__


class _Adapted(Sink):
    """Wraps a duck-typed object or a callable in the :class:`Sink` interface."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self._emit: Callable[[SemanticEvent], Any] = getattr(target, "emit", target)

    def emit(self, event: SemanticEvent) -> None:
        self._emit(event)

    def flush(self) -> None:
        if callable(getattr(self.target, "flush", None)):
            self.target.flush()

    def close(self) -> None:
        if callable(getattr(self.target, "close", None)):
            self.target.close()
        else:
            self.flush()

    def report(self, hypotheses: Sequence[Any]) -> None:
        if callable(getattr(self.target, "report", None)):
            self.target.report(hypotheses)

    @property
    def name(self) -> str:
        return getattr(self.target, "__name__", type(self.target).__name__)


def as_sink(target: Any) -> Sink:
    """A :class:`Sink` for a sink, an object with ``emit(event)``, or a callable ``fn(event)``."""
    if isinstance(target, Sink):
        return target
    if callable(getattr(target, "emit", None)) or callable(target):
        return _Adapted(target)
    raise TypeError(f"{target!r} is not a sink: pass an object with emit(event) or a callable fn(event)")


class FanOut(Sink):
    """Delivers each event to every sink, isolating failures (reported once per sink)."""

    def __init__(self, sinks: Iterable[Any] = ()) -> None:
        self.sinks: list[Sink] = [as_sink(s) for s in sinks]
        self.failures: dict[str, int] = {}

    def add(self, sink: Any) -> Sink:
        adapted = as_sink(sink)
        self.sinks.append(adapted)
        return adapted

    def _call(self, sink: Sink, verb: str, *args: Any) -> None:
        try:
            getattr(sink, verb)(*args)
        except Exception as exc:  # a sink must never stop training
            key = sink.name
            self.failures[key] = self.failures.get(key, 0) + 1
            if self.failures[key] == 1:
                msg = (f"neuraldbg-track: sink {key} failed in {verb}() ({type(exc).__name__}: {exc}); "
                       "training continues and the JSONL journal keeps every event. "
                       "Further failures of this sink are counted, not repeated.")
                warn_sink(msg)

    def emit(self, event: SemanticEvent) -> None:
        for sink in self.sinks:
            self._call(sink, "emit", event)

    def flush(self) -> None:
        for sink in self.sinks:
            self._call(sink, "flush")

    def report(self, hypotheses: Sequence[Any]) -> None:
        for sink in self.sinks:
            self._call(sink, "report", hypotheses)

    def close(self) -> None:
        for sink in self.sinks:
            self._call(sink, "close")

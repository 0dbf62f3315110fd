"""How sinks given to ``NeuralDbg`` are delivered to (stub: synchronous; see issue 3)."""
from __future__ import annotations

from typing import Any

from .sinks import JsonlSink, Sink, as_sink


def prepare_sink(target: Any, journal: JsonlSink | None) -> Sink:
    """The sink NeuralDbg adds for a user-given sink (``journal`` is the run's journal, or None)."""
    return as_sink(target)

"""The MLflow tag scheme: which tags and metrics describe a run's events (see ``mlflow.py``)."""
from __future__ import annotations

from typing import Iterable

from neuraldbg_track.events import FAILURE_STATES, SemanticEvent

from ._payload import MAX_KEY, join_truncated, sanitize_key, severity, truncate, worst_state

PREFIX = "neuraldbg"


def event_key(event: SemanticEvent) -> tuple:
    """What makes an event itself: the same key twice (a retry, a replay) is one event."""
    return (event.event_type, event.layer_name, event.step, event.from_state, event.to_state)


def summary(events: Iterable[SemanticEvent]) -> tuple[dict[str, str], dict[str, float]]:
    """The tags and metrics for ``events`` (any order: they are replayed in step order)."""
    current: dict[tuple[str, str], str] = {}
    first: dict[str, tuple[int, str]] = {}
    layers: dict[str, dict[str, None]] = {}
    ordered = sorted(events, key=lambda e: e.step)
    for e in ordered:
        current[(e.layer_name, e.event_type)] = e.to_state
        if e.is_failure:
            first.setdefault(e.to_state, (e.step, e.layer_name))
            layers.setdefault(e.to_state, {})[e.layer_name] = None
    failing = {layer for (layer, kind), state in current.items() if state in FAILURE_STATES.get(kind, ())}
    tags = {f"{PREFIX}.status": worst_state(current.values()),
            f"{PREFIX}.peak": worst_state(e.to_state for e in ordered),
            f"{PREFIX}.failures": ",".join(sorted(first, key=lambda s: (-severity(s), s))) or "none",
            f"{PREFIX}.event_count": str(len(ordered))}
    metrics = {f"{PREFIX}.event_count": float(len(ordered)), f"{PREFIX}.failing_layers": float(len(failing))}
    if ordered:
        tags[f"{PREFIX}.last_step"] = str(ordered[-1].step)
    for state, (step, layer) in first.items():
        s = sanitize_key(state)
        tags[f"{PREFIX}.first_step.{s}"] = str(step)
        tags[f"{PREFIX}.first_layer.{s}"] = truncate(layer)
        tags[f"{PREFIX}.layers.{s}"] = join_truncated(layers[state])
        metrics[f"{PREFIX}.first_step.{s}"] = float(step)
    for (layer, kind), state in current.items():
        suffix = "." + sanitize_key(kind)
        head = f"{PREFIX}.layer."
        tags[head + sanitize_key(layer, MAX_KEY - len(head) - len(suffix)) + suffix] = state
    return tags, metrics

"""The event record and the state vocabulary.

A :class:`SemanticEvent` says that one layer's state changed: *what* (``event_type``,
``from_state`` -> ``to_state``), *where* (``layer_name``, as in ``model.named_modules()``) and
*when* (``step``, the optimizer step at which the change was confirmed). ``metadata`` carries the
statistics that justified it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping


class EventType(str, Enum):
    GRADIENT_HEALTH = "gradient_health"
    ACTIVATION_REGIME = "activation_regime"

    def __str__(self) -> str:
        return self.value


class GradientHealth(str, Enum):
    UNKNOWN = "UNKNOWN"
    HEALTHY = "HEALTHY"
    VANISHING = "VANISHING"
    EXPLODING = "EXPLODING"
    SATURATED = "SATURATED"
    NON_FINITE = "NON_FINITE"

    def __str__(self) -> str:
        return self.value


class ActivationRegime(str, Enum):
    UNKNOWN = "UNKNOWN"
    NORMAL = "NORMAL"
    SATURATED = "SATURATED"
    DEAD = "DEAD"
    ANOMALOUS = "ANOMALOUS"

    def __str__(self) -> str:
        return self.value


UNKNOWN = "UNKNOWN"
#: The state a layer is in when nothing is wrong, per event type.
HEALTHY_STATE = {EventType.GRADIENT_HEALTH.value: GradientHealth.HEALTHY.value,
                 EventType.ACTIVATION_REGIME.value: ActivationRegime.NORMAL.value}
#: States that mean "something is wrong", per event type.
FAILURE_STATES = {
    EventType.GRADIENT_HEALTH.value: frozenset(
        s.value for s in GradientHealth if s not in (GradientHealth.UNKNOWN, GradientHealth.HEALTHY)),
    EventType.ACTIVATION_REGIME.value: frozenset(
        s.value for s in ActivationRegime if s not in (ActivationRegime.UNKNOWN, ActivationRegime.NORMAL)),
}


# The statistic that justifies each activation state (gradient events always show grad_norm).
_ACTIVATION_KEY_STAT = {"DEAD": "dead_fraction", "SATURATED": "saturated_fraction", "ANOMALOUS": "shift_decades"}


def key_statistic(event: "SemanticEvent") -> tuple[str, Any] | None:
    """The one statistic a reader wants next to this event, as ``(name, value)``, or None."""
    if event.event_type == EventType.GRADIENT_HEALTH.value:
        name = "grad_norm"
    else:
        name = _ACTIVATION_KEY_STAT.get(event.to_state, _ACTIVATION_KEY_STAT.get(event.from_state, "rms"))
        if name not in event.metadata:
            name = "rms"
    return (name, event.metadata[name]) if name in event.metadata else None


def _plain(value: Any) -> Any:
    """Turn metadata into JSON-safe plain data (non-finite floats become strings)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # 'nan', 'inf', '-inf'
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(f"metadata value {value!r} of type {type(value).__name__} is not JSON-serialisable; "
                    "use str, int, float, bool, None, lists or dicts")


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class SemanticEvent:
    """One confirmed change of a layer's state. Immutable; ``to_dict``/``from_dict`` round-trip."""

    event_type: str
    layer_name: str
    step: int
    from_state: str
    to_state: str
    confidence: float
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("event_type", "from_state", "to_state"):
            value = getattr(self, name)
            if isinstance(value, Enum):
                object.__setattr__(self, name, value.value)
        if self.event_type not in HEALTHY_STATE:
            raise ValueError(f"event_type={self.event_type!r}; expected one of {sorted(HEALTHY_STATE)}")
        if not 0.0 <= float(self.confidence) <= 1.0:
            raise ValueError(f"confidence={self.confidence!r}; expected a float in [0, 1]")
        object.__setattr__(self, "step", int(self.step))
        object.__setattr__(self, "confidence", float(self.confidence))
        object.__setattr__(self, "metadata", _freeze(_plain(dict(self.metadata))))

    def to_dict(self) -> dict[str, Any]:
        return {"event_type": self.event_type, "layer_name": self.layer_name, "step": self.step,
                "from_state": self.from_state, "to_state": self.to_state,
                "confidence": self.confidence, "metadata": _thaw(self.metadata)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SemanticEvent":
        missing = {"event_type", "layer_name", "step", "from_state", "to_state", "confidence"} - set(data)
        if missing:
            raise ValueError(f"event record lacks field(s) {sorted(missing)}: {dict(data)!r}")
        return cls(event_type=data["event_type"], layer_name=data["layer_name"], step=data["step"],
                   from_state=data["from_state"], to_state=data["to_state"],
                   confidence=data["confidence"], metadata=data.get("metadata") or {})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @property
    def is_failure(self) -> bool:
        """True when the layer entered a state that means something is wrong."""
        return self.to_state in FAILURE_STATES[self.event_type]

    def __hash__(self) -> int:  # metadata is a mapping proxy: hash the identity fields only
        return hash((self.event_type, self.layer_name, self.step, self.from_state, self.to_state))

"""Numbers and keys that chart adapters share: state codes, the key statistic, safe key segments.

A state code is the state's rank by severity within its event type (0 = healthy), so a chart of
codes reads "higher is worse" and the same code means the same thing in every tracker.
"""
from __future__ import annotations

import math
import re
from typing import Any

from neuraldbg_track.events import SemanticEvent

STATE_CODES: dict[str, dict[str, int]] = {
    "gradient_health": {"UNKNOWN": -1, "HEALTHY": 0, "SATURATED": 1, "VANISHING": 2, "EXPLODING": 3,
                        "NON_FINITE": 4},
    "activation_regime": {"UNKNOWN": -1, "NORMAL": 0, "SATURATED": 1, "ANOMALOUS": 2, "DEAD": 3},
}
#: Metadata keys worth charting, most telling first.
KEY_STATISTICS = ("grad_norm", "dead_fraction", "saturated_fraction", "rms")
_UNSAFE = re.compile(r"[^\w.\-]+")


def state_code(event_type: str, state: str) -> int:
    """The code of ``state`` (see :data:`STATE_CODES`); -1 for a state this version does not know."""
    return STATE_CODES.get(event_type, {}).get(state, -1)


def codes_legend(event_type: str) -> str:
    """``"0 HEALTHY, 1 SATURATED, ..."`` for chart titles."""
    return ", ".join(f"{c} {s}" for s, c in STATE_CODES[event_type].items() if c >= 0)


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (metadata keeps NaN/inf as strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def key_statistic(event: SemanticEvent) -> tuple[str, Any]:
    """The first of :data:`KEY_STATISTICS` in the event's metadata, as ``(name, value)``."""
    for name in KEY_STATISTICS:
        if name in event.metadata:
            return name, event.metadata[name]
    return "", None


def safe_key(name: str) -> str:
    """A layer name as one key segment: word characters, dots and dashes (``/`` would nest)."""
    return _UNSAFE.sub("_", name) or "_"

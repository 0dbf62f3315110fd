"""What chart adapters (W&B, TensorBoard) share: numeric state codes and the key statistic.

A state code is the state's rank by :data:`~._payload.SEVERITY` among the states of its event type,
0 being the healthy one, so a chart of codes reads "higher is worse" and a code means the same in
every tracker. UNKNOWN (and any state this version does not know) is -1.
"""
from __future__ import annotations

import math
from typing import Any

from neuraldbg_track.events import FAILURE_STATES, HEALTHY_STATE, SemanticEvent
from neuraldbg_track.events import key_statistic as _key_statistic

from ._payload import severity

STATE_CODES: dict[str, dict[str, int]] = {
    event_type: {"UNKNOWN": -1, **{state: code for code, state in enumerate(
        sorted({healthy, *FAILURE_STATES[event_type]}, key=severity))}}
    for event_type, healthy in HEALTHY_STATE.items()
}
#: Metadata keys worth charting, most telling first.
KEY_STATISTICS = ("grad_norm", "dead_fraction", "saturated_fraction", "rms")


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
    """The statistic that justifies the event (see :func:`neuraldbg_track.events.key_statistic`),
    as ``(name, value)``; ``("", None)`` when its metadata has none."""
    return _key_statistic(event) or ("", None)

"""When to alert, and what one alert says: a pure policy (no tracker, no threads, injectable clock).

* Which states alert, and at which level, is configurable (``alert_levels``).
* Dedupe: a (event type, layer, state) alerts at most once per run.
* Aggregation: failures of one kind that arrive within ``window_s`` of the first become ONE alert
  ("12 layers' gradients VANISHING: 0, 2, 4, ..."), so a 100-layer model that vanishes at once
  sends one alert, not 100.
* Rate limit: one alert per title per ``min_interval_s``; layers that fail meanwhile wait and go
  out together in the next one. Titles are stable per (event type, state), so the tracker's own
  per-title limit (W&B ``wait_duration``) agrees with this one.
* Cap: at most ``max_alerts`` per run; layers past the cap are counted in ``suppressed``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from neuraldbg_track.events import FAILURE_STATES, SemanticEvent

from ._payload import truncate

LEVELS = ("INFO", "WARN", "ERROR")
#: Level per state when ``alert_levels`` does not say otherwise (worst first).
DEFAULT_LEVELS = {"NON_FINITE": "ERROR", "EXPLODING": "ERROR", "VANISHING": "WARN", "DEAD": "WARN",
                  "ANOMALOUS": "WARN", "SATURATED": "INFO"}
DEFAULT_ALERT_STATES = ("VANISHING", "EXPLODING", "NON_FINITE")
ALERTABLE = frozenset().union(*FAILURE_STATES.values())
_WHAT = {"gradient_health": "gradients", "activation_regime": "activations"}
_STAT = ("grad_norm", "dead_fraction", "saturated_fraction", "rms")
MAX_TITLE = 63  # W&B: "must be less than 64 characters long"


@dataclass(frozen=True)
class Alert:
    title: str
    text: str
    level: str
    layers: tuple[str, ...]


def resolve_levels(alert_states, alert_levels: Mapping[str, str] | None) -> dict[str, str]:
    """``{state: level}`` for the states that alert (``alert_levels`` overrides the defaults of some);
    raises ValueError naming a bad state or level."""
    states = tuple(dict.fromkeys(alert_states or ()))
    levels = dict(alert_levels or {})
    for state in states:
        if state not in ALERTABLE:
            raise ValueError(f"cannot alert on state {state!r}; choose from {sorted(ALERTABLE)}")
    for state, level in levels.items():
        if state not in states:
            raise ValueError(f"alert_levels names {state!r}, which is not in alert_states={states}; "
                             "add it to alert_states to alert on it")
        if str(level).upper() not in LEVELS:
            raise ValueError(f"alert_levels[{state!r}]={level!r}; expected one of {LEVELS}")
    return {s: str(levels.get(s, DEFAULT_LEVELS[s])).upper() for s in states}


def title_for(event_type: str, state: str) -> str:
    title = f"neuraldbg: {_WHAT.get(event_type, event_type)} {state}"
    return truncate("".join(ch if ch.isprintable() else " " for ch in title), MAX_TITLE)


def _stat(event: SemanticEvent) -> str:
    for key in _STAT:
        value = event.metadata.get(key)
        if value is not None:
            return f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
    return ""


def _text(event_type: str, state: str, events: list[SemanticEvent], max_layers: int, max_chars: int) -> str:
    n = len(events)
    steps = sorted({e.step for e in events})
    when = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    shown = [f"{e.layer_name} ({stat})" if (stat := _stat(e)) else e.layer_name for e in events[:max_layers]]
    more = f", and {n - max_layers} more" if n > max_layers else ""
    noun = "layer's" if n == 1 else "layers'"
    text = f"{n} {noun} {_WHAT.get(event_type, event_type)} became {state} at {when}: {', '.join(shown)}{more}."
    return truncate(text, max_chars)


@dataclass
class AlertPolicy:
    """Collects failure events and says which alerts are due; see the module docstring."""

    levels: Mapping[str, str]
    window_s: float = 2.0
    min_interval_s: float = 300.0
    max_alerts: int = 20
    max_layers_listed: int = 10
    max_text_chars: int = 1000
    clock: Callable[[], float] = time.monotonic
    sent: int = field(default=0, init=False)
    suppressed: int = field(default=0, init=False)
    _seen: set = field(default_factory=set, init=False, repr=False)
    _pending: dict = field(default_factory=dict, init=False, repr=False)  # (type, state) -> (t0, [events])
    _last_sent: dict = field(default_factory=dict, init=False, repr=False)  # title -> time

    def __post_init__(self) -> None:
        for name in ("window_s", "min_interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}; expected a number of seconds >= 0")
        if not (isinstance(self.max_alerts, int) and self.max_alerts >= 0):
            raise ValueError(f"max_alerts={self.max_alerts!r}; expected an integer >= 0")

    def add(self, event: SemanticEvent) -> bool:
        """Queue ``event`` if it should alert (an alerting state, not alerted before)."""
        if event.to_state not in self.levels or not event.is_failure:
            return False
        key = (event.event_type, event.layer_name, event.to_state)
        if key in self._seen:
            return False
        self._seen.add(key)
        first_at, events = self._pending.setdefault((event.event_type, event.to_state), (self.clock(), []))
        events.append(event)
        return True

    def _due_at(self, kind: tuple[str, str], first_at: float) -> float:
        last = self._last_sent.get(title_for(*kind))
        return max(first_at + self.window_s, -math.inf if last is None else last + self.min_interval_s)

    def next_due_in(self) -> float | None:
        """Seconds until the earliest pending alert is due (0 if one is due now), None if none pend."""
        if not self._pending:
            return None
        now = self.clock()
        return max(0.0, min(self._due_at(k, first) for k, (first, _) in self._pending.items()) - now)

    def due(self) -> list[Alert]:
        """The alerts to send now (removed from the pending set)."""
        now = self.clock()
        return self._take([k for k, (first, _) in self._pending.items() if self._due_at(k, first) <= now])

    def drain(self) -> list[Alert]:
        """Every pending alert, due or not (at close: nothing waits forever)."""
        return self._take(list(self._pending))

    @property
    def pending_layers(self) -> int:
        return sum(len(events) for _, events in self._pending.values())

    def _take(self, kinds: list[tuple[str, str]]) -> list[Alert]:
        out = []
        worst_first = sorted(kinds, key=lambda k: -LEVELS.index(self.levels[k[1]]))
        for kind in worst_first:
            _, events = self._pending.pop(kind)
            if self.sent >= self.max_alerts:
                self.suppressed += len(events)
                continue
            title = title_for(*kind)
            out.append(Alert(title, _text(*kind, events, self.max_layers_listed, self.max_text_chars),
                             self.levels[kind[1]], tuple(e.layer_name for e in events)))
            self._last_sent[title] = self.clock()
            self.sent += 1
        return out

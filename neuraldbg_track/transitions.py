"""The one place that decides "this layer's state changed".

Patience: a new state must be observed ``patience`` times in a row before it is confirmed;
non-finite observations are confirmed at once (a NaN is a fact, not a statistical judgement).
Hysteresis lives in the classifier (it sees the confirmed state). A layer's first confirmed state
is emitted as ``UNKNOWN -> STATE`` only when it is unhealthy; a healthy start is silent.

Confidence (in [0, 1]) = margin evidence x persistence evidence, where
    margin evidence      = 1 - exp(-m / s), m = median margin of the observations that confirmed
                           the state (decades past the threshold for norms, share of the remaining
                           range for fractions; see :mod:`classify`), s = the verdict's scale;
    persistence evidence = n / (n + 1), n = observations that confirmed it (1 for non-finite
                           values, which are exact checks).
A statistic that barely crosses a threshold scores near 0; a norm three decades past it, held for
``patience`` observations, scores near ``patience / (patience + 1)``.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from .classify import Verdict
from .events import HEALTHY_STATE, UNKNOWN, SemanticEvent


@dataclass
class _Track:
    confirmed: str = UNKNOWN
    since_step: int | None = None
    held: int = 0
    candidate: str | None = None
    onset_step: int = 0
    margins: list[float] = field(default_factory=list)


def confidence(margins: list[float], scale: float, observations: int, exact: bool) -> float:
    m = max(statistics.median(margins), 0.0) if margins else 0.0
    margin_evidence = 1.0 if math.isinf(m) else 1.0 - math.exp(-m / scale)
    persistence = 1.0 if exact else observations / (observations + 1)
    return round(min(max(margin_evidence * persistence, 0.0), 1.0), 4)


def _settle(track: _Track, state: str) -> bool:
    if state != track.confirmed:
        return False
    if track.candidate is not None:
        track.candidate, track.margins = None, []
    track.held += 1
    return True


class TransitionDetector:
    """Per (event type, layer): the confirmed state and the candidate that may replace it."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self._tracks: dict[tuple[str, str], _Track] = {}

    def state(self, event_type: str, layer: str) -> str:
        track = self._tracks.get((event_type, layer))
        return track.confirmed if track else UNKNOWN

    def states(self) -> dict[tuple[str, str], str]:
        return {key: t.confirmed for key, t in self._tracks.items()}

    def track(self, event_type: str, layer: str) -> _Track:
        """The (event type, layer) track; callers on the hot path keep it and read ``confirmed``."""
        track = self._tracks.get((event_type, layer))
        if track is None:
            track = self._tracks[(event_type, layer)] = _Track()
        return track

    @staticmethod
    def settled(track: _Track, state: str) -> bool:
        """Count an observation of the confirmed state (clearing any candidate) and say True; for
        any other state say False: :meth:`observe` must judge it with its verdict."""
        return _settle(track, state)

    def observe(self, event_type: str, layer: str, step: int, verdict: Verdict) -> SemanticEvent | None:
        track = self.track(event_type, layer)
        if _settle(track, verdict.state):
            return None
        if verdict.state != track.candidate:
            track.candidate, track.onset_step, track.margins = verdict.state, step, []
        track.margins.append(verdict.margin)
        exact = bool(verdict.evidence.get("nonfinite"))
        if len(track.margins) < self.patience and not exact:
            return None
        previous, held, since = track.confirmed, track.held, track.since_step
        n = len(track.margins)
        conf = confidence(track.margins, verdict.scale, n, exact)
        onset = track.onset_step
        track.confirmed, track.since_step, track.held = verdict.state, onset, n
        track.candidate, track.margins = None, []
        if previous == UNKNOWN and verdict.state == HEALTHY_STATE[event_type]:
            return None
        metadata = dict(verdict.evidence)
        metadata.update(onset_step=onset, observations=n, margin=verdict.margin,
                        previous_state_observations=held, previous_state_since_step=since)
        return SemanticEvent(event_type, layer, step, previous, verdict.state, conf, metadata)

"""Pure classification: statistics + thresholds (+ the layer's current state for hysteresis) -> a
:class:`Verdict`. Nothing here touches tensors or keeps state; the small histories that some rules
need (:class:`NormWindow`, :class:`Baseline`) are passed in and updated by the caller.

Margins are the evidence for a verdict: in *decades* (log10 units) for norms and RMS shifts, and
as a fraction of the remaining range past the threshold for fractions (0 = at the threshold,
1 = at the extreme). :mod:`neuraldbg_track.transitions` turns margins into confidence.

Hysteresis: entering a state uses the threshold; *staying* in it uses the threshold moved by
``hysteresis`` toward the healthy side (norms: ``hysteresis`` decades; fractions: the threshold
times ``1 - hysteresis / 2``), so a statistic hovering at a threshold cannot flap.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .config import Thresholds
from .events import ActivationRegime as A
from .events import GradientHealth as G
from .stats import ActivationStats, GradientStats


@dataclass(frozen=True)
class Verdict:
    state: str
    margin: float
    evidence: dict[str, Any] = field(default_factory=dict)
    scale: float = 0.5
    """The margin at which evidence is ~63% strong: 0.5 decades for norms, 0.25 for fractions."""


FRACTION_SCALE = 0.25
# States as plain strings: an Enum's ``.value`` costs ~0.3 us, and the fast path reads several per layer.
NON_FINITE, EXPLODING, VANISHING, G_SATURATED, HEALTHY = (G.NON_FINITE.value, G.EXPLODING.value, G.VANISHING.value,
                                                          G.SATURATED.value, G.HEALTHY.value)
ANOMALOUS, DEAD, A_SATURATED, NORMAL = A.ANOMALOUS.value, A.DEAD.value, A.SATURATED.value, A.NORMAL.value


def _decades(a: float, b: float) -> float:
    """log10(a / b), with 0 mapped to +inf distance."""
    if a <= 0:
        return -math.inf
    if b <= 0:
        return math.inf
    return math.log10(a / b)


class NormWindow:
    """The last ``size`` finite gradient norms of a layer, for the stability rule of SATURATED."""

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, norm: float) -> None:
        if math.isfinite(norm):
            self.values.append(norm)

    def cv(self) -> float | None:
        """Coefficient of variation (population std / mean) once the window is full, else None."""
        if len(self.values) < (self.values.maxlen or 0):
            return None
        mean = sum(self.values) / len(self.values)
        if mean <= 0:
            return None
        var = sum((v - mean) ** 2 for v in self.values) / len(self.values)
        return math.sqrt(var) / mean


def _gradient_limits(current: str, th: Thresholds) -> tuple[float, float, float, float]:
    """(exploding, vanishing, saturation norm, saturation cv) as applied given the current state."""
    h = 10 ** th.hysteresis
    staying = current == G_SATURATED
    return (th.exploding / h if current == EXPLODING else th.exploding,
            th.vanishing * h if current == VANISHING else th.vanishing,
            th.saturation_norm / h if staying else th.saturation_norm,
            th.saturation_cv * h if staying else th.saturation_cv)


def gradient_state(stats: GradientStats, current: str, th: Thresholds, window: NormWindow) -> str:
    """The state alone: NON_FINITE > EXPLODING > VANISHING > SATURATED > HEALTHY. Most observations
    confirm the current state, and this is all the debugger computes for them."""
    g = stats.norm
    if stats.nonfinite or not math.isfinite(g):
        return NON_FINITE
    explode_at, vanish_at, sat_norm, cv_limit = _gradient_limits(current, th)
    if g > explode_at:
        return EXPLODING
    if g < vanish_at:
        return VANISHING
    if g >= sat_norm:  # the window is only read for high norms
        cv = window.cv()
        if cv is not None and cv < cv_limit:
            return G_SATURATED
    return HEALTHY


def classify_gradient(stats: GradientStats, current: str, th: Thresholds,
                      window: NormWindow) -> Verdict:
    """:func:`gradient_state` with its margin and evidence; see the module docstring."""
    state = gradient_state(stats, current, th, window)
    g = stats.norm
    if state == NON_FINITE:
        return Verdict(state, math.inf, {"grad_norm": g, "nonfinite": True, "nonfinite_count": stats.nonfinite_count})
    explode_at, vanish_at, _, _ = _gradient_limits(current, th)
    evidence: dict[str, Any] = {"grad_norm": g}
    if state == EXPLODING:
        return Verdict(state, _decades(g, th.exploding),
                       {**evidence, "threshold": th.exploding, "applied_threshold": explode_at})
    if state == VANISHING:
        return Verdict(state, _decades(th.vanishing, g) if g > 0 else math.inf,
                       {**evidence, "threshold": th.vanishing, "applied_threshold": vanish_at})
    if state == G_SATURATED:
        cv = window.cv() or 0.0
        margin = min(_decades(g, th.saturation_norm), _decades(th.saturation_cv, cv) if cv > 0 else math.inf)
        return Verdict(state, max(margin, 0.0),
                       {**evidence, "cv": cv, "threshold": th.saturation_norm, "cv_threshold": th.saturation_cv})
    margin = min(_decades(g, th.vanishing), _decades(th.exploding, g))
    return Verdict(state, margin, evidence)


class Baseline:
    """A layer's own recent activation level: an EMA of log10(RMS) over its NORMAL observations.

    ANOMALOUS means the RMS is ``anomaly_decades`` away from this baseline. Anomalous observations
    do not move the baseline; if a shifted level holds for ``rebaseline_after`` observations it
    becomes the new baseline (the layer settled at a new level and returns to NORMAL).
    """

    def __init__(self, decay: float, warmup: int, rebaseline_after: int) -> None:
        self.decay, self.warmup, self.rebaseline_after = decay, warmup, rebaseline_after
        self.level: float | None = None
        self.count = 0
        self._shifted: list[float] = []

    @property
    def ready(self) -> bool:
        return self.count >= self.warmup

    def update(self, rms: float, anomalous: bool) -> None:
        if not (math.isfinite(rms) and rms > 0):
            return
        value = math.log10(rms)
        if anomalous and self.ready:
            self._shifted.append(value)
            if len(self._shifted) >= self.rebaseline_after:
                self.level = sum(self._shifted) / len(self._shifted)
                self._shifted.clear()
            return
        self._shifted.clear()
        self.level = value if self.level is None else self.decay * self.level + (1 - self.decay) * value
        self.count += 1


def _activation_limits(current: str, th: Thresholds) -> tuple[float, float, float]:
    """(dead fraction, saturated fraction, anomaly decades) as applied given the current state."""
    keep = 1 - th.hysteresis / 2
    return (th.dead_fraction * keep if current == DEAD else th.dead_fraction,
            th.saturated_fraction * keep if current == A_SATURATED else th.saturated_fraction,
            max(th.anomaly_decades - th.hysteresis, 0.0) if current == ANOMALOUS else th.anomaly_decades)


def activation_state(stats: ActivationStats, current: str, th: Thresholds, baseline: Baseline) -> str:
    """The state alone: non-finite -> ANOMALOUS; then DEAD > SATURATED > ANOMALOUS (shift) > NORMAL."""
    if not math.isfinite(stats.rms):
        return ANOMALOUS
    dead_at, sat_at, shift_at = _activation_limits(current, th)
    if stats.dead_fraction is not None and stats.dead_fraction >= dead_at:
        return DEAD
    if stats.saturated_fraction is not None and stats.saturated_fraction >= sat_at:
        return A_SATURATED
    if (baseline.level is not None and baseline.ready and stats.rms > 0
            and abs(math.log10(stats.rms) - baseline.level) >= shift_at):
        return ANOMALOUS
    return NORMAL


def classify_activation(stats: ActivationStats, current: str, th: Thresholds,
                        baseline: Baseline) -> Verdict:
    """:func:`activation_state` with its margin and evidence."""
    state = activation_state(stats, current, th, baseline)
    evidence: dict[str, Any] = {"rms": stats.rms}
    if stats.dead_fraction is not None:
        evidence["dead_fraction"] = stats.dead_fraction
    if stats.saturated_fraction is not None:
        evidence["saturated_fraction"] = stats.saturated_fraction
    if not stats.finite:
        return Verdict(state, math.inf, {**evidence, "nonfinite": True})
    dead_at, sat_at, _ = _activation_limits(current, th)
    if state == DEAD:
        return Verdict(state, _fraction_margin(stats.dead_fraction or 0.0, th.dead_fraction),
                       {**evidence, "threshold": th.dead_fraction, "applied_threshold": dead_at}, FRACTION_SCALE)
    if state == A_SATURATED:
        return Verdict(state, _fraction_margin(stats.saturated_fraction or 0.0, th.saturated_fraction),
                       {**evidence, "threshold": th.saturated_fraction, "applied_threshold": sat_at}, FRACTION_SCALE)
    if baseline.ready and baseline.level is not None and stats.rms > 0:
        shift = abs(math.log10(stats.rms) - baseline.level)
        evidence.update(baseline_rms=10 ** baseline.level, shift_decades=shift)
        if state == ANOMALOUS:
            return Verdict(state, shift - th.anomaly_decades, {**evidence, "threshold": th.anomaly_decades})
        return Verdict(state, th.anomaly_decades - shift, evidence)
    dead = stats.dead_fraction or 0.0
    return Verdict(state, (th.dead_fraction - dead) / th.dead_fraction, evidence, FRACTION_SCALE)


def _fraction_margin(value: float, threshold: float) -> float:
    """How far ``value`` is past ``threshold``, as a share of the room left beyond it (can be < 0)."""
    room = 1.0 - threshold if value >= threshold else threshold
    return (value - threshold) / room if room > 0 else 1.0

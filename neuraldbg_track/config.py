"""Every number the extractor judges by, in one validated object.

Defaults come from the NeuralDBG seed where it gives one (vanishing 1e-6, exploding 1e3, saturated
gradient norm 1.0) and are otherwise chosen to keep healthy runs silent; each field says what it
means. Bad values fail here, at start-up, naming the field, the value and what is allowed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence


class ConfigError(ValueError):
    """A setting is out of range or of the wrong kind; the message names the key, value and rule."""


@dataclass(frozen=True)
class Thresholds:
    # --- gradient health: L2 norm of a layer's own parameter gradients -------------------------
    vanishing: float = 1e-6
    """Gradient norm below this is VANISHING (seed default)."""
    exploding: float = 1e3
    """Gradient norm above this is EXPLODING (seed default)."""
    saturation_norm: float = 1.0
    """A gradient norm at least this high AND stable (see ``saturation_cv``) is SATURATED (seed)."""
    saturation_window: int = 20
    """Observations over which gradient stability is measured."""
    saturation_cv: float = 0.02
    """Stable means: std/mean of the norm over the window below this (2% relative spread). Minibatch
    noise keeps healthy layers far above it; a gradient stuck at one value sits below it."""
    # --- activation regime ----------------------------------------------------------------------
    dead_fraction: float = 0.9
    """DEAD when at least this fraction of a layer's units are exactly zero for every sample of the batch."""
    saturated_fraction: float = 0.5
    """SATURATED when at least this fraction of a bounded activation's outputs sit at its limits."""
    saturation_tolerance: float = 0.01
    """An output is 'at the limit' when within this fraction of the output range from a bound
    (tanh: |y| >= 0.98, sigmoid: y <= 0.01 or y >= 0.99)."""
    anomaly_decades: float = 1.0
    """ANOMALOUS when the activation RMS is this many decades (1.0 = 10x) away from the layer's own
    baseline: an exponential moving average of log10(RMS) over its NORMAL observations."""
    anomaly_warmup: int = 5
    """Observations that build the baseline before ANOMALOUS can be judged."""
    baseline_decay: float = 0.9
    """EMA decay of the activation baseline (per observation)."""
    anomaly_rebaseline: int = 20
    """A shifted activation level that holds this many observations becomes the new baseline."""
    # --- transitions ----------------------------------------------------------------------------
    patience: int = 3
    """A new state must be observed this many times in a row before it is confirmed (NON_FINITE and
    non-finite activations are confirmed at once)."""
    hysteresis: float = 0.5
    """Leaving a state needs this margin past the threshold: in decades for norms and RMS shifts
    (0.5 = a factor 3.16); for fractions the threshold is multiplied by ``1 - hysteresis / 2``."""

    def __post_init__(self) -> None:
        positive = ("vanishing", "exploding", "saturation_norm", "saturation_cv",
                    "anomaly_decades", "saturation_tolerance")
        for name in positive:
            _check(name, getattr(self, name), "a finite number > 0", lambda v: math.isfinite(v) and v > 0)
        for name in ("dead_fraction", "saturated_fraction"):
            _check(name, getattr(self, name), "a fraction in (0, 1]", lambda v: 0 < v <= 1)
        _check("saturation_tolerance", self.saturation_tolerance, "a fraction in (0, 0.5)",
               lambda v: 0 < v < 0.5)
        _check("baseline_decay", self.baseline_decay, "a number in [0, 1)", lambda v: 0 <= v < 1)
        _check("hysteresis", self.hysteresis, "a number >= 0", lambda v: math.isfinite(v) and v >= 0)
        for name in ("patience", "saturation_window", "anomaly_warmup", "anomaly_rebaseline"):
            _check(name, getattr(self, name), "an integer >= 1",
                   lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
        if self.vanishing >= self.exploding:
            raise ConfigError(f"thresholds.vanishing={self.vanishing!r} must be below "
                              f"thresholds.exploding={self.exploding!r}")
        if not self.vanishing <= self.saturation_norm <= self.exploding:
            raise ConfigError(f"thresholds.saturation_norm={self.saturation_norm!r} must lie between "
                              f"vanishing={self.vanishing!r} and exploding={self.exploding!r}")


def _check(name: str, value: Any, allowed: str, rule) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not rule(value):
        raise ConfigError(f"thresholds.{name}={value!r} is not allowed; expected {allowed}")


@dataclass(frozen=True)
class WatchConfig:
    """What is watched and how often."""

    every_n_steps: int = 1
    """Take statistics on every n-th optimizer step (1 = every step)."""
    max_events: int = 10_000
    """Events kept in memory (``dbg.events``); older ones are dropped and counted. The journal keeps all."""
    include: Sequence[str] = ()
    """fnmatch patterns of layer names to watch (empty = all leaf modules)."""
    exclude: Sequence[str] = ()
    """fnmatch patterns of layer names to skip."""
    module_types: Sequence[str] = ()
    """Class names (e.g. 'Linear', 'Conv2d') to watch (empty = all)."""
    activations: bool = True
    """Watch activation regimes (forward hooks)."""
    gradients: bool = True
    """Watch gradient health (parameter gradients at the optimizer step)."""
    thresholds: Thresholds = field(default_factory=Thresholds)

    def __post_init__(self) -> None:
        for name in ("every_n_steps", "max_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} is not allowed; expected an integer >= 1")
        for name in ("include", "exclude", "module_types"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{name}={value!r} is not allowed; expected a list of strings")
            object.__setattr__(self, name, tuple(value))
        if isinstance(self.thresholds, Mapping):
            object.__setattr__(self, "thresholds", thresholds_from(self.thresholds))


def thresholds_from(values: Mapping[str, Any]) -> Thresholds:
    """Build :class:`Thresholds` from a mapping, refusing unknown keys by name."""
    known = {f.name for f in fields(Thresholds)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown threshold key(s) {unknown}; allowed: {sorted(known)}")
    return Thresholds(**dict(values))

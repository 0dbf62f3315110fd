"""From events to episodes, and the rules that link one episode to the next (used by :mod:`.reasoner`).

An :class:`Episode` is one kind of failure (:data:`KINDS`) entered by one or more layers within
``window`` steps of each other: where it started (the layers at its first onset), where it spread
and when. :func:`links` holds the causal rules; each says which earlier episode can explain a later
one, checked on time (the cause began no later than the effect and was still there when the effect
began) and on the model's structure (the layer order: activations propagate toward the output,
gradients toward the input).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .events import EventType, SemanticEvent
from .timeline import onset

GRAD, ACT = EventType.GRADIENT_HEALTH.value, EventType.ACTIVATION_REGIME.value

#: Failure kinds, in the order a chain can run (a cause always comes before its effect here).
KINDS = ("shift", "exploding", "non_finite", "saturation", "dead", "stuck", "vanishing")


def kind_of(event: SemanticEvent) -> str | None:
    """The failure kind an event enters, or None when it enters a healthy state."""
    if not event.is_failure:
        return None
    state = event.to_state
    if event.event_type == GRAD:
        return {"VANISHING": "vanishing", "EXPLODING": "exploding", "NON_FINITE": "non_finite",
                "SATURATED": "stuck"}[state]
    if state == "ANOMALOUS":
        return "non_finite" if _nonfinite(event) else "shift"
    return {"DEAD": "dead", "SATURATED": "saturation"}[state]


def _nonfinite(event: SemanticEvent) -> bool:
    if event.metadata.get("nonfinite"):
        return True
    rms = event.metadata.get("rms")
    return isinstance(rms, str) or (isinstance(rms, float) and not math.isfinite(rms))


@dataclass
class Episode:
    """Layers entering one failure kind close together in time."""

    kind: str
    events: list[SemanticEvent] = field(default_factory=list)
    """The entries into the kind, by onset."""
    exits: list[SemanticEvent] = field(default_factory=list)
    """Later events of the same layers leaving the failure for the healthy state (recoveries)."""

    @property
    def first(self) -> int:
        return min(onset(e) for e in self.events)

    @property
    def last(self) -> int:
        return max(onset(e) for e in self.events)

    @property
    def layers(self) -> list[str]:
        return list(dict.fromkeys(e.layer_name for e in self.events))

    def first_layers(self, event_type: str | None = None) -> list[str]:
        """Layers whose onset is the episode's first (of ``event_type`` when given)."""
        chosen = [e for e in self.events if event_type is None or e.event_type == event_type]
        start = min((onset(e) for e in chosen), default=None)
        return list(dict.fromkeys(e.layer_name for e in chosen if onset(e) == start))

    def active_at(self, step: int) -> bool:
        """True when some layer had entered by ``step`` and not left before it."""
        for e in self.events:
            if onset(e) <= step and not any(x.layer_name == e.layer_name and x.event_type == e.event_type
                                            and e.step < x.step and onset(x) < step for x in self.exits):
                return True
        return False

    @property
    def confidence(self) -> float:
        return max(e.confidence for e in self.events)


def _natural(name: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name))


class Order:
    """Positions of layers in forward execution order (layers that never ran a hook are placed just
    before the next watched layer that did, in model order; layers seen only in events go last)."""

    def __init__(self, execution: Sequence[str], layers: Sequence[str] = (), extra: Iterable[str] = ()) -> None:
        order = list(dict.fromkeys(execution))
        ran = set(order)
        pending: list[str] = []
        for name in layers:
            if name in ran:
                at = order.index(name)
                order[at:at] = pending
                pending = []
            elif name not in order:
                pending.append(name)
        order += pending
        order += sorted((n for n in set(extra) if n not in set(order)), key=_natural)
        self.names = order
        self.pos = {name: i for i, name in enumerate(order)}

    def __call__(self, layer: str) -> int:
        return self.pos.get(layer, len(self.pos))

    def sort(self, layers: Iterable[str]) -> list[str]:
        return sorted(dict.fromkeys(layers), key=self)


def episodes(events: Sequence[SemanticEvent], window: int) -> list[Episode]:
    """Group failure entries into episodes: per kind, an entry joins the current episode when its onset
    is at most ``window`` steps after the last one, or while the episode is still on (a spread)."""
    entries: dict[str, list[SemanticEvent]] = {}
    now: dict[tuple[str, str], str | None] = {}  # (layer, event type) -> the failure kind it is in
    for e in events:
        kind, key = kind_of(e), (e.layer_name, e.event_type)
        if kind is not None and now.get(key) != kind:  # an entry (a re-entry after a recovery too)
            entries.setdefault(kind, []).append(e)
        now[key] = kind
    out: list[Episode] = []
    for kind in KINDS:
        current: Episode | None = None
        for e in sorted(entries.get(kind, ()), key=onset):
            if current is None or (onset(e) - current.last > window and not current.active_at(onset(e))):
                current = Episode(kind)
                out.append(current)
            current.events.append(e)
            _exits(current, events)
    return out


def _exits(ep: Episode, events: Sequence[SemanticEvent]) -> None:
    mine = {(e.layer_name, e.event_type) for e in ep.events}
    ep.exits = [e for e in events if (e.layer_name, e.event_type) in mine and not e.is_failure
                and e.from_state != "UNKNOWN" and e.step > ep.first]


# ---- causal rules: which earlier kind can explain a later one, and what the structure must show ----
def _upstream(cause: Episode, effect: Episode, order: Order) -> bool:
    """Activations flow forward: some cause layer runs no later than the first layer of the effect."""
    return min(map(order, cause.first_layers())) <= min(map(order, effect.first_layers()))


def _blocks_backward(cause: Episode, effect: Episode, order: Order) -> bool:
    """Gradients flow backward: the effect's first layers lie before (upstream of) a cause layer."""
    last_cause = max(map(order, cause.layers))
    firsts = effect.first_layers()
    return sum(order(l) < last_cause for l in firsts) * 2 > len(firsts)


def _anywhere(cause: Episode, effect: Episode, order: Order) -> bool:
    return True


RULES: Mapping[tuple[str, str], tuple[str, object]] = {
    ("shift", "saturation"): ("the activation jump drove the bounded activations into their limits", _upstream),
    ("shift", "dead"): ("the activation jump pushed the units below zero", _upstream),
    ("shift", "exploding"): ("the activation jump scaled the gradients up", _anywhere),
    ("shift", "non_finite"): ("the activations kept growing until they overflowed", _upstream),
    ("exploding", "non_finite"): ("the exploding gradients overflowed", _anywhere),
    ("exploding", "dead"): ("the huge updates pushed the units below zero", _anywhere),
    ("saturation", "vanishing"): ("a saturated activation passes back almost no gradient", _blocks_backward),
    ("dead", "vanishing"): ("dead units pass back no gradient", _blocks_backward),
}


def links(eps: Sequence[Episode], order: Order) -> list[tuple[Episode, Episode, str]]:
    """Every (cause, effect, why) pair the rules allow, checked on time and structure."""
    out = []
    for cause in eps:
        for effect in eps:
            rule = RULES.get((cause.kind, effect.kind))
            if rule is None or cause.first > effect.first or not cause.active_at(effect.first):
                continue
            why, structural = rule
            if structural(cause, effect, order):  # type: ignore[operator]
                out.append((cause, effect, why))
    return out

"""One run's event timeline, whichever tracker it was read back from.

A :class:`Timeline` is what ``compare`` and the ``neuraldbg-track`` command work on: the run's name,
where it came from, its events oldest first, its layers in model order and its step count when the
source knows it. :func:`~neuraldbg_track.sources.load_timeline` builds one from any source.

Only the journal records the watched layers (``run.json``); for a tracker run the layers are those
that have events, in an order rebuilt from the events themselves (:func:`layer_order`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping, Sequence

from .events import FAILURE_STATES, HEALTHY_STATE, SemanticEvent
from .integrations._payload import severity


class TimelineError(ValueError):
    """A run cannot be loaded; the message names the source (and the file and line when it has one)."""


def onset(event: SemanticEvent) -> int:
    """The step the event's new state was first seen (``metadata["onset_step"]``), else its step."""
    value = event.metadata.get("onset_step")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else event.step


def event_key(event: SemanticEvent) -> tuple:
    """What makes an event itself; the same key twice (a retried delivery) is one event."""
    return (event.event_type, event.layer_name, event.step, event.from_state, event.to_state)


def _natural(name: str) -> tuple:
    """``blocks.2.fc`` before ``blocks.10.fc``: digits compare as numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def merge_orders(sequences: Iterable[Sequence[str]]) -> list[str]:
    """One order holding every name of ``sequences`` that keeps each sequence's own order where they
    agree (a topological sort of "a came right before b somewhere"); names no sequence orders
    relative to each other, and cycles, are broken by natural name order."""
    after: dict[str, set[str]] = {}
    indegree: dict[str, int] = {}
    for seq in sequences:
        previous = None
        for name in seq:
            indegree.setdefault(name, 0)
            after.setdefault(name, set())
            if previous is not None and previous != name and name not in after[previous]:
                after[previous].add(name)
                indegree[name] += 1
            previous = name
    out: list[str] = []
    remaining = dict(indegree)
    while remaining:
        ready = [n for n, d in remaining.items() if d == 0] or list(remaining)  # a cycle: take the first name
        name = min(ready, key=_natural)
        out.append(name)
        del remaining[name]
        for nxt in after[name]:
            if nxt in remaining:
                remaining[nxt] -= 1
    return out


def layer_order(events: Iterable[SemanticEvent]) -> list[str]:
    """Layers of ``events`` in model order as far as the events tell: NeuralDbg emits the events of
    one step and type in layer order, so each (step, type) group is an ordered subsequence."""
    groups: dict[tuple[int, str], list[str]] = {}
    for e in events:
        groups.setdefault((e.step, e.event_type), []).append(e.layer_name)
    return merge_orders(groups.values())


@dataclass(frozen=True)
class Timeline:
    """One run: ``events`` oldest first, ``layers`` in model order, ``steps`` (None when unknown).

    ``layers_known`` says whether ``layers`` is the run's watched layers (a journal) or only the
    layers that have events (a tracker). ``info`` holds what the source says about the run.
    """

    name: str
    source: str
    events: tuple[SemanticEvent, ...]
    layers: tuple[str, ...]
    steps: int | None = None
    layers_known: bool = False
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def build(cls, name: str, source: str, events: Iterable[SemanticEvent], layers: Sequence[str] | None = None,
              steps: int | None = None, info: Mapping[str, Any] | None = None) -> "Timeline":
        """Sort ``events`` by step (stable) and complete ``layers`` with any layer only events name."""
        ordered = tuple(sorted(events, key=lambda e: e.step))
        inferred = layer_order(ordered)
        if layers:
            known = list(dict.fromkeys(str(l) for l in layers))
            all_layers = known + [l for l in inferred if l not in set(known)]
        else:
            all_layers = inferred
        return cls(name=str(name), source=source, events=ordered, layers=tuple(all_layers),
                   steps=None if steps is None else int(steps), layers_known=bool(layers), info=dict(info or {}))

    # ---- what the compare logic and the CLI read ----------------------------------------------
    @property
    def event_layers(self) -> list[str]:
        """The layers that have events, in :attr:`layers` order."""
        named = {e.layer_name for e in self.events}
        return [l for l in self.layers if l in named]

    @property
    def last_step(self) -> int | None:
        """The run's last step: ``steps - 1`` when known, else the step of its last event."""
        if self.steps:
            return self.steps - 1
        return max((max(e.step, onset(e)) for e in self.events), default=None)

    @cached_property
    def _finals(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for e in self.events:
            out.setdefault(e.layer_name, {})[e.event_type] = e.to_state
        return out

    def final_states(self) -> dict[str, dict[str, str]]:
        """Each layer's last state per event type, for the layers with events: ``{layer: {type: state}}``."""
        return {layer: dict(states) for layer, states in self._finals.items()}

    def final_state(self, layer: str, event_type: str) -> str | None:
        """``layer``'s last state of ``event_type``: the healthy state when it has no such event but is
        in the run (a healthy start is silent), None when the layer is not in the run."""
        state = self._finals.get(layer, {}).get(event_type)
        if state is not None:
            return state
        return HEALTHY_STATE[event_type] if layer in self.layers else None

    def failure_onsets(self) -> dict[tuple[str, str, str], int]:
        """``{(layer, event_type, state): first onset step}`` for every failure state entered."""
        out: dict[tuple[str, str, str], int] = {}
        for e in self.events:
            if e.is_failure:
                key = (e.layer_name, e.event_type, e.to_state)
                out[key] = min(out.get(key, onset(e)), onset(e))
        return out

    def first_failures(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Per failure kind ``(event_type, state)``, earliest (then worst) first: the first onset step, the
        layer(s) that failed then, and every layer that ever did (model order)."""
        rank = {layer: i for i, layer in enumerate(self.layers)}
        kinds: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for (layer, event_type, state), step in self.failure_onsets().items():
            kinds.setdefault((event_type, state), []).append((layer, step))
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, items in kinds.items():
            items.sort(key=lambda item: rank.get(item[0], len(rank)))
            first = min(step for _, step in items)
            out[kind] = {"step": first, "first_layers": [l for l, step in items if step == first],
                         "layers": [l for l, _ in items]}
        return dict(sorted(out.items(), key=lambda kv: (kv[1]["step"], -severity(kv[0][1]), kv[0])))

    def same_events(self, other: "Timeline") -> bool:
        """True when both hold the same events (every field, metadata included) in the same order
        and agree on the order of the layers that have events; names, sources and steps may differ."""
        return ([e.to_dict() for e in self.events] == [e.to_dict() for e in other.events]
                and self.event_layers == other.event_layers)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "steps": self.steps, "last_step": self.last_step,
                "layers": list(self.layers), "layers_known": self.layers_known,
                "events": [e.to_dict() for e in self.events]}


def is_failure_state(event_type: str, state: str | None) -> bool:
    return state is not None and state in FAILURE_STATES.get(event_type, ())

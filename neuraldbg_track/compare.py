"""Compare run timelines: per (layer, failure state) onsets side by side, final states, a verdict.

``compare([a, b, ...])`` takes :class:`~neuraldbg_track.timeline.Timeline` objects from any source
and never asks where they came from. Runs are labelled A, B, C, ... in the order given; shifts are
measured against run A. Onsets are ``metadata["onset_step"]`` (the first step a state was seen).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .events import HEALTHY_STATE
from .integrations._payload import severity
from .timeline import Timeline, is_failure_state, merge_orders

_VERBS = {("gradient_health", "VANISHING"): ("vanishes", "vanish"),
          ("gradient_health", "EXPLODING"): ("explodes", "explode"),
          ("gradient_health", "NON_FINITE"): ("goes non-finite", "go non-finite"),
          ("gradient_health", "SATURATED"): ("has saturated gradients", "have saturated gradients"),
          ("activation_regime", "SATURATED"): ("saturates", "saturate"),
          ("activation_regime", "DEAD"): ("dies", "die"),
          ("activation_regime", "ANOMALOUS"): ("turns anomalous", "turn anomalous")}
_SHORT = {"gradient_health": "gradient", "activation_regime": "activation"}
MAX_SHIFT_GROUPS = 4
MAX_GROUPS = 3


def kind_label(event_type: str, state: str) -> str:
    """``"gradient VANISHING"``, ``"activation DEAD"``."""
    return f"{_SHORT.get(event_type, event_type)} {state}"


def _verb(event_type: str, state: str, plural: bool = False) -> str:
    forms = _VERBS.get((event_type, state), (f"enters {state}", f"enter {state}"))
    return forms[plural]


def labels_for(n: int) -> list[str]:
    return [chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i in range(n)]


def _names(items: Sequence[str], limit: int = 4) -> str:
    items = list(items)
    if len(items) > limit:
        return ", ".join(items[:limit - 1]) + f" and {len(items) - limit + 1} more"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class OnsetRow:
    """When each run entered ``state`` in ``layer`` (None: never, or the layer is not in that run)."""

    layer: str
    event_type: str
    state: str
    onsets: tuple[int | None, ...]
    in_run: tuple[bool, ...]

    @property
    def status(self) -> str:
        """``same``, ``shifted``, ``only_in`` (some runs with the layer never entered the state) or
        ``layer_missing`` (only one run has the layer: nothing to compare)."""
        present = [o for o, here in zip(self.onsets, self.in_run) if here]
        if len(present) < 2:
            return "layer_missing"
        if any(o is None for o in present):
            return "only_in"
        return "same" if len(set(present)) == 1 else "shifted"

    def shifts(self) -> tuple[int | None, ...]:
        """Each run's onset minus run A's (None where either is missing)."""
        base = self.onsets[0]
        return tuple(None if base is None or o is None else o - base for o in self.onsets)


@dataclass(frozen=True)
class FinalRow:
    """``layer``'s last ``event_type`` state in each run (None: the layer is not in that run)."""

    layer: str
    event_type: str
    states: tuple[str | None, ...]

    @property
    def differs(self) -> bool:
        return len({s for s in self.states if s is not None}) > 1

    @property
    def failing(self) -> bool:
        return any(is_failure_state(self.event_type, s) for s in self.states)


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` finds; ``to_dict()`` is the ``--json`` output."""

    labels: tuple[str, ...]
    timelines: tuple[Timeline, ...]
    layers: tuple[str, ...]
    onsets: tuple[OnsetRow, ...]
    finals: tuple[FinalRow, ...]
    verdict: str

    def run_summary(self, i: int) -> dict[str, Any]:
        t = self.timelines[i]
        firsts = {kind_label(*kind): {"step": v["step"], "first_layers": v["first_layers"], "layers": v["layers"]}
                  for kind, v in t.first_failures().items()}
        return {"label": self.labels[i], "name": t.name, "source": t.source, "steps": t.steps,
                "last_step": t.last_step, "events": len(t.events), "layers": len(t.layers),
                "layers_known": t.layers_known, "first_failures": firsts}

    def to_dict(self) -> dict[str, Any]:
        by_run = lambda values: dict(zip(self.labels, values))  # noqa: E731
        return {
            "runs": [self.run_summary(i) for i in range(len(self.timelines))],
            "layers": list(self.layers),
            "onsets": [{"layer": r.layer, "event_type": r.event_type, "state": r.state, "status": r.status,
                        "onsets": by_run(r.onsets), "shift_vs_A": by_run(r.shifts())} for r in self.onsets],
            "final_states": [{"layer": f.layer, "event_type": f.event_type, "states": by_run(f.states),
                              "differs": f.differs} for f in self.finals],
            "verdict": self.verdict,
        }


def compare(timelines: Sequence[Timeline], labels: Sequence[str] | None = None) -> Comparison:
    """Compare runs (one or more); ``labels`` default to A, B, C, ..."""
    timelines = tuple(timelines)
    if not timelines:
        raise ValueError("compare() needs at least one timeline")
    labels = tuple(labels) if labels is not None else tuple(labels_for(len(timelines)))
    if len(labels) != len(timelines) or len(set(labels)) != len(labels):
        raise ValueError(f"labels={labels!r}; expected {len(timelines)} distinct labels")
    layers = tuple(merge_orders(t.layers for t in timelines))
    rank = {layer: i for i, layer in enumerate(layers)}
    onset_maps = [t.failure_onsets() for t in timelines]
    keys = sorted({k for m in onset_maps for k in m},
                  key=lambda k: (rank[k[0]], k[1] != "gradient_health", -severity(k[2]), k[2]))
    rows = tuple(OnsetRow(layer, et, st, tuple(m.get((layer, et, st)) for m in onset_maps),
                          tuple(layer in t.layers for t in timelines)) for layer, et, st in keys)
    finals = tuple(FinalRow(layer, et, tuple(t.final_state(layer, et) for t in timelines))
                   for layer in layers for et in HEALTHY_STATE)
    verdict = _verdict(timelines, labels, rows, finals)
    return Comparison(labels, timelines, layers, rows, finals, verdict)


# ---- the verdict -------------------------------------------------------------------------------
def _verdict(timelines: Sequence[Timeline], labels: Sequence[str], rows: Sequence[OnsetRow],
             finals: Sequence[FinalRow]) -> str:
    firsts = [t.first_failures() for t in timelines]
    if len(timelines) == 1:
        return _single(timelines[0], firsts[0])
    run = [f"run {label}" for label in labels]
    parts: list[str] = []
    steps = [t.steps for t in timelines]
    if all(n is not None for n in steps) and len(set(steps)) > 1:
        parts.append(", ".join(f"{run[i]} ran {n} steps" for i, n in enumerate(steps)))
    parts += [f"{run[i]} logged no events" for i, t in enumerate(timelines) if not t.events]
    covered = set()  # failure kinds some runs never show: one sentence per kind, not per layer
    for kind in sorted({k for f in firsts for k in f}, key=lambda k: (-severity(k[1]), k)):
        sentence = _kind_sentence(kind, firsts, timelines, run)
        if sentence:
            parts.append(sentence)
            covered.add(kind)
    parts += _shift_sentences(rows, run)
    parts += _only_sentences([r for r in rows if r.status == "only_in" and (r.event_type, r.state) not in covered],
                             run)
    parts += _final_sentences(finals, rows, run)
    parts += _layer_set_sentences(timelines, run)
    if not parts:
        parts = [f"{_names(run)} show the same failures at the same steps and end in the same states"]
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _kind_sentence(kind: tuple[str, str], firsts: Sequence[dict], timelines: Sequence[Timeline],
                   run: Sequence[str]) -> str:
    """"run A explodes at step 812 (layer fc3), run B never does" when some runs never show ``kind``."""
    event_type, state = kind
    have = [i for i, f in enumerate(firsts) if kind in f]
    never = [i for i, f in enumerate(firsts) if kind not in f]
    if not never:  # every run shows it: the per-layer onsets say when
        return ""
    doing = [f"{run[i]} {_verb(event_type, state)} at step {firsts[i][kind]['step']} "
             f"({_layers_phrase(firsts[i][kind]['layers'])})" for i in have]
    end = min(firsts[i][kind]["step"] for i in have)
    stops = [i for i in never if timelines[i].steps is not None and timelines[i].steps <= end]
    tail = "".join(f" ({run[i]} stops at step {timelines[i].steps - 1})" for i in stops)
    verb = "does" if len(never) == 1 else "do"
    return f"{' and '.join(doing)}, {_names([run[i] for i in never])} never {verb}{tail}"


def _layers_phrase(layers: Sequence[str]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else f"{len(layers)} layers, first {layers[0]}"


def _shift_sentences(rows: Sequence[OnsetRow], run: Sequence[str]) -> list[str]:
    groups: dict[tuple, list[str]] = {}
    for r in rows:
        if r.status != "shifted":
            continue
        for i, delta in enumerate(r.shifts()):
            if i and delta:
                groups.setdefault((i, r.event_type, r.state, delta), []).append(r.layer)
    ordered = sorted(groups.items(), key=lambda kv: (-abs(kv[0][3]), kv[0][0]))
    out = []
    for (i, event_type, state, delta), layers in ordered[:MAX_SHIFT_GROUPS]:
        noun = f"layer {layers[0]}" if len(layers) == 1 else f"layers {_names(layers)}"
        out.append(f"{run[i]}'s {noun} {_verb(event_type, state, len(layers) > 1)} {abs(delta)} step"
                   f"{'s' if abs(delta) != 1 else ''} {'later' if delta > 0 else 'earlier'} than {run[0]}'s")
    rest = sum(len(layers) for _, layers in ordered[MAX_SHIFT_GROUPS:])
    if rest:
        out.append(f"{rest} more layer onset{'s' if rest > 1 else ''} shifted")
    return out


def _only_sentences(rows: Sequence[OnsetRow], run: Sequence[str]) -> list[str]:
    groups: dict[tuple, list[OnsetRow]] = {}
    for r in rows:
        have = tuple(i for i, o in enumerate(r.onsets) if o is not None)
        groups.setdefault((r.event_type, r.state, have), []).append(r)
    out = []
    for (event_type, state, have), group in list(groups.items())[:MAX_GROUPS]:
        layers = [r.layer for r in group]
        noun = f"layer {layers[0]}" if len(layers) == 1 else f"layers {_names(layers)}"
        first = min(o for r in group for o in r.onsets if o is not None)
        out.append(f"{noun} {_verb(event_type, state, len(layers) > 1)} only in {_names([run[i] for i in have])} "
                   f"({'from' if len(layers) > 1 or len(have) > 1 else 'at'} step {first})")
    rest = sum(len(group) for group in list(groups.values())[MAX_GROUPS:])
    if rest:
        out.append(f"{rest} more layer failure{'s' if rest > 1 else ''} appear in some runs only")
    return out


def _final_sentences(finals: Sequence[FinalRow], rows: Sequence[OnsetRow], run: Sequence[str]) -> list[str]:
    only = {(r.layer, r.event_type, r.state): r for r in rows if r.status == "only_in"}
    groups: dict[tuple, list[str]] = {}
    for f in finals:
        if f.differs and not _implied(f, only):
            groups.setdefault((f.event_type, f.states), []).append(f.layer)
    out = []
    for (event_type, states), layers in list(groups.items())[:MAX_GROUPS]:
        noun = f"layer {layers[0]} is" if len(layers) == 1 else f"layers {_names(layers)} are"
        where = " but ".join(f"{s} in {run[i]}" for i, s in enumerate(states) if s is not None)
        out.append(f"at the end {noun} {where}")
    rest = sum(len(layers) for _, layers in list(groups.items())[MAX_GROUPS:])
    if rest:
        out.append(f"{rest} more final state{'s' if rest > 1 else ''} differ")
    return out


def _implied(f: FinalRow, only: dict[tuple, OnsetRow]) -> bool:
    """True when the final states differ just because a failure happened in some runs only and
    lasted to the end there (the "only in" sentence already says so)."""
    failing = {s for s in f.states if is_failure_state(f.event_type, s)}
    if len(failing) != 1:
        return False
    state = failing.pop()
    row = only.get((f.layer, f.event_type, state))
    return row is not None and all((s == state) == (o is not None) for s, o in zip(f.states, row.onsets)
                                   if s is not None)


def _layer_set_sentences(timelines: Sequence[Timeline], run: Sequence[str]) -> list[str]:
    known = [i for i, t in enumerate(timelines) if t.layers_known]
    out = []
    for i in known:
        others = set().union(*(timelines[j].layers for j in known if j != i)) if len(known) > 1 else set()
        extra = [l for l in timelines[i].layers if others and l not in others]
        if extra:
            out.append(f"{run[i]} has {len(extra)} layer{'s' if len(extra) > 1 else ''} the others lack "
                       f"({_names(extra)})")
    return out


def _single(t: Timeline, firsts: dict) -> str:
    length = f" in {t.steps} steps" if t.steps is not None else ""
    if not t.events:
        return f"Run {t.name} logged no events{length}."
    if not firsts:
        return f"Run {t.name} has no failures ({len(t.events)} events{length})."
    bits = [f"{kind_label(et, st)} from step {f['step']} ({_layers_phrase(f['layers'])})"
            for (et, st), f in firsts.items()]
    return f"Run {t.name}: " + "; ".join(bits) + "."

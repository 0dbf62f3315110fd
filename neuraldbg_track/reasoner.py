"""The post-mortem reasoner: a run's events -> ranked :class:`CausalHypothesis` objects.

    for h in dbg.explain():          # or explain(events, execution_order), or `neuraldbg-track explain RUN`
        print(f"{h.confidence:.2f}  {h.statement}")

How it reasons (see :mod:`.episodes`): failure entries are grouped into episodes (one failure kind,
close in time); causal rules link an earlier episode to a later one when the order in time and the
model's structure agree (an activation jump upstream of the units that then die or saturate; a
saturated or dead layer downstream of the layers whose gradients vanish; gradients that explode and
then overflow). Each episode nothing explains is a root and becomes one hypothesis, whose chain is
everything it explains. The root layer follows the direction a failure propagates: forward for
activations (the first layer in execution order), backward for vanishing gradients (the first layer
with parameters after the vanishing block, where the gradient is lost), the largest layer (or the
largest gradient) for an explosion.

Confidence, in [0, 1]: ``evidence x consistency``. Evidence is the highest confidence among the
supporting events (how surely the failure was observed, see :mod:`.transitions`); consistency is
``supporting / (supporting + contradicting)`` events, where contradicting events are failures that
began earlier and that the hypothesis does not explain. A run without failures gets one hypothesis,
cause ``"none"``, whose confidence is 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .episodes import ACT, GRAD, KINDS, Episode, Order, episodes, links
from .events import SemanticEvent
from .timeline import onset

#: The causes a hypothesis can name, and what each means.
CAUSES: Mapping[str, str] = {
    "none": "no layer left its healthy state",
    "divergence": "NaN/Inf values in activations or gradients: the run is lost from there on",
    "exploding_gradients": "gradient norms far above the exploding threshold",
    "vanishing_gradients": "gradients too small for the layers before some point to learn",
    "dead_units": "ReLU-type units that output zero for the whole batch",
    "activation_saturation": "bounded activations (tanh, sigmoid) pinned at their limits",
    "activation_shift": "a layer's activation scale jumped away from its own baseline",
    "stuck_gradients": "large gradient norms that stopped varying (gradient SATURATED)",
}
_EFFECT = {"dead": "dead units", "saturation": "saturation", "exploding": "exploding gradients",
           "shift": "activation jumps"}
_CAUSE = {"shift": "activation_shift", "exploding": "exploding_gradients", "non_finite": "divergence",
          "saturation": "activation_saturation", "dead": "dead_units", "stuck": "stuck_gradients",
          "vanishing": "vanishing_gradients"}


@dataclass(frozen=True)
class CausalHypothesis:
    """One explanation of what went wrong: ``statement`` says it in a line; ``cause`` is a key of
    :data:`CAUSES`; ``chain`` lists the episodes from the root to the last effect."""

    statement: str
    cause: str
    root_layer: str | None
    confidence: float
    onset_step: int | None = None
    chain: tuple[str, ...] = ()
    supporting: tuple[SemanticEvent, ...] = ()
    contradicting: tuple[SemanticEvent, ...] = ()

    @property
    def is_failure(self) -> bool:
        return self.cause != "none"

    def to_dict(self) -> dict[str, Any]:
        return {"statement": self.statement, "cause": self.cause, "root_layer": self.root_layer,
                "confidence": self.confidence, "onset_step": self.onset_step, "chain": list(self.chain),
                "supporting": [e.to_dict() for e in self.supporting],
                "contradicting": [e.to_dict() for e in self.contradicting]}

    def __str__(self) -> str:
        return f"[{self.confidence:.2f}] {self.statement}"


def explain(events: Iterable[SemanticEvent], layer_order: Sequence[str] = (), *, layers: Sequence[str] = (),
            sizes: Mapping[str, int] | None = None, window: int = 10) -> list[CausalHypothesis]:
    """Ranked hypotheses (most likely first) for a run's ``events``.

    ``layer_order`` is the forward execution order (``dbg.execution_order``, ``execution_order`` in
    the journal's run.json); ``layers`` all watched layers in model order (placed into it where they
    ran no hook); ``sizes`` the parameter count of each layer that has parameters (enables the
    "largest layer" and "first layer with parameters" rules). Failures of one kind whose onsets lie
    at most ``window`` steps apart form one episode.
    """
    events = sorted(events, key=lambda e: e.step)
    order = Order(layer_order, layers, (e.layer_name for e in events))
    eps = episodes(events, window)
    if not eps:
        return [CausalHypothesis("No failure found: every watched layer stayed in its healthy state.", "none",
                                 None, 1.0, chain=(), supporting=tuple(events))]
    edges = links(eps, order)
    explained = {id(effect) for _, effect, _ in edges}
    out = [_hypothesis(root, eps, edges, order, dict(sizes or {})) for root in eps if id(root) not in explained]
    severity = {c: i for i, c in enumerate(("divergence", "exploding_gradients", "dead_units", "vanishing_gradients",
                                            "activation_saturation"))}
    out.sort(key=lambda h: (-h.confidence, -len(h.supporting), h.onset_step if h.onset_step is not None else 0,
                            severity.get(h.cause, 9)))
    return out


def _descendants(root: Episode, edges: list) -> list[tuple[Episode, str]]:
    found: dict[int, tuple[Episode, str]] = {}
    frontier = [root]
    while frontier:
        current = frontier.pop()
        for cause, effect, why in edges:
            if cause is current and id(effect) not in found and effect is not root:
                found[id(effect)] = (effect, why)
                frontier.append(effect)
    return sorted(found.values(), key=lambda pair: (pair[0].first, KINDS.index(pair[0].kind)))


def _hypothesis(root: Episode, eps: list[Episode], edges: list, order: Order,
                sizes: dict[str, int]) -> CausalHypothesis:
    effects = _descendants(root, edges)
    chain_eps = [root] + [ep for ep, _ in effects]
    kinds = [ep.kind for ep in chain_eps]
    if "non_finite" in kinds:
        cause = "divergence"
    else:
        cause = _CAUSE[next((k for k in kinds if k != "shift"), root.kind)]
    root_layer = root_layer_of(root, order, sizes)
    supporting = tuple(e for ep in chain_eps for e in ep.events)
    members = {id(ep) for ep in chain_eps}
    contradicting = tuple(e for ep in eps if id(ep) not in members for e in ep.events if onset(e) < root.first)
    evidence = max(e.confidence for e in supporting)
    consistency = len(supporting) / (len(supporting) + len(contradicting))
    chain = tuple([f"step {root.first}: {describe(root, order, sizes)}"]
                  + [f"step {ep.first}: {describe(ep, order, sizes)} ({why})" for ep, why in effects])
    statement = _statement(cause, root, [ep for ep, _ in effects], order, sizes)
    return CausalHypothesis(statement, cause, root_layer, round(evidence * consistency, 3), root.first, chain,
                            supporting, contradicting)


def root_layer_of(ep: Episode, order: Order, sizes: Mapping[str, int]) -> str:
    """Where an episode started, following the direction its failure propagates."""
    firsts = order.sort(ep.first_layers())
    if ep.kind == "vanishing":  # lost on the way back: at the first layer with parameters after the block
        block = set(ep.first_layers())
        after = [l for l in order.names if order(l) > order(firsts[-1]) and l in sizes and l not in block]
        return after[0] if after else firsts[-1]
    if ep.kind == "exploding":
        norms = {e.layer_name: _number(e.metadata.get("grad_norm")) for e in ep.events}
        return max(firsts, key=lambda l: (sizes.get(l, 0), norms.get(l, 0.0)))
    if ep.kind == "non_finite":
        acts = order.sort(ep.first_layers(ACT))
        return acts[0] if acts else order.sort(ep.first_layers(GRAD))[-1]
    return firsts[0]


def describe(ep: Episode, order: Order, sizes: Mapping[str, int]) -> str:
    """One episode in a few words: what, where, how much."""
    root = root_layer_of(ep, order, sizes)
    where = _few(order.sort(ep.layers))
    mine = sorted((e for e in ep.events if e.layer_name == root), key=lambda e: e.event_type != ACT)
    first = mine[0] if mine else ep.events[0]  # an activation event first: NaN shows there before the gradient
    md = first.metadata
    spread = _spread(ep, order)
    if ep.kind == "shift":
        text = f"the activations of {root} moved {_ratio(md)} from their baseline"
        others = [l for l in order.sort(ep.layers) if l != root]
        return text + (f", and those of {len(others)} more layer(s) ({_few(others)})" if others else "")
    if ep.kind == "exploding":
        peak = max(_number(e.metadata.get("grad_norm")) for e in ep.events)
        return f"gradients exploded in {len(ep.layers)} layer(s) ({where}), up to {peak:.3g}{spread}"
    if ep.kind == "non_finite":
        what = "activations" if first.event_type == ACT else "gradients"
        return f"NaN/Inf first in the {what} of {root}, then in {len(ep.layers)} layer(s) ({where})"
    if ep.kind == "saturation":
        return f"{root} saturated ({_pct(md.get('saturated_fraction'))} of its outputs at the limits)"
    if ep.kind == "dead":
        return f"{_pct(md.get('dead_fraction'))} of the units of {root} dead"
    if ep.kind == "vanishing":
        low = min(_number(e.metadata.get("grad_norm"), 0.0) for e in ep.events)
        return f"gradients vanished in {len(ep.layers)} layer(s) ({where}), down to {low:.1e}{spread}"
    return f"the gradient norm of {where} stuck at a constant high value"


def _statement(cause: str, root: Episode, effects: list[Episode], order: Order, sizes: Mapping[str, int]) -> str:
    triggered = root.kind == "shift" and bool(effects)
    main = effects[0] if triggered else root  # an activation jump is the trigger, not the failure
    layer = root_layer_of(main, order, sizes)
    md = next(e for e in main.events if e.layer_name == layer).metadata if layer in main.layers else {}
    if cause == "divergence":
        head, rest = _diverged(root, effects, order, sizes), []
    else:
        head, rest = _head(cause, main, layer, md, order, sizes, triggered), [ep for ep in effects if ep is not main]
    if triggered:
        at = root_layer_of(root, order, sizes)
        moved = _ratio(next(e for e in root.events if e.layer_name == at).metadata)
        head += f" after the activations of {at} moved {moved} at step {root.first}"
    for ep in rest:
        if ep.kind == "vanishing":
            head += f"; the gradients of {len(ep.layers)} layer(s) before it vanish"
        elif ep.kind in _EFFECT:
            head += f"; then {_EFFECT[ep.kind]} in {_few(order.sort(ep.layers), 2)} (step {ep.first})"
    if main.exits and {e.layer_name for e in main.exits} >= set(main.layers):
        head += f"; it recovered by step {max(e.step for e in main.exits)}"
    return head + "."


def _head(cause: str, main: Episode, layer: str, md: Mapping[str, Any], order: Order, sizes: Mapping[str, int],
          triggered: bool) -> str:
    n, at = len(main.layers), main.first
    if cause == "exploding_gradients":
        largest = "" if triggered else _largest_note(layer, sizes)
        return f"Gradients explode in {n} layer(s) from step {at}, starting in {layer}{largest}"
    if cause == "vanishing_gradients":
        return (f"Gradients vanish in {n} layer(s) ({_few(order.sort(main.layers))}) from step {at}: "
                f"the gradient is lost passing back through {layer}{_spread(main, order)}")
    if cause == "dead_units":
        return f"{_pct(md.get('dead_fraction'))} of the units of {layer} die at step {at}"
    if cause == "activation_saturation":
        return f"{layer} saturates from step {at} ({_pct(md.get('saturated_fraction'))} of its outputs at the limits)"
    if cause == "activation_shift":
        more = f", and those of {n - 1} more layer(s)" if n > 1 else ""
        return f"The activations of {layer} moved {_ratio(md)} from their baseline at step {at}{more}"
    return f"Gradient norms stopped varying in {_few(order.sort(main.layers))} from step {at}"


def _diverged(root: Episode, effects: list[Episode], order: Order, sizes: Mapping[str, int]) -> str:
    nf = next(ep for ep in [root] + effects if ep.kind == "non_finite")
    boom = next((ep for ep in [root] + effects if ep.kind == "exploding"), None)
    head = f"Training diverged at step {nf.first}: NaN/Inf appeared first in {root_layer_of(nf, order, sizes)}"
    if boom is not None:
        head += f" after gradients exploded from step {boom.first} (starting in {root_layer_of(boom, order, sizes)})"
    return head


def _largest_note(layer: str, sizes: Mapping[str, int]) -> str:
    """A step-size explosion starts where the parameters are most numerous."""
    if len(set(sizes.values())) < 2 or sizes.get(layer, 0) < max(sizes.values()):
        return ""
    return f", the largest layer ({sizes[layer]:,} parameters): a step-size (learning-rate or init scale) explosion"


def _spread(ep: Episode, order: Order) -> str:
    late = [e for e in ep.events if onset(e) > ep.first]
    if not late:
        return ""
    firsts = [order(l) for l in ep.first_layers()]
    later = [order(e.layer_name) for e in late]
    toward = "output" if sum(later) / len(later) > sum(firsts) / len(firsts) else "input"
    return f", spreading toward the {toward} by step {max(onset(e) for e in late)}"


def _ratio(md: Mapping[str, Any]) -> str:
    rms, base = _number(md.get("rms")), _number(md.get("baseline_rms"))
    if rms > 0 and base > 0:
        factor = max(rms / base, base / rms)
        return ("x" if rms >= base else "/") + (f"{factor:,.0f}" if factor >= 10 else f"{factor:.2g}")
    return "far"


def _pct(value: Any) -> str:
    return f"{_number(value):.0%}"


def _number(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _few(items: Sequence[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f", ... (+{len(items) - limit})" if len(items) > limit else "")

"""The post-mortem of a finished or loaded run, as text: what the demo, ``neuraldbg-track explain`` and
the tracker sinks print or log.

:func:`explain_timeline` runs the reasoner on a run read back by
:func:`~neuraldbg_track.sources.load_timeline` (any tracker); :func:`format_hypotheses` renders
ranked hypotheses as plain text or Markdown, one shape for every place they appear.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .reasoner import CausalHypothesis, explain

if TYPE_CHECKING:
    from .timeline import Timeline


def explain_timeline(timeline: "Timeline") -> list[CausalHypothesis]:
    """Hypotheses for a loaded run. A journal records the execution order and layer sizes (run.json);
    for a tracker run the layer order is rebuilt from its events and the size rules are skipped."""
    info = timeline.info or {}
    order = info.get("execution_order") or ()
    sizes = info.get("layer_sizes") or None
    window = 10 * int(info.get("every_n_steps") or 1)
    return explain(timeline.events, list(order), layers=list(timeline.layers), sizes=sizes, window=window)


def format_hypotheses(hypotheses: Sequence[CausalHypothesis], *, markdown: bool = False,
                      limit: int | None = None) -> str:
    """``1. [0.75] statement`` per hypothesis, most likely first, each followed by its chain (and its
    contradicting events, when any); ``markdown`` makes a Markdown list of it."""
    shown = list(hypotheses)[:limit] if limit else list(hypotheses)
    lines: list[str] = []
    for i, h in enumerate(shown, 1):
        root = f" (root: {h.root_layer})" if h.root_layer is not None else ""
        lines.append(f"{i}. [{h.confidence:.2f}] {_md(h.statement, markdown)}{_md(root, markdown)}")
        indent = "    - " if markdown else "     "
        for link in h.chain if len(h.chain) > 1 else ():
            lines.append(indent + _md(link, markdown))
        if h.contradicting:
            against = ", ".join(f"{e.layer_name} {e.to_state} at step {e.step}" for e in h.contradicting[:4])
            more = f" (+{len(h.contradicting) - 4})" if len(h.contradicting) > 4 else ""
            lines.append(indent + _md(f"against: earlier {against}{more}", markdown))
    if len(shown) < len(hypotheses):
        lines.append(f"... {len(hypotheses) - len(shown)} more")
    return "\n".join(lines)


def _md(text: str, markdown: bool) -> str:
    if not markdown:
        return text
    for ch in "\\`*_[]<>|#":
        text = text.replace(ch, "\\" + ch)
    return text


def summary(hypotheses: Sequence[CausalHypothesis]) -> dict[str, Any]:
    """The top hypothesis as flat values (for tags and run summaries)."""
    top = hypotheses[0] if hypotheses else None
    if top is None:
        return {}
    return {"hypothesis": top.statement, "cause": top.cause, "root_layer": top.root_layer or "",
            "confidence": top.confidence, "hypotheses": len(hypotheses)}

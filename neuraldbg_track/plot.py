"""The timeline picture: step on x, layer on y in model order, colour by state, one panel per run.

Each layer's row is split in two: the upper half is its gradient health, the lower half its
activation regime. Grey means watched and healthy; a coloured span runs from the step a failure
state was first seen (``onset_step``) to the next change. Panels share the step axis and the layer
axis (the union of the runs' layers), so the same layer sits at the same height in every panel.
Rows shrink and labels thin out for models with many layers. Headless: no pyplot, no display.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

from .compare import kind_label, labels_for
from .timeline import Timeline, merge_orders, onset

COLOURS = {("gradient_health", "VANISHING"): "#2563eb", ("gradient_health", "EXPLODING"): "#dc2626",
           ("gradient_health", "NON_FINITE"): "#111827", ("gradient_health", "SATURATED"): "#f59e0b",
           ("activation_regime", "DEAD"): "#7c3aed", ("activation_regime", "SATURATED"): "#db2777",
           ("activation_regime", "ANOMALOUS"): "#0d9488"}
OTHER = "#9ca3af"      # a failure state this version does not know
WATCHED = "#eceef1"    # healthy / normal / not yet confirmed
ENDED = "#f9fafb"
WIDTH_IN, DPI = 11.0, 100
ROW_IN, MAX_PANEL_IN, MIN_PANEL_IN = 0.14, 12.0, 1.6
_HALF = {"gradient_health": (-0.42, 0.42), "activation_regime": (0.0, 0.42)}  # (y offset, height); y grows down


def _import_matplotlib():
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError('--plot needs matplotlib: pip install "neuraldbg-track[plot]"') from None
    return Figure, Patch


def _spans(t: Timeline, end: int) -> dict[tuple[str, str, str], list[tuple[int, int]]]:
    """``{(layer, event_type, state): [(start, width), ...]}`` for the failure states of ``t``."""
    tracks: dict[tuple[str, str], list] = {}
    for e in t.events:
        tracks.setdefault((e.layer_name, e.event_type), []).append(e)
    out: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for (layer, event_type), events in tracks.items():
        for e, nxt in zip(events, events[1:] + [None]):
            if not e.is_failure:
                continue
            start = onset(e)
            stop = onset(nxt) if nxt is not None else end
            out.setdefault((layer, event_type, e.to_state), []).append((start, max(stop - start, 0)))
    return out


def plot_timelines(timelines: Sequence[Timeline], path: str | os.PathLike, labels: Sequence[str] | None = None,
                   title: str | None = None) -> Path:
    """Write the picture of ``timelines`` to ``path`` (format from the suffix, e.g. ``.png``)."""
    Figure, Patch = _import_matplotlib()
    labels = list(labels) if labels is not None else labels_for(len(timelines))
    layers = merge_orders(t.layers for t in timelines) or ["(no layers)"]
    row = {layer: i for i, layer in enumerate(layers)}
    ends = [t.last_step + 1 if t.last_step is not None else 1 for t in timelines]
    x_max = max(ends)
    min_width = x_max / 400  # a one-step flap stays visible on a long axis

    n = len(layers)
    panel_in = min(max(ROW_IN * n + 0.6, MIN_PANEL_IN), MAX_PANEL_IN)
    fig = Figure(figsize=(WIDTH_IN, panel_in * len(timelines) + 1.3), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(timelines), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    row_pt = panel_in * 72 / n
    font = min(8.0, 0.8 * row_pt)
    every = max(1, math.ceil(5.0 / font)) if font < 5.0 else 1
    seen: dict[tuple[str, str], None] = {}
    for ax, t, label, end in zip(axes, timelines, labels, ends):
        run_end = end if t.steps is not None else x_max  # length unknown: draw to the axis end
        for layer in t.layers:
            ax.broken_barh([(0, run_end)], (row[layer] - 0.42, 0.84), facecolors=WATCHED, linewidth=0)
        for (layer, event_type, state), spans in _spans(t, run_end).items():
            offset, height = _HALF.get(event_type, (-0.42, 0.84))
            colour = COLOURS.get((event_type, state), OTHER)
            ax.broken_barh([(s, max(w, min_width)) for s, w in spans], (row[layer] + offset, height),
                           facecolors=colour, linewidth=0)
            seen[(event_type, state)] = None
        if run_end < x_max:
            ax.axvspan(run_end, x_max, color=ENDED, hatch="//", edgecolor="#d1d5db", linewidth=0)
            ax.axvline(run_end, color="#6b7280", linewidth=0.8)
        length = f"{t.steps} steps" if t.steps is not None else "length unknown"
        ax.set_title(f"{label}: {t.name}  ({len(t.events)} events, {length}; {t.source})", fontsize=9, loc="left")
        ax.set_xlim(0, x_max)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_yticks(range(0, n, every))
        ax.set_yticklabels(layers[::every], fontsize=font)
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", color="#d1d5db", linewidth=0.5)
        ax.set_axisbelow(True)
    axes[-1].set_xlabel("optimizer step (spans start at the step a state was first seen)", fontsize=8)
    handles = [Patch(facecolor=WATCHED, label="watched, healthy")]
    handles += [Patch(facecolor=COLOURS.get(k, OTHER), label=kind_label(*k)) for k in seen]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=8, frameon=False)
    fig.suptitle(title or "neuraldbg-track: layer states over training (row top half: gradient health, "
                 "bottom half: activation regime)", fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out

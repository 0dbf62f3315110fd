"""``neuraldbg-track``: show one run's event timeline, or compare runs from any tracker.

    neuraldbg-track show RUN [--plot FILE.png] [--json] [--limit N]
    neuraldbg-track compare RUN RUN [RUN ...] [--plot FILE.png] [--json] [--diff-only]
    neuraldbg-track explain RUN [--json]     ranked causal hypotheses (see neuraldbg_track.reasoner)
    neuraldbg-track quality [--only NAME ...] [--set KEY=VALUE ...] [--json]   (see neuraldbg_track.quality)

RUN is a journal file or run directory, a directory holding one run, a TensorBoard log dir, a W&B
offline run dir, ``mlflow:RUN_ID``, ``mlflow:EXPERIMENT/RUN_NAME`` (with ``--tracking-uri``) or
``wandb:ENTITY/PROJECT/RUN_ID``. A run that cannot be read is a one-line error and exit status 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from .compare import Comparison, compare, kind_label
from .events import HEALTHY_STATE, key_statistic
from .sources import load_timeline
from .timeline import Timeline, TimelineError, is_failure_state, onset

PROG = "neuraldbg-track"
_OURS = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "integrations"))


class CliError(Exception):
    """A user mistake: printed as one line, exit status 1."""


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plot", metavar="FILE.png", help="write the timeline picture (PNG, SVG or PDF by suffix)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    common.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI for mlflow: runs "
                        "(default: $MLFLOW_TRACKING_URI, then MLflow's default)")
    parser = argparse.ArgumentParser(prog=PROG, description="Show or compare neuraldbg-track event timelines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{show,compare,explain,quality}")
    show = sub.add_parser("show", parents=[common], help="one run's timeline and summary")
    show.add_argument("run", metavar="RUN")
    show.add_argument("--limit", type=int, default=200, metavar="N", help="events listed (0: all; default 200)")
    cmp = sub.add_parser("compare", parents=[common], help="runs side by side and a verdict")
    cmp.add_argument("runs", metavar="RUN", nargs="+")
    cmp.add_argument("--diff-only", action="store_true", help="list only onsets and final states that differ")
    why = sub.add_parser("explain", help="one run's ranked causal hypotheses")
    why.add_argument("run", metavar="RUN")
    why.add_argument("--json", action="store_true", help="print the hypotheses as JSON")
    why.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI for mlflow: runs")
    sub.add_parser("quality", add_help=False, help="detection quality on the scenario suite (--help: its options)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["quality"]:  # its own options, parsed by the quality command
        from .quality import main as quality
        return quality(argv[1:], prog=f"{PROG} quality")
    args = _parser().parse_args(argv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            timelines = [load_timeline(spec, tracking_uri=args.tracking_uri)
                         for spec in ([args.run] if args.command in ("show", "explain") else args.runs)]
        for w in caught:  # ours only (a truncated journal line, ...), one line each
            if str(w.filename).startswith(_OURS) and issubclass(w.category, UserWarning):
                print(f"{PROG}: warning: {w.message}", file=sys.stderr)
        if args.command == "explain":
            from .postmortem import explain_timeline, format_hypotheses
            hypotheses, t = explain_timeline(timelines[0]), timelines[0]
            print(json.dumps({"run": t.name, "source": t.source, "hypotheses": [h.to_dict() for h in hypotheses]},
                             indent=2) if args.json else f"{t.name}  {t.source}\n{format_hypotheses(hypotheses)}")
            return 0
        if args.command == "compare" and len(timelines) < 2:
            raise CliError("compare needs at least two runs (use show for one)")
        result = compare(timelines)
        plot = _plot(timelines, args.plot) if args.plot else None
        if args.json:
            doc = _show_json(result) if args.command == "show" else result.to_dict()
            print(json.dumps({**doc, "plot": str(plot) if plot else None}, indent=2))
        else:
            console = _console()
            (_render_show(console, result, args.limit) if args.command == "show"
             else _render_compare(console, result, args.diff_only))
            if plot:
                console.print(f"picture: {plot}")
    except (TimelineError, CliError, ImportError) as exc:  # ImportError: a missing extra, named in the message
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `neuraldbg-track show RUN | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


def _plot(timelines: list[Timeline], path: str) -> Path:
    from .plot import plot_timelines

    try:
        return plot_timelines(timelines, path)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot write the picture {path}: {exc}") from None


def _show_json(result: Comparison) -> dict[str, Any]:
    final: dict[str, dict[str, str | None]] = {}
    for f in result.finals:
        final.setdefault(f.layer, {})[f.event_type] = f.states[0]
    return {"run": result.run_summary(0), "final_states": final, "summary": result.verdict,
            "events": [e.to_dict() for e in result.timelines[0].events]}


# ---- rendering (rich) --------------------------------------------------------------------------
def _console():
    try:
        from rich.console import Console
    except ImportError:
        raise CliError('the tables need rich: pip install "neuraldbg-track[rich]" (or use --json)') from None
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120
    return Console(width=wide, highlight=False)


def _state(event_type: str, state: str | None) -> str:
    if state is None:
        return "[dim]—[/]"
    return f"[bold red]{state}[/]" if is_failure_state(event_type, state) else state


def _table(title: str, *columns: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left", title_style="bold")
    for column in columns:
        table.add_column(column, justify="right" if column in ("step", "onset", "conf", "steps", "events",
                                                                "layers", "first onset") else "left")
    return table


def _render_show(console: Any, result: Comparison, limit: int) -> None:
    t = result.timelines[0]
    length = f"{t.steps} steps" if t.steps is not None else "length unknown"
    console.print(f"[bold]{t.name}[/]  {t.source}  ({length}, {len(t.events)} events, {len(t.layers)} layers)")
    shown = t.events if limit <= 0 else t.events[:limit]
    table = _table("Events (step: confirmed; onset: first seen)", "step", "onset", "layer", "event",
                   "transition", "conf", "statistic")
    for e in shown:
        key = key_statistic(e)
        value = "" if key is None else f"{key[1]:.3g}" if isinstance(key[1], float) else str(key[1])
        stat = f"{key[0]}={value}" if key else ""
        table.add_row(str(e.step), str(onset(e)), e.layer_name, e.event_type,
                      f"{e.from_state} → {_state(e.event_type, e.to_state)}", f"{e.confidence:.2f}", stat)
    console.print(table)
    if len(shown) < len(t.events):
        console.print(f"[dim]… {len(t.events) - len(shown)} more events (--limit 0 lists all)[/]")
    firsts = t.first_failures()
    if firsts:
        table = _table("First failure per kind", "kind", "first onset", "first layer(s)", "layers affected")
        for (event_type, state), f in firsts.items():
            table.add_row(f"[bold red]{kind_label(event_type, state)}[/]", str(f["step"]),
                          _few(f["first_layers"]), f"{len(f['layers'])}: {_few(f['layers'])}")
        console.print(table)
    _render_finals(console, result)
    console.print(f"\n[bold]Summary:[/] {result.verdict}")


def _few(items: Sequence[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f", … (+{len(items) - limit})" if len(items) > limit else "")


def _render_finals(console: Any, result: Comparison, diff_only: bool = False) -> None:
    eventful = {e.layer_name for t in result.timelines for e in t.events}
    differing = {f.layer for f in result.finals if f.differs}
    shown = [layer for layer in result.layers if layer in (differing if diff_only else eventful)]
    states = {(f.layer, f.event_type): f.states for f in result.finals}
    if shown:
        single = len(result.labels) == 1
        columns = [kind_label(et, "" if single else label).strip() for et in HEALTHY_STATE for label in result.labels]
        table = _table("Final state per layer", "layer", *columns)
        finals = [t.final_states() for t in result.timelines]
        for layer in shown:
            cells = []
            for et in HEALTHY_STATE:
                row = states[(layer, et)]
                differs = len({s for s in row if s is not None}) > 1
                for state, final in zip(row, finals):
                    cell = _state(et, state) if et in final.get(layer, {}) or state is None else f"[dim]{state}[/]"
                    cells.append(f"[reverse]{cell}[/]" if differs else cell)
            table.add_row(layer, *cells)
        console.print(table)
    quiet = len(result.layers) - len(shown)
    if quiet:
        what = "end in the same state in every run" if diff_only else "no events, healthy/normal throughout"
        console.print(f"[dim]{quiet} other layer(s): {what}[/]")
    if shown and console.is_terminal:
        console.print("[dim]A dim state is implied: the layer has no event of that kind.[/]")


def _render_compare(console: Any, result: Comparison, diff_only: bool) -> None:
    table = _table("Runs", "run", "name", "source", "steps", "events", "layers")
    for i, t in enumerate(result.timelines):
        table.add_row(result.labels[i], t.name, t.source, "?" if t.steps is None else str(t.steps),
                      str(len(t.events)), str(len(t.layers)) + ("" if t.layers_known else " (with events)"))
    console.print(table)
    rows = [r for r in result.onsets if not diff_only or r.status != "same"]
    table = _table("Failure onsets (step a state was first seen; difference vs run A)", "layer", "state",
                   *result.labels, "difference")
    for r in rows:
        cells = ["[dim]n/a[/]" if not here else ("[dim]never[/]" if o is None else str(o))
                 for o, here in zip(r.onsets, r.in_run)]
        table.add_row(r.layer, kind_label(r.event_type, r.state), *cells, _difference(r, result.labels))
    console.print(table)
    if diff_only and len(rows) < len(result.onsets):
        console.print(f"[dim]{len(result.onsets) - len(rows)} identical onsets not listed[/]")
    if not result.onsets:
        console.print("[dim]no failure in any run[/]")
    _render_finals(console, result, diff_only)
    console.print(f"\n[bold]Verdict:[/] {result.verdict}")


def _difference(row: Any, labels: Sequence[str]) -> str:
    if row.status == "same":
        return "[dim]same[/]"
    if row.status == "layer_missing":
        return "[dim]layer in one run only[/]"
    if row.status == "only_in":
        have = [labels[i] for i, o in enumerate(row.onsets) if o is not None]
        return f"[bold magenta]only in {', '.join(have)}[/]"
    shifts = [f"{labels[i]} {d:+d}" for i, d in enumerate(row.shifts()) if i and d]
    return f"[bold yellow]{', '.join(shifts)} steps[/]"


if __name__ == "__main__":
    sys.exit(main())

"""Which sinks are delivered in the background, and :func:`replay` for what a tracker missed.

:func:`prepare_sink` wraps a sink whose class sets ``deliver_in_background = True`` (the tracker
sinks) in a :class:`~neuraldbg_track.sinks.background.BackgroundSink` whose undelivered events go
beside the run's journal; other sinks and plain callables stay synchronous. The journal is the
source of truth: :func:`replay` re-sends a run's undelivered events (or its whole journal) to a sink.
"""
from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .events import SemanticEvent
from .sinks import JsonlSink, Sink, SinkWarning, as_sink, iter_journal
from .sinks.background import UNDELIVERED, BackgroundSink, DeliveryStats
from .sinks.jsonl import journal_path

__all__ = ["BackgroundSink", "DeliveryStats", "ReplayResult", "prepare_sink", "delivery_summary", "replay"]

_NAMES: "weakref.WeakKeyDictionary[JsonlSink, set[str]]" = weakref.WeakKeyDictionary()


def prepare_sink(target: Any, journal: JsonlSink | None) -> Sink:
    """The sink NeuralDbg adds for a user-given sink (``journal`` is the run's journal, or None).

    Tracker sinks (``deliver_in_background = True``) are wrapped in a :class:`BackgroundSink` whose
    undelivered events go beside the journal; other sinks and plain callables stay synchronous. A
    sink's optional ``capture_context()`` is called first, on the caller's thread.
    """
    owner = getattr(target, "_owner", target)
    if callable(getattr(owner, "capture_context", None)):
        owner.capture_context()  # still on the user's thread: e.g. MLflow's thread-local active run
    if isinstance(target, BackgroundSink):  # configured by the user: keep its settings
        wrapped = target
    elif getattr(target, "deliver_in_background", False):
        wrapped = BackgroundSink(target)
    else:
        return as_sink(target)
    if journal is not None:
        wrapped.run_dir = wrapped.run_dir or journal.run_dir
        taken = _NAMES.setdefault(journal, set())  # two sinks of one class: distinct undelivered files
        base, n = wrapped.name, 1
        while wrapped.name in taken:
            n += 1
            wrapped.name = f"{base}-{n}"
        taken.add(wrapped.name)
    return wrapped


def delivery_summary(sinks: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Per-sink delivery counts of the background sinks among ``sinks`` (for run.json)."""
    return {s.name: s.stats.as_dict() for s in sinks if isinstance(s, BackgroundSink)}


@dataclass(frozen=True)
class ReplayResult:
    source: str
    events: int
    delivered: int
    failed: int
    last_error: str | None = None


def replay(source: str | Path, sink: Any, *, only_undelivered: bool = True, name: str | None = None,
           close: bool = True) -> ReplayResult:
    """Re-send a run's events to ``sink``, synchronously, then flush (``close=True``: close) it.

    ``source`` is a run directory (or a file in it). With ``only_undelivered`` the events come from
    ``undelivered-<name>.jsonl`` (``name`` defaults to the sink's name) and those delivered are
    removed from it; otherwise the whole journal is sent. Returns the counts.
    """
    path = Path(source)
    run_dir = path if path.is_dir() else path.parent
    target = sink.sink if isinstance(sink, BackgroundSink) else as_sink(sink)
    if only_undelivered:
        path = run_dir / UNDELIVERED.format(name=name or target.name)
        if not path.is_file():
            others = sorted(p.name for p in run_dir.glob(UNDELIVERED.format(name="*")))
            if others:
                raise FileNotFoundError(f"no {path.name} in {run_dir}; it holds {others}: pass "
                                        "name=<the part after 'undelivered-'> to replay one of them")
            return ReplayResult(str(path), 0, 0, 0)
    else:
        path = journal_path(run_dir)
    events = list(dict.fromkeys(iter_journal(path)))  # the same event listed twice is sent once
    failed: list[SemanticEvent] = []
    error = None
    for event in events:
        try:
            target.emit(event)
        except Exception as exc:
            failed.append(event)
            error = f"{type(exc).__name__}: {exc}"
    try:
        target.close() if close else target.flush()
    except Exception as exc:
        failed, error = events, f"{type(exc).__name__}: {exc}"
    if only_undelivered:
        if failed:
            path.write_text("".join(e.to_json() + "\n" for e in failed), encoding="utf-8")
        else:
            path.unlink()
    if failed:
        warnings.warn(f"neuraldbg-track: replay to {target.name} failed for {len(failed)} of {len(events)} "
                      f"events ({error}); run replay again once the tracker is reachable", SinkWarning, stacklevel=2)
    return ReplayResult(str(path), len(events), len(events) - len(failed), len(failed), error)

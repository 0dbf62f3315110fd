"""The embedded default: a local JSONL journal, one run per directory, no server, no account.

Layout (like ``./mlruns``, ``./wandb`` and ``./runs``, it lives under the working directory)::

    neuraldbg/<run_id>/run.json       run id, start/end time, model class, thresholds, counts
    neuraldbg/<run_id>/events.jsonl   one SemanticEvent per line, oldest first
    neuraldbg/<run_id>/hypotheses.json  the post-mortem at close: ranked causal hypotheses

Each line is written and flushed as the event happens, so a crash (even SIGKILL) leaves a
journal that is valid up to its last complete line. The journal is the source of truth that
tracker sinks can be replayed from.

A journal that cannot be written (directory read-only, disk full) never stops training: the first
``OSError`` is reported once (a :class:`~neuraldbg_track.sinks.SinkWarning`), the journal stops
writing (``error`` says why, ``unwritten`` counts the events it missed) and the events still reach
``dbg.events`` and every other sink.
"""
from __future__ import annotations

import json
import os
import secrets
import time
import warnings
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Iterator

from ..events import SemanticEvent
from .base import Sink, warn_sink

DEFAULT_ROOT = "neuraldbg"
EVENTS_FILE = "events.jsonl"
HYPOTHESES_FILE = "hypotheses.json"
RUN_FILE = "run.json"
MAX_LINE_BYTES = 1 << 20  # a journal line longer than this is refused, not read into memory


class JournalError(ValueError):
    """A journal cannot be read; the message names the file and line."""


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class JsonlSink(Sink):
    """Appends events to ``<root>/<run_id>/events.jsonl`` and keeps ``run.json`` beside it."""

    def __init__(self, root: str | os.PathLike = DEFAULT_ROOT, run_id: str | None = None) -> None:
        self.root = Path(root).absolute()
        self.run_id = run_id or new_run_id()
        self.run_dir = self.root / self.run_id
        self.path = self.run_dir / EVENTS_FILE
        self.count = 0
        self._file = None
        self._info: dict[str, Any] = {"run_id": self.run_id}
        self.error: str | None = None
        """Why the journal stopped writing (the first OSError), or None while it is healthy."""
        self.unwritten = 0
        """Events given to the journal after it failed (they are in ``dbg.events`` and the other sinks)."""

    def open(self, info: dict[str, Any] | None = None) -> None:
        """Create the run directory and its metadata; called on context enter (or first event)."""
        if self._file is not None or self.error is not None:
            return
        self._info.update(_plain(info or {}))
        self._info.setdefault("start_time", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
            self._write_info()
        except OSError as exc:
            self._fail(exc, "open")

    def emit(self, event: SemanticEvent) -> None:
        if self._file is None:
            self.open()
        if self.error is not None:
            self.unwritten += 1
            return
        try:
            self._file.write(event.to_json() + "\n")
            self._file.flush()  # one event = one complete line on disk, whatever happens next
        except OSError as exc:
            self.unwritten += 1
            return self._fail(exc, "write")
        self.count += 1

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                self._fail(exc, "flush")

    def _fail(self, exc: OSError, verb: str) -> None:
        """Stop writing and say so once; a partial last line is what a crash leaves too (readers skip it)."""
        if self.error is not None:
            return
        self.error = f"{verb} {self.path}: {type(exc).__name__}: {exc}"
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # the buffer it could not write is already counted
        msg = (f"neuraldbg-track: the journal cannot be written ({self.error}); training continues, the events "
               "stay in memory (dbg.events) and still reach the other sinks, but this run's journal is "
               "incomplete. Free disk space or point journal=/NEURALDBG_DIR at a writable directory.")
        warn_sink(msg)

    def report(self, hypotheses: Any) -> None:
        """Write the ranked hypotheses to ``hypotheses.json`` and the top one into run.json."""
        if self.error is not None:
            return
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.run_dir / (HYPOTHESES_FILE + ".tmp")
            tmp.write_text(json.dumps([h.to_dict() for h in hypotheses], indent=2), encoding="utf-8")
            os.replace(tmp, self.run_dir / HYPOTHESES_FILE)
        except OSError as exc:
            return self._fail(exc, "report")
        if hypotheses:
            top = hypotheses[0]
            self._info["top_hypothesis"] = {"statement": top.statement, "cause": top.cause,
                                            "root_layer": top.root_layer, "confidence": top.confidence}
        if self._file is None:  # already closed: update run.json now
            self._write_info()

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if self._file is None:
            return
        try:
            self._file.flush()
            self._file.close()
        except OSError as exc:
            return self._fail(exc, "close")
        self._file = None
        self._info.update(_plain(summary or {}))
        self._info.update(end_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), events=self.count)
        try:
            self._write_info()
        except OSError as exc:
            self._fail(exc, "close")

    def _write_info(self) -> None:
        tmp = self.run_dir / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps(self._info, indent=2, sort_keys=True, default=str), encoding="utf-8")
        os.replace(tmp, self.run_dir / RUN_FILE)


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    return {k: (asdict(v) if is_dataclass(v) else v) for k, v in info.items()}


def journal_path(path: str | os.PathLike) -> Path:
    """The events file for a run directory or an events file path."""
    p = Path(path)
    if p.is_dir():
        p = p / EVENTS_FILE
    if not p.is_file():
        raise JournalError(f"no journal at {p}: pass a run directory holding {EVENTS_FILE} or the file itself")
    return p


def iter_journal(path: str | os.PathLike) -> Iterator[SemanticEvent]:
    """Events of a journal, oldest first. A corrupt line raises :class:`JournalError` naming the file
    and line; an incomplete last line (a crash mid-write) is skipped with a warning."""
    p = journal_path(path)
    with open(p, "rb") as f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise JournalError(f"{p}:{number}: line longer than {MAX_LINE_BYTES} bytes; not a journal line")
            if not raw.endswith(b"\n"):
                if raw.strip():
                    warnings.warn(f"{p}:{number}: incomplete last line ignored (the run stopped mid-write)",
                                  stacklevel=2)
                return
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                if not isinstance(record, dict):
                    raise TypeError(f"expected a JSON object with the event's fields, got {type(record).__name__}")
                yield SemanticEvent.from_dict(record)
            except (ValueError, TypeError, KeyError) as exc:
                raise JournalError(f"{p}:{number}: not a valid event ({exc})") from None


def read_journal(path: str | os.PathLike) -> list[SemanticEvent]:
    return list(iter_journal(path))


def read_run_info(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    run_file = (p if p.is_dir() else p.parent) / RUN_FILE
    return json.loads(run_file.read_text(encoding="utf-8")) if run_file.is_file() else {}

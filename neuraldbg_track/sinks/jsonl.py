"""The embedded default: a local JSONL journal, one run per directory, no server, no account.

Layout (like ``./mlruns``, ``./wandb`` and ``./runs``, it lives under the working directory)::

    neuraldbg/<run_id>/run.json       run id, start/end time, model class, thresholds, counts
    neuraldbg/<run_id>/events.jsonl   one SemanticEvent per line, oldest first

Each line is written and flushed as the event happens, so a crash (even SIGKILL) leaves a
journal that is valid up to its last complete line. The journal is the source of truth that
tracker sinks can be replayed from.
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
from .base import Sink

DEFAULT_ROOT = "neuraldbg"
EVENTS_FILE = "events.jsonl"
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

    def open(self, info: dict[str, Any] | None = None) -> None:
        """Create the run directory and its metadata; called on context enter (or first event)."""
        if self._file is not None:
            return
        self._info.update(_plain(info or {}))
        self._info.setdefault("start_time", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._write_info()

    def emit(self, event: SemanticEvent) -> None:
        if self._file is None:
            self.open()
        self._file.write(event.to_json() + "\n")
        self._file.flush()  # one event = one complete line on disk, whatever happens next
        self.count += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if self._file is None:
            return
        self._file.flush()
        self._file.close()
        self._file = None
        self._info.update(_plain(summary or {}))
        self._info.update(end_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), events=self.count)
        self._write_info()

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
                yield SemanticEvent.from_dict(json.loads(raw))
            except (ValueError, TypeError, KeyError) as exc:
                raise JournalError(f"{p}:{number}: not a valid event ({exc})") from None


def read_journal(path: str | os.PathLike) -> list[SemanticEvent]:
    return list(iter_journal(path))


def read_run_info(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    run_file = (p if p.is_dir() else p.parent) / RUN_FILE
    return json.loads(run_file.read_text(encoding="utf-8")) if run_file.is_file() else {}

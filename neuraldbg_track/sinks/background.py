"""A sink wrapper that delivers from one daemon thread, so training never waits on a tracker.

``emit`` only appends to a bounded queue; the worker calls the wrapped sink, retrying with
exponential backoff. Every event ends up counted as delivered or undelivered, never dropped
silently: an event that does not fit in the queue, that failed every retry, or that is still
pending when ``close()`` gives up after ``close_timeout`` seconds, is written to
``<run dir>/undelivered-<sink>.jsonl`` (same line format as ``events.jsonl``) and reported in one
warning; :func:`neuraldbg_track.delivery.replay` re-sends it.

The contract for a wrapped sink: ``emit(event)`` may only buffer; ``flush()`` delivers everything
emitted so far or raises, keeping what it could not send for the next ``flush()``; ``close()``
flushes. An event counts as delivered when a ``flush()`` (or ``close()``) after its ``emit`` returned.
An optional ``abandon()`` is called (from the closing thread, without waiting) when close gives up
on a call that hangs, so the sink can refuse further requests. ``report(hypotheses)`` (the run's
post-mortem, given just before ``close()``) is kept and delivered by the worker, after the queued
events and before the sink's ``close()``.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..events import SemanticEvent
from .base import Sink, as_sink, warn_sink

log = logging.getLogger("neuraldbg_track")
UNDELIVERED = "undelivered-{name}.jsonl"


@dataclass
class DeliveryStats:
    """Where the events given to one background sink are (a snapshot; see ``BackgroundSink.stats``)."""

    sink: str
    received: int = 0
    delivered: int = 0
    undelivered: int = 0
    """Given up on: not in the tracker, listed in ``undelivered_file`` for :func:`replay`."""
    pending: int = 0
    """Queued, or emitted and awaiting the flush that confirms them."""
    retries: int = 0
    reasons: dict = field(default_factory=dict)
    last_error: str | None = None
    undelivered_file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class BackgroundSink(Sink):
    """Delivers to ``sink`` from one daemon thread so ``emit`` never waits on the tracker.

    ``queue_size`` bounds the events waiting (more are marked undelivered at once, never blocking);
    a failing call is retried ``max_attempts`` times, ``backoff`` seconds apart doubling up to
    ``max_backoff``; after a call has failed every attempt, later calls get one attempt each until one
    succeeds. The sink is flushed every ``flush_every`` events, ``flush_interval`` seconds after the
    last flush when idle, and at close. A call running longer than ``call_timeout`` counts the sink as
    hung (new events are marked undelivered); ``close()`` waits at most ``close_timeout`` seconds.
    """

    def __init__(self, sink: Any, *, run_dir: str | Path | None = None, name: str | None = None,
                 queue_size: int = 1000, flush_every: int = 200, flush_interval: float = 2.0,
                 max_attempts: int = 4, backoff: float = 0.25, max_backoff: float = 4.0,
                 call_timeout: float = 60.0, close_timeout: float = 10.0) -> None:
        for key, value in (("queue_size", queue_size), ("flush_every", flush_every), ("max_attempts", max_attempts)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BackgroundSink {key}={value!r}; expected an integer >= 1")
        for key, value in (("flush_interval", flush_interval), ("backoff", backoff), ("max_backoff", max_backoff),
                           ("call_timeout", call_timeout), ("close_timeout", close_timeout)):
            if not isinstance(value, (int, float)) or value < 0 or (key == "flush_interval" and value == 0):
                raise ValueError(f"BackgroundSink {key}={value!r}; expected a number of seconds >= 0 "
                                 "(flush_interval > 0)")
        self.sink = as_sink(sink)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._name = name or self.sink.name
        self.queue_size, self.flush_every, self.flush_interval = queue_size, flush_every, flush_interval
        self.max_attempts, self.backoff, self.max_backoff = max_attempts, backoff, max_backoff
        self.call_timeout, self.close_timeout = call_timeout, close_timeout
        self._cv = threading.Condition()
        self._wake = threading.Event()  # set when close gives up: cuts backoff sleeps short
        self._queue: deque[SemanticEvent] = deque()
        self._inflight: deque[SemanticEvent] = deque()
        self._unconfirmed: list[SemanticEvent] = []
        self._undelivered: list[SemanticEvent] = []
        self._reasons: Counter[str] = Counter()
        self._received = self._delivered = self._retries = 0
        self._last_error: str | None = None
        self._failing = False  # a call failed every attempt: one attempt per call until one succeeds
        self._flush_requested = self._closing = self._abandoned = False
        self._call_started: float | None = None
        self._hypotheses: list | None = None
        self._thread: threading.Thread | None = None
        self._file: Path | None = None

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def _owner(self) -> Any:
        """The user's sink object (``as_sink`` may have adapted it)."""
        return getattr(self.sink, "target", self.sink)

    @property
    def stats(self) -> DeliveryStats:
        with self._cv:
            return DeliveryStats(self._name, self._received, self._delivered, len(self._undelivered),
                                 len(self._queue) + len(self._inflight) + len(self._unconfirmed), self._retries,
                                 dict(self._reasons), self._last_error, str(self._file) if self._file else None)

    # ---- the training thread ------------------------------------------------------------------
    def emit(self, event: SemanticEvent) -> None:
        with self._cv:
            self._received += 1
            if self._closing:
                return self._give_up([event], "emitted after close")
            if self._call_started is not None and time.monotonic() - self._call_started > self.call_timeout:
                return self._give_up([event], f"sink hung for over {self.call_timeout:g} s")
            if len(self._queue) >= self.queue_size:
                return self._give_up([event], f"queue full ({self.queue_size} waiting)")
            self._queue.append(event)
            self._start()
            self._cv.notify()

    def flush(self) -> None:
        """Ask the worker to flush soon; does not wait."""
        with self._cv:
            self._flush_requested = True
            self._cv.notify()

    def report(self, hypotheses: Any) -> None:
        """Keep the post-mortem for the worker to deliver before it closes the sink; does not wait."""
        with self._cv:
            self._hypotheses = list(hypotheses)

    def close(self) -> None:
        """Deliver what is queued, close the sink; wait at most ``close_timeout`` s; report losses."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._start()
            self._cv.notify()
        self._thread.join(self.close_timeout)
        with self._cv:
            hung = self._thread.is_alive()
            if hung:
                self._abandoned = True
                self._wake.set()
            self._give_up([*self._inflight, *self._queue, *self._unconfirmed],  # empty after a clean close
                          f"still pending after close_timeout={self.close_timeout:g} s" if hung
                          else "delivery thread stopped")
            self._inflight.clear(), self._queue.clear(), self._unconfirmed.clear()
            atexit.unregister(self.close)
        abandon = getattr(self._owner, "abandon", None) if hung else None  # optional: stop a stuck sink
        if callable(abandon):
            try:
                abandon()
            except Exception:
                log.exception("neuraldbg-track: %s.abandon() failed", self._name)
        self._report()

    # ---- the worker thread --------------------------------------------------------------------
    def _start(self) -> None:  # caller holds the lock
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"neuraldbg-{self._name}", daemon=True)
            self._thread.start()
            atexit.register(self.close)  # a run left open still reports what did not arrive

    def _run(self) -> None:
        last_flush = time.monotonic()
        try:
            while True:
                with self._cv:
                    while not (self._queue or self._closing or self._flush_requested):
                        due = last_flush + self.flush_interval - time.monotonic()
                        if self._unconfirmed and due <= 0:
                            break
                        self._cv.wait(due if self._unconfirmed else None)
                    if self._abandoned:
                        return
                    for _ in range(min(len(self._queue), self.flush_every)):
                        self._inflight.append(self._queue.popleft())
                    closing = self._closing and not self._queue
                    requested, self._flush_requested = self._flush_requested, False
                while self._inflight:
                    event = self._inflight[0]
                    ok = self._call("emit", event)
                    with self._cv:
                        if self._abandoned:
                            return
                        self._inflight.popleft()
                        self._unconfirmed.append(event) if ok else self._give_up([event], "emit failed")
                if closing:
                    if self._hypotheses is not None:  # best effort: a failed report loses no event
                        failing = self._failing
                        self._call("report", self._hypotheses)
                        self._failing = failing  # and does not cut close()'s retries short
                    self._confirm(self._call("close"))
                    return
                if self._unconfirmed and (requested or len(self._unconfirmed) >= self.flush_every
                                          or time.monotonic() - last_flush >= self.flush_interval):
                    self._confirm(self._call("flush"))
                    last_flush = time.monotonic()
        except Exception as exc:  # a bug here must not lose events silently
            log.exception("neuraldbg-track: delivery thread for %s stopped", self._name)
            with self._cv:
                self._last_error = f"{type(exc).__name__}: {exc}"
                self._give_up([*self._inflight, *self._queue, *self._unconfirmed], "delivery thread crashed")
                self._inflight.clear(), self._queue.clear(), self._unconfirmed.clear()

    def _confirm(self, ok: bool) -> None:
        with self._cv:
            if ok and not self._abandoned:
                self._delivered += len(self._unconfirmed)
                self._unconfirmed.clear()
            elif self._closing and not self._abandoned:
                self._give_up(self._unconfirmed, "final flush failed")
                self._unconfirmed.clear()

    def _call(self, verb: str, *args: Any) -> bool:
        """One sink call with retries; True when it returned. Never raises."""
        delay = self.backoff
        attempts = 1 if self._failing else self.max_attempts
        for attempt in range(1, attempts + 1):
            if self._abandoned:
                return False
            self._call_started = time.monotonic()
            try:
                getattr(self.sink, verb)(*args)
                self._failing = False
                return True
            except Exception as exc:
                with self._cv:
                    first = self._last_error is None
                    self._last_error = f"{type(exc).__name__}: {exc}"
                if first:
                    log.warning("neuraldbg-track: %s.%s() failed (%s); retrying in the background, training "
                                "continues and the journal keeps every event", self._name, verb, self._last_error)
            finally:
                self._call_started = None
            if attempt < attempts:
                self._retries += 1
                self._wake.wait(delay)
                delay = min(delay * 2, self.max_backoff)
        self._failing = True
        return False

    # ---- accounting ---------------------------------------------------------------------------
    def _give_up(self, events: Iterable[SemanticEvent], reason: str) -> None:  # caller holds the lock
        events = list(events)
        self._undelivered.extend(events)
        if events:
            self._reasons[reason] += len(events)

    def _report(self) -> None:
        with self._cv:
            lost, received = list(self._undelivered), self._received
            reasons = ", ".join(f"{n} {why}" for why, n in self._reasons.items())
        if not lost:
            return
        where = "the journal is off (journal=False), so they cannot be replayed"
        if self.run_dir is not None:
            self._file = self.run_dir / UNDELIVERED.format(name=self._name)
            self._file.parent.mkdir(parents=True, exist_ok=True)
            with open(self._file, "a", encoding="utf-8") as f:
                f.writelines(e.to_json() + "\n" for e in lost)
            hint = getattr(self._owner, "replay_hint", None)
            target = hint() if callable(hint) else f"{type(self._owner).__name__}(...)"
            where = (f"they are in the journal and listed in {self._file}; once the tracker is reachable, "
                     f"re-send them with neuraldbg_track.delivery.replay({str(self.run_dir)!r}, {target})")
        msg = (f"neuraldbg-track: {len(lost)} of {received} events were not delivered to {self._name} "
               f"({reasons}; last error: {self._last_error}); {where}")
        warn_sink(msg, stacklevel=2)

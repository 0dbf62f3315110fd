"""Delivery off the training thread: a tracker that is slow, raises or hangs never stalls or fails
training, and every event is delivered or counted, listed beside the journal and replayable."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from neuraldbg_track import NeuralDbg, SemanticEvent, read_journal
from neuraldbg_track.delivery import BackgroundSink, prepare_sink, replay
from neuraldbg_track.sinks import JsonlSink, Sink, SinkWarning, iter_journal, read_run_info
from tests.helpers import regression_data, train
from tests.integrations.trackers import vanishing_sigmoid_mlp

GATE_TIMEOUT_S = 20.0
FAST = dict(backoff=0.001, max_backoff=0.002)  # keep retries quick; the counts are what is tested


def event(i: int) -> SemanticEvent:
    return SemanticEvent("gradient_health", f"layer{i}", step=i, from_state="UNKNOWN", to_state="VANISHING",
                         confidence=0.9, metadata={"grad_norm": 0.0})


def wait_until(condition, timeout: float = 20.0) -> bool:
    """Poll (not a timing assertion): True as soon as ``condition()`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Recorder(Sink):
    """Keeps what it receives; ``gate`` (when given) holds every emit until it is set."""

    deliver_in_background = True

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate, self.entered, self.events, self.closed = gate, threading.Event(), [], False

    def emit(self, e: SemanticEvent) -> None:
        self.entered.set()
        if self.gate is not None and not self.gate.wait(GATE_TIMEOUT_S):
            self.gate.set()  # never opened: a delivery that blocks training fails the test, not hangs it
        self.events.append(e)

    def close(self) -> None:
        self.closed = True


class Raising(Sink):
    deliver_in_background = True

    def __init__(self) -> None:
        self.calls = 0

    def emit(self, e: SemanticEvent) -> None:
        self.calls += 1
        raise ConnectionError("tracker is down")

    def flush(self) -> None:
        raise ConnectionError("tracker is down")


def run_training(tmp_path, sink, steps: int = 6) -> NeuralDbg:
    model = vanishing_sigmoid_mlp()  # 13 events at step 2
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, sinks=[sink], console=False, journal=tmp_path / "nd") as dbg:
        train(model, opt, *regression_data(), steps=steps)
    return dbg


def test_slow_sink_does_not_hold_the_training_step(tmp_path):
    gate = threading.Event()
    slow = Recorder(gate)
    model = vanishing_sigmoid_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, sinks=[slow], console=False, journal=tmp_path / "nd") as dbg:
        train(model, opt, *regression_data(), steps=6)
        (bg,) = [s for s in dbg.sinks.sinks if isinstance(s, BackgroundSink)]
        # every emit has returned to the training loop, yet the sink has finished none of them
        assert len(dbg.events) == 13 and bg.stats.received == 13
        assert slow.events == []
        gate.set()
    assert slow.events == dbg.events == read_journal(dbg.journal_path)
    assert bg.stats.delivered == 13 and bg.stats.undelivered == 0 and slow.closed


def test_raising_sink_training_completes_reported_once_and_replayable(tmp_path, caplog):
    sink = Raising()
    caplog.set_level(logging.WARNING, logger="neuraldbg_track")
    with pytest.warns(SinkWarning) as warned:
        dbg = run_training(tmp_path, BackgroundSink(sink, max_attempts=3, **FAST))
    assert dbg.step_count == 6  # training went on
    journal = read_journal(dbg.journal_path)
    assert journal == dbg.events and len(journal) == 13
    summary = [str(w.message) for w in warned if issubclass(w.category, SinkWarning)]
    assert len(summary) == 1 and "13 of 13 events were not delivered to Raising" in summary[0]
    assert sum("retrying in the background" in r.getMessage() for r in caplog.records) == 1
    assert sink.calls > 13  # the first call was retried
    run_dir = dbg.journal.run_dir
    info = read_run_info(run_dir)["delivery"]["Raising"]
    assert (info["delivered"], info["undelivered"], info["pending"]) == (0, 13, 0) and info["retries"] >= 2
    assert list(iter_journal(run_dir / "undelivered-Raising.jsonl")) == journal

    with pytest.raises(FileNotFoundError, match="undelivered-Raising.jsonl"):
        replay(run_dir, Recorder())  # the sink's own name has no file: the message lists the ones there
    with pytest.warns(SinkWarning, match="failed for 13 of 13"):
        still_down = replay(run_dir, Raising(), name="Raising")
    assert (still_down.events, still_down.delivered, still_down.failed) == (13, 0, 13)
    back = Recorder()
    result = replay(run_dir, back, name="Raising")
    assert (result.events, result.delivered, result.failed) == (13, 13, 0)
    assert back.events == journal and back.closed
    assert not (run_dir / "undelivered-Raising.jsonl").exists()
    assert replay(run_dir, Recorder(), name="Raising").events == 0  # nothing left to send
    everything = Recorder()
    assert replay(run_dir, everything, only_undelivered=False).delivered == 13
    assert everything.events == journal


def test_hanging_sink_close_returns_and_counts_everything_undelivered(tmp_path):
    release = threading.Event()

    class Hanging(Recorder):
        def emit(self, e):
            release.wait()

    sink = Hanging()
    bg = BackgroundSink(sink, close_timeout=0.2)
    closer = threading.Thread(target=run_training, args=(tmp_path, bg))
    with pytest.warns(SinkWarning, match="still pending after close_timeout"):
        closer.start()
        closer.join(60)  # a generous guard only: close() gives up after close_timeout
    try:
        assert not closer.is_alive(), "NeuralDbg.close() did not return while a sink hung"
        stats = bg.stats
        assert (stats.received, stats.delivered, stats.undelivered, stats.pending) == (13, 0, 13, 0)
        run_dir = tmp_path / "nd" / next(p.name for p in (tmp_path / "nd").iterdir())
        assert len(list(iter_journal(run_dir / "undelivered-Hanging.jsonl"))) == 13
        assert len(read_journal(run_dir)) == 13
    finally:
        release.set()
    bg._thread.join(10)
    assert bg.stats.delivered == 0 and not sink.closed  # the abandoned worker changed nothing


def test_call_timeout_marks_new_events_undelivered_while_a_call_hangs():
    release = threading.Event()
    sink = Recorder(release)
    bg = BackgroundSink(sink, call_timeout=0.05, close_timeout=5)
    bg.emit(event(0))
    assert sink.entered.wait(10)
    time.sleep(0.1)  # longer than call_timeout: the sink now counts as hung
    bg.emit(event(1))
    assert bg.stats.reasons == {"sink hung for over 0.05 s": 1}
    release.set()
    with pytest.warns(SinkWarning, match="1 of 2 events"):
        bg.close()
    assert sink.events == [event(0)] and bg.stats.delivered == 1


def test_full_queue_never_blocks_and_lists_what_did_not_fit(tmp_path):
    gate = threading.Event()
    sink = Recorder(gate)
    bg = BackgroundSink(sink, queue_size=2, run_dir=tmp_path)
    bg.emit(event(0))
    assert sink.entered.wait(10)  # the worker holds event 0
    for i in range(1, 10):
        bg.emit(event(i))  # returns at once: 1 and 2 are queued, the rest overflow
    assert bg.stats.reasons == {"queue full (2 waiting)": 7}
    gate.set()
    with pytest.warns(SinkWarning, match="7 of 10 events"):
        bg.close()
    assert sink.events == [event(i) for i in range(3)]
    assert list(iter_journal(tmp_path / "undelivered-Recorder.jsonl")) == [event(i) for i in range(3, 10)]
    assert (bg.stats.delivered, bg.stats.undelivered) == (3, 7)


def test_failed_calls_are_retried_with_backoff(recwarn):
    class Flaky(Recorder):
        failures = 2

        def emit(self, e):
            if self.failures:
                self.failures -= 1
                raise TimeoutError("busy")
            super().emit(e)

    sink = Flaky()
    bg = BackgroundSink(sink, **FAST)
    for i in range(5):
        bg.emit(event(i))
    bg.close()
    assert sink.events == [event(i) for i in range(5)]
    assert (bg.stats.delivered, bg.stats.undelivered, bg.stats.retries) == (5, 0, 2)
    assert not [w for w in recwarn if issubclass(w.category, SinkWarning)]


def test_events_count_as_delivered_only_once_a_flush_succeeds():
    class Buffering(Recorder):
        up = False

        def flush(self):
            if not self.up:
                raise ConnectionError("server down")

    sink = Buffering()
    bg = BackgroundSink(sink, flush_interval=0.01, max_attempts=1)
    for i in range(3):
        bg.emit(event(i))
    bg.flush()
    assert wait_until(lambda: bg.stats.last_error is not None)  # a flush was tried and failed
    assert (bg.stats.delivered, bg.stats.pending) == (0, 3)
    sink.up = True
    assert wait_until(lambda: bg.stats.delivered == 3)
    bg.close()
    assert bg.stats.undelivered == 0


def test_prepare_sink_wraps_tracker_sinks_only(tmp_path):
    journal = JsonlSink(tmp_path)
    seen = []
    plain = prepare_sink(seen.append, journal)
    plain.emit(event(0))
    assert seen == [event(0)] and not isinstance(plain, BackgroundSink)  # synchronous
    first, second = prepare_sink(Recorder(), journal), prepare_sink(Recorder(), journal)
    assert isinstance(first, BackgroundSink) and first.run_dir == journal.run_dir
    assert (first.name, second.name) == ("Recorder", "Recorder-2")  # distinct undelivered files
    mine = BackgroundSink(Recorder(), queue_size=5)
    assert prepare_sink(mine, journal) is mine and mine.run_dir == journal.run_dir
    for sink in (first, second, mine):
        sink.close()

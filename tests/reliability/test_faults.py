"""Fault injection through real tiny training: training completes (or stops with the user's own
exception), no event is lost between what was produced, the journal and each tracker (after replay)."""
from __future__ import annotations

import json
import re
import warnings

import pytest

from neuraldbg_track import reliability as rel
from neuraldbg_track.delivery import BackgroundSink
from neuraldbg_track.sinks import SinkWarning, read_journal, read_run_info
from neuraldbg_track.sources import load_timeline

FAST = {"backoff": 0.001, "max_backoff": 0.002}


def _journal_lines_valid(path) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    for line in lines:
        assert isinstance(json.loads(line), dict)
    return len(lines)


def test_raising_tracker_loses_nothing_after_replay(tmp_path):
    r = rel.run_fault("raise", tmp_path, {"raising": BackgroundSink(rel.RaisingTracker(), **FAST),
                                          "healthy": rel.Tracker()})
    assert r.training == "completed" and r.produced == r.journal > 0
    assert r.delivered == {"raising": 0, "healthy": r.produced}
    assert r.after_replay == {"raising": r.produced, "healthy": r.produced}
    assert r.ok


def test_hanging_tracker_close_is_bounded_and_replay_delivers_all(tmp_path):
    hanging = rel.HangingTracker()
    r = rel.run_fault("hang", tmp_path, {"hanging": BackgroundSink(hanging, close_timeout=0.2),
                                         "healthy": rel.Tracker()})
    assert hanging.abandoned  # close gave up after close_timeout instead of waiting on the call
    assert r.training == "completed" and r.delivered["hanging"] == 0 and r.delivered["healthy"] == r.produced
    assert r.after_replay["hanging"] == r.produced and r.ok


def test_slow_tracker_receives_everything_without_replay(tmp_path):
    r = rel.run_fault("slow", tmp_path, {"slow": BackgroundSink(rel.SlowTracker(0.01), close_timeout=120.0)})
    assert r.delivered == {"slow": r.produced} and r.journal == r.produced > 0 and r.ok
    assert not list(r.dbg.journal.run_dir.glob("undelivered-*.jsonl"))


def _journal_warnings(caught):
    return [w for w in caught if issubclass(w.category, SinkWarning)]


def test_unwritable_journal_directory_is_reported_once_and_training_goes_on(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the journal directory should be")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = rel.run_fault("ro", tmp_path, {"healthy": rel.Tracker()}, journal=blocker / "nd", journal_expected=0)
    reported = _journal_warnings(caught)
    assert len(reported) == 1 and "journal cannot be written" in str(reported[0].message)
    assert r.training == "completed" and r.produced > 0 and r.journal == 0
    assert r.dbg.journal.error and r.dbg.journal.unwritten == r.produced
    assert r.delivered == {"healthy": r.produced} and r.dbg.sinks.failures == {} and r.ok


def test_full_disk_keeps_complete_lines_reports_once_and_feeds_other_sinks(tmp_path):
    journal = rel.FullDiskJournal(tmp_path / "nd", room=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = rel.run_fault("full", tmp_path, {"healthy": rel.Tracker()}, journal=journal, journal_expected=3)
    reported = _journal_warnings(caught)
    assert len(reported) == 1 and "No space left on device" in str(reported[0].message)
    assert r.training == "completed" and r.delivered == {"healthy": r.produced} and r.produced > 3
    assert journal.count == 3 and journal.unwritten == r.produced - 3
    with pytest.warns(UserWarning, match="incomplete last line ignored"):  # the half line the full disk left
        kept = read_journal(journal.path)
    assert kept == r.dbg.events[:3] and r.ok


@pytest.mark.parametrize("exc", [RuntimeError("loss exploded"), KeyboardInterrupt()])
def test_exception_in_the_loop_removes_hooks_flushes_journal_and_trackers(tmp_path, exc):
    r = rel.run_fault("exc", tmp_path, {"healthy": rel.Tracker()}, fail=rel._raise_at(4, exc))
    assert r.training == f"stopped by {type(exc).__name__}"
    assert r.hooks_left == 0
    assert _journal_lines_valid(r.dbg.journal_path) == r.produced > 0
    assert read_run_info(r.dbg.journal_path)["status"] == f"stopped by {type(exc).__name__}"
    assert r.trackers["healthy"].closed and r.delivered == {"healthy": r.produced} and r.ok


def test_sigkill_leaves_a_journal_valid_up_to_its_last_complete_line(tmp_path):
    r = rel.sigkill(tmp_path)
    assert r.training == "killed (rc -9)" and r.problems == []
    assert r.journal == r.produced > 0 and r.ok
    path = next(tmp_path.rglob("events.jsonl"))
    with pytest.warns(UserWarning, match="incomplete last line ignored"):
        timeline = load_timeline(path.parent)  # the CLI's loader
    assert len(timeline.events) == r.produced


def test_report_prints_every_fault_meeting_the_targets(capsys):
    assert rel.main([]) == 0
    out = capsys.readouterr().out
    assert "9 of 9 faults meet the targets" in out and "TARGET MISSED" not in out
    assert "SIGKILL" in out and "journal disk full" in out
    # the real mlflow server row: some events missed while it was down, all there after replay
    (row,) = [line for line in out.splitlines() if line.startswith("mlflow server killed")]
    produced, journal, before, after = map(int, re.findall(r"(\d+)(?: |$)", row.split("completed")[1])[:4])
    assert produced == journal == after > before > 0

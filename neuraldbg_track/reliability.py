"""Fault injection with figures: ``python -m neuraldbg_track.reliability`` runs a tiny real training
under each fault and prints, per fault, whether training completed, the events produced, those in the
journal, those each tracker received, and each tracker's count after :func:`~neuraldbg_track.delivery.replay`.

Faults: a tracker that raises on every call, one that hangs, one that is slow; the journal's directory
unwritable, its disk full; an exception and a ``KeyboardInterrupt`` inside the training loop; the
process killed with SIGKILL; a real ``mlflow server`` killed mid-run and restarted (reliability_mlflow).
``tests/reliability`` asserts the same scenarios.
"""
from __future__ import annotations

import errno
import importlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .debugger import NeuralDbg
from .delivery import BackgroundSink, replay
from .events import SemanticEvent
from .sinks import JsonlSink, Sink, read_journal

STEPS = 6
CHILD_TIMEOUT_S = 180.0  # a loaded CI machine imports torch slowly; this bounds a hung child only


class Tracker(Sink):
    """A healthy tracker: keeps what it receives (delivered once the background flush returns)."""

    deliver_in_background = True

    def __init__(self) -> None:
        self.events: list[SemanticEvent] = []
        self.closed = False

    def emit(self, event: SemanticEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        self.closed = True


class RaisingTracker(Tracker):
    """Every call fails, as a tracker whose server is down."""

    def emit(self, event: SemanticEvent) -> None:
        raise ConnectionError("tracker is down")

    def flush(self) -> None:
        raise ConnectionError("tracker is down")


class HangingTracker(Tracker):
    """The first call never returns until ``abandon()`` (what ``BackgroundSink.close`` calls when it gives up)."""

    def __init__(self, limit_s: float = 60.0) -> None:
        super().__init__()
        self.release, self.abandoned, self.limit_s = threading.Event(), False, limit_s

    def emit(self, event: SemanticEvent) -> None:
        self.release.wait(self.limit_s)  # bounded so a broken close cannot leave the thread forever
        raise ConnectionError("request abandoned")

    def abandon(self) -> None:
        self.abandoned = True
        self.release.set()


class SlowTracker(Tracker):
    """Each call takes ``delay_s``: delivery lags behind training but completes."""

    def __init__(self, delay_s: float = 0.02) -> None:
        super().__init__()
        self.delay_s = delay_s

    def emit(self, event: SemanticEvent) -> None:
        time.sleep(self.delay_s)
        super().emit(event)


class _FullFile:
    """A journal file on a disk that fills up after ``room`` lines: writes then raise ENOSPC."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, text: str) -> int:
        if self.room <= 0:
            self.file.write(text[: len(text) // 2])  # what a full disk leaves: part of a line
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= 1
        return self.file.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, close: the real file's
        return getattr(self.file, name)


class FullDiskJournal(JsonlSink):
    """A :class:`JsonlSink` whose disk is full after ``room`` events."""

    def __init__(self, root: str | os.PathLike, room: int = 3) -> None:
        super().__init__(root)
        self.room = room

    def open(self, info: dict[str, Any] | None = None) -> None:
        super().open(info)
        if self._file is not None and not isinstance(self._file, _FullFile):
            self._file = _FullFile(self._file, self.room)


def vanishing_mlp() -> nn.Sequential:
    """12 sigmoid layers, the last saturated: 13 events at step 2 (every Linear vanishes, one saturates)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    widths = [16] + [32] * 12 + [1]
    for i in range(len(widths) - 1):
        layers += [nn.Linear(widths[i], widths[i + 1])] + ([nn.Sigmoid()] if i < len(widths) - 2 else [])
    model = nn.Sequential(*layers)
    with torch.no_grad():
        model[22].bias.fill_(-30.0)
    return model


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = STEPS,
          fail: Callable[[int], None] | None = None) -> None:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 16, generator=g), torch.randn(256, 1, generator=g)
    for i in range(steps):
        loss = nn.functional.mse_loss(model(x[i * 32:(i + 1) * 32]), y[i * 32:(i + 1) * 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if fail is not None:
            fail(i)


def hook_count(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Hooks left on the model and optimizer (0 once NeuralDbg has closed)."""
    return (sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
            + len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks))


@dataclass
class FaultResult:
    fault: str
    training: str  # "completed" or "stopped by <Exception>" when the loop itself raised (as it should)
    produced: int
    journal: int
    delivered: dict[str, int] = field(default_factory=dict)
    after_replay: dict[str, int] = field(default_factory=dict)
    hooks_left: int = 0
    journal_expected: int | None = None  # fewer than produced only where the journal itself is the fault
    problems: list[str] = field(default_factory=list)
    dbg: Any = None
    trackers: dict[str, Tracker] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        expected = self.produced if self.journal_expected is None else self.journal_expected
        return (not self.problems and self.produced > 0 and self.journal == expected and self.hooks_left == 0
                and all(n == self.produced for n in self.after_replay.values()))


def run_fault(fault: str, root: str | os.PathLike, trackers: dict[str, Any], *, journal: Any = None,
              fail: Callable[[int], None] | None = None, journal_expected: int | None = None) -> FaultResult:
    """Train under ``fault`` with ``trackers`` ({name: sink or BackgroundSink}) beside the journal;
    replay what each missed from the journal into a fresh :class:`Tracker`; count everything."""
    root = Path(root)
    model = vanishing_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = NeuralDbg(model, opt, sinks=list(trackers.values()), console=False,
                    journal=root / "nd" if journal is None else journal)
    training = "completed"
    try:
        with dbg:
            train(model, opt, fail=fail)
    except (RuntimeError, KeyboardInterrupt) as exc:  # what the faults inject; anything else is a bug
        training = f"stopped by {type(exc).__name__}"
    produced = len(dbg.events) + dbg.dropped_events
    path = dbg.journal_path
    journal_events = read_journal(path) if path is not None and path.is_file() else []
    result = FaultResult(fault, training, produced, len(journal_events), hooks_left=hook_count(model, opt),
                         journal_expected=journal_expected, dbg=dbg)
    background = [s for s in dbg.sinks.sinks if isinstance(s, BackgroundSink)]
    for name, sink in trackers.items():
        bg = next(s for s in background if s is sink or s._owner is sink)
        owner = result.trackers[name] = bg._owner
        got = set(owner.events)
        result.delivered[name] = len(got)
        if bg.stats.undelivered and path is not None and path.is_file():
            receiver = Tracker()
            replay(path.parent, receiver, name=bg.name)
            got |= set(receiver.events)
        result.after_replay[name] = len(got & set(dbg.events))
    return result


def _raise_at(step: int, exc: BaseException) -> Callable[[int], None]:
    def fail(i: int) -> None:
        if i == step:
            raise exc
    return fail


def scenarios(root: Path) -> list[Callable[[], FaultResult]]:
    fast = {"backoff": 0.001, "max_backoff": 0.002}
    blocker = root / "blocker"  # a file where the journal's directory should be: mkdir fails
    return [
        lambda: run_fault("tracker raises on every call", root / "raise",
                          {"raising": BackgroundSink(RaisingTracker(), **fast), "healthy": Tracker()}),
        lambda: run_fault("tracker hangs (close_timeout=0.5 s)", root / "hang",
                          {"hanging": BackgroundSink(HangingTracker(), close_timeout=0.5), "healthy": Tracker()}),
        lambda: run_fault("tracker slow (20 ms a call)", root / "slow",
                          {"slow": BackgroundSink(SlowTracker(), close_timeout=120.0), "healthy": Tracker()}),
        lambda: (blocker.write_text("not a directory"),
                 run_fault("journal directory unwritable", root / "ro", {"healthy": Tracker()},
                           journal=blocker / "nd", journal_expected=0))[1],
        lambda: run_fault("journal disk full after 3 events", root / "full", {"healthy": Tracker()},
                          journal=FullDiskJournal(root / "full" / "nd", room=3), journal_expected=3),
        lambda: run_fault("exception in the training loop", root / "exc", {"healthy": Tracker()},
                          fail=_raise_at(4, RuntimeError("loss exploded"))),
        lambda: run_fault("KeyboardInterrupt in the loop", root / "kbd", {"healthy": Tracker()},
                          fail=_raise_at(4, KeyboardInterrupt())),
        lambda: sigkill(root / "kill"),
    ] + ([lambda: importlib.import_module(f"{__package__}.reliability_mlflow").mlflow_server_restart(root / "mlflow")]
         if importlib.util.find_spec("mlflow") else [])  # a real mlflow server killed and restarted


def sigkill(root: Path) -> FaultResult:
    """A child trains, journals its events, starts a line it never finishes, then is SIGKILLed."""
    root.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-m", "neuraldbg_track.reliability", "--child", str(root)],
                             stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        line = child.stdout.readline()  # "READY <produced> <journal path>" once the journal is written
        if not line.startswith("READY"):
            raise RuntimeError(f"the child training did not start (said {line!r})")
        child.send_signal(signal.SIGKILL)
        child.wait(CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    _, produced, path = line.split(maxsplit=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = read_journal(path.strip())
    truncated = any("incomplete last line" in str(w.message) for w in caught)
    return FaultResult("SIGKILL mid-run (truncated last line)", f"killed (rc {child.returncode})", int(produced),
                       len(events), problems=[] if truncated else ["the reader did not warn of the truncated tail"])


def _child(root: str) -> None:
    model = vanishing_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, console=False, journal=root) as dbg:
        train(model, opt)
        with open(dbg.journal_path, "a", encoding="utf-8") as f:  # the kill lands mid-write
            f.write('{"event_type": "gradient_health", "layer_na')
        print("READY", len(dbg.events), dbg.journal_path, flush=True)
        time.sleep(CHILD_TIMEOUT_S)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        _child(args[1])
        return 0
    warnings.simplefilter("ignore")  # each fault warns by design; the table is the report
    logging.getLogger("neuraldbg_track").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="neuraldbg-reliability-") as tmp:
        results = [scenario() for scenario in scenarios(Path(tmp))]
    head = f"{'fault':<38} {'training':<30} {'produced':>8} {'journal':>7}  trackers: delivered -> after replay"
    print(head)
    print("-" * len(head))
    for r in results:
        trackers = ", ".join(f"{n} {r.delivered[n]} -> {r.after_replay[n]}" for n in r.delivered) or "-"
        print(f"{r.fault:<38} {r.training:<30} {r.produced:>8} {r.journal:>7}  {trackers}"
              f"{'' if r.ok else '   <-- TARGET MISSED'}")
    missed = [r.fault for r in results if not r.ok]
    print(f"\n{len(results) - len(missed)} of {len(results)} faults meet the targets"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

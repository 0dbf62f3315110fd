"""Prints each event as one readable line while training runs (rich colours when installed)."""
from __future__ import annotations

import sys
from typing import TextIO

from ..events import SemanticEvent, key_statistic
from .base import Sink

def format_event(event: SemanticEvent) -> str:
    key = key_statistic(event)
    stat = f"{key[0]}={_num(key[1])}" if key else ""
    return (f"step {event.step:>6}  {event.layer_name:<24} {event.event_type:<17} "
            f"{event.from_state} -> {event.to_state}  conf={event.confidence:.2f}  {stat}").rstrip()


def _num(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class ConsoleSink(Sink):
    """One line per event on ``stream`` (stderr by default), red for failures, green for recoveries."""

    def __init__(self, stream: TextIO | None = None, color: bool | None = None) -> None:
        self.stream = stream
        self._console = None
        try:
            from rich.console import Console  # optional: plain text without rich
        except ImportError:
            return
        self._console = Console(file=stream or sys.stderr, highlight=False,
                                no_color=color is False, force_terminal=color or None)

    def emit(self, event: SemanticEvent) -> None:
        line = "[neuraldbg] " + format_event(event)
        if self._console is not None:
            from rich.markup import escape
            style = "bold red" if event.is_failure else "green"
            self._console.print(escape(line), style=style, soft_wrap=True)
        else:
            stream = self.stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()

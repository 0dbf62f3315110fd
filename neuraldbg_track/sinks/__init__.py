"""Where events go: the sink interface, the fan-out, the JSONL journal and the console."""
from .base import FanOut, Sink, SinkWarning, as_sink
from .console import ConsoleSink, format_event
from .jsonl import JournalError, JsonlSink, iter_journal, read_journal, read_run_info

__all__ = ["Sink", "FanOut", "SinkWarning", "as_sink", "ConsoleSink", "format_event", "JsonlSink",
           "JournalError", "iter_journal", "read_journal", "read_run_info"]

"""neuraldbg-track: what went wrong, where and when, in the trackers you already use."""
from .config import ConfigError, Thresholds, WatchConfig
from .debugger import NeuralDbg
from .events import ActivationRegime, EventType, GradientHealth, SemanticEvent, UNKNOWN
from .sinks import ConsoleSink, FanOut, JsonlSink, Sink, read_journal

__all__ = ["NeuralDbg", "SemanticEvent", "EventType", "GradientHealth", "ActivationRegime", "UNKNOWN",
           "Thresholds", "WatchConfig", "ConfigError", "Sink", "FanOut", "JsonlSink", "ConsoleSink",
           "read_journal"]
__version__ = "0.1.0"

"""neuraldbg-track: what went wrong, where and when, in the trackers you already use."""
from pathlib import Path as _Path

# Installed, ``integrations/`` and ``conf/`` are mapped to ``neuraldbg_track.integrations`` and
# ``neuraldbg_track.conf`` (see pyproject.toml). When this package is imported straight from a source
# checkout (``python -m pytest`` in the repository root puts it first on sys.path), let those two
# subpackages resolve from the checkout as well.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "integrations" / "__init__.py").is_file() and (_checkout / "conf" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # type: ignore[name-defined]
from .config import ConfigError, Thresholds, WatchConfig
from .debugger import NeuralDbg
from .events import ActivationRegime, EventType, GradientHealth, SemanticEvent, UNKNOWN
from .sinks import ConsoleSink, FanOut, JsonlSink, Sink, read_journal

__all__ = ["NeuralDbg", "SemanticEvent", "EventType", "GradientHealth", "ActivationRegime", "UNKNOWN",
           "Thresholds", "WatchConfig", "ConfigError", "Sink", "FanOut", "JsonlSink", "ConsoleSink",
           "read_journal"]
__version__ = "0.1.0"

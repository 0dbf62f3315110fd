"""neuraldbg-track: what went wrong, where and when, in the trackers you already use."""
from pathlib import Path as _Path

# Installed, ``integrations/`` and ``conf/`` are mapped to ``neuraldbg_track.integrations`` and
# ``neuraldbg_track.conf`` (see pyproject.toml). In a source checkout (``python -m pytest`` from the
# repository root, or a strict editable install whose link tree lacks files added since) resolve every
# submodule from the checkout itself: the real package directory first, then the repository root.
_here = _Path(__file__).resolve().parent
_checkout = _here.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "integrations" / "__init__.py").is_file():
    for _p in (str(_checkout), str(_here)):
        if _p in __path__:  # type: ignore[name-defined]
            __path__.remove(_p)  # type: ignore[name-defined]
        __path__.insert(0, _p)  # type: ignore[name-defined]

from .config import ConfigError, Thresholds, WatchConfig
from .debugger import NeuralDbg
from .events import ActivationRegime, EventType, GradientHealth, SemanticEvent, UNKNOWN
from .sinks import ConsoleSink, FanOut, JsonlSink, Sink, read_journal

__all__ = ["NeuralDbg", "SemanticEvent", "EventType", "GradientHealth", "ActivationRegime", "UNKNOWN",
           "Thresholds", "WatchConfig", "ConfigError", "Sink", "FanOut", "JsonlSink", "ConsoleSink",
           "read_journal"]
__version__ = "0.1.0"

"""TensorBoard: a Markdown line per event, per-layer scalars, and a custom-scalars layout.

``TensorBoardSink()`` writes like ``SummaryWriter()`` does (``runs/<date>_<host>`` under the
working directory), ``TensorBoardSink(log_dir=...)`` where you say, and ``TensorBoardSink(
writer=w)`` into your own writer (then it flushes but does not close it). All at the event's step:

* text ``<prefix>/events``: one Markdown table row per event (step, layer, transition, confidence,
  key statistic), layer names and metadata escaped;
* ``<prefix>/event_json``: each event's exact JSON (``SemanticEvent.to_json``) as a string tensor of
  plugin ``neuraldbg_event``, which TensorBoard does not display; ``neuraldbg-track show/compare``
  read a log dir back from it;
* scalars ``<prefix>/state/<event_type>/<layer>`` (state code, see ``STATE_CODES``),
  ``<prefix>/<statistic>/<layer>`` for grad_norm, dead_fraction, saturated_fraction and rms
  (``<layer>`` via ``sanitize_key``), ``<prefix>/events/<event_type>``, ``<prefix>/events/total``
  and ``<prefix>/failing_layers``;
* text ``<prefix>/hypotheses`` at close: the ranked causal hypotheses (Markdown), at the last step
  they cite;
* a custom-scalars layout (one category per event type: state codes of every layer in one
  multiline chart, one chart per statistic; plus an events category), written once. TensorBoard
  shows one layout per run: pass ``layout=False`` to keep your own writer's layout.
"""
from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from neuraldbg_track.events import SemanticEvent
from neuraldbg_track.sinks.base import Sink

from ._codes import KEY_STATISTICS, STATE_CODES, codes_legend, finite_number, key_statistic, state_code
from ._payload import sanitize_key

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")
EVENT_JSON_TAG = "event_json"        # <prefix>/event_json: the exact event, for reading runs back
EVENT_JSON_PLUGIN = "neuraldbg_event"
_STATS_BY_TYPE = {"gradient_health": ("grad_norm",),
                  "activation_regime": ("dead_fraction", "saturated_fraction", "rms")}


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError('TensorBoardSink needs the tensorboard package: '
                          'pip install "neuraldbg-track[tensorboard]"') from exc
    return SummaryWriter


def md_escape(text: Any) -> str:
    """``text`` as literal Markdown: special characters backslash-escaped, HTML and newlines defused."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace("\r", " ").replace("\n", " ")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def event_markdown(event: SemanticEvent) -> str:
    """One event as a one-row Markdown table."""
    stat, value = key_statistic(event)
    shown = f"{stat} = {_fmt(value)}" if stat else ""
    to_state = f"**{md_escape(event.to_state)}**" if event.is_failure else md_escape(event.to_state)
    cells = [str(event.step), md_escape(event.layer_name), md_escape(event.event_type),
             f"{md_escape(event.from_state)} → {to_state}", f"{event.confidence:.2f}", md_escape(shown)]
    return ("| step | layer | event | transition | confidence | statistic |\n"
            "|---:|---|---|---|---:|---|\n| " + " | ".join(cells) + " |")


def event_json_summary(tag: str, event: SemanticEvent) -> Any:
    """A summary holding ``event.to_json()`` as a string tensor of plugin :data:`EVENT_JSON_PLUGIN`."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=EVENT_JSON_PLUGIN))
    tensor = TensorProto(dtype="DT_STRING", string_val=[event.to_json().encode("utf-8")],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])


def custom_layout(prefix: str) -> dict[str, dict[str, list]]:
    """The custom-scalars layout: one category per event type and one for event counts."""
    p = re.escape(prefix)
    layout: dict[str, dict[str, list]] = {}
    for event_type in STATE_CODES:
        charts = {f"state codes ({codes_legend(event_type)})": ["Multiline", [rf"{p}/state/{event_type}/.*"]]}
        for stat in _STATS_BY_TYPE[event_type]:
            charts[stat] = ["Multiline", [rf"{p}/{stat}/.*"]]
        layout[f"{prefix} {event_type}"] = charts
    layout[f"{prefix} events"] = {"events": ["Multiline", [rf"{p}/events/.*", rf"{p}/failing_layers"]]}
    return layout


class TensorBoardSink(Sink):
    """Writes events to TensorBoard; the writer (and its log dir) is made on the first event."""

    deliver_in_background = True

    def __init__(self, log_dir: str | None = None, writer: "SummaryWriter | None" = None,
                 tag_prefix: str = "neuraldbg", layout: bool = True) -> None:
        if log_dir is not None and writer is not None:
            raise ValueError("pass log_dir or writer, not both (a writer already has its log dir)")
        self.prefix, self.layout = tag_prefix.strip("/") or "neuraldbg", layout
        self._log_dir, self.writer, self._owns_writer = log_dir, writer, writer is None
        self._lock = threading.Lock()
        self._laid_out = False
        self._closed = False
        self._counts: dict[str, int] = {}
        self._failing: dict[tuple[str, str], bool] = {}
        self.count = 0

    @property
    def log_dir(self) -> str | None:
        """Where the event files are (None until the first event when the sink makes its writer)."""
        return self.writer.get_logdir() if self.writer is not None else self._log_dir

    def _start(self) -> "SummaryWriter":
        if self.writer is None:
            self.writer = _summary_writer()(log_dir=self._log_dir)
        if self.layout and not self._laid_out:
            self.writer.add_custom_scalars(custom_layout(self.prefix))
            self._laid_out = True
        return self.writer

    def emit(self, event: SemanticEvent) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("TensorBoardSink.emit() after close(); create a new sink")
            w, p, step = self._start(), self.prefix, event.step
            w.add_text(f"{p}/events", event_markdown(event), global_step=step)
            w._get_file_writer().add_summary(event_json_summary(f"{p}/{EVENT_JSON_TAG}", event), step)
            layer = sanitize_key(event.layer_name)  # the same key segment as in W&B and MLflow
            w.add_scalar(f"{p}/state/{event.event_type}/{layer}",
                         state_code(event.event_type, event.to_state), global_step=step)
            for stat in KEY_STATISTICS:
                value = finite_number(event.metadata.get(stat))
                if value is not None:
                    w.add_scalar(f"{p}/{stat}/{layer}", value, global_step=step)
            self.count += 1
            self._counts[event.event_type] = self._counts.get(event.event_type, 0) + 1
            self._failing[(event.layer_name, event.event_type)] = event.is_failure
            w.add_scalar(f"{p}/events/{event.event_type}", self._counts[event.event_type], global_step=step)
            w.add_scalar(f"{p}/events/total", self.count, global_step=step)
            w.add_scalar(f"{p}/failing_layers", len({l for (l, _), bad in self._failing.items() if bad}),
                         global_step=step)

    def report(self, hypotheses: Any) -> None:
        """The post-mortem as one Markdown text, at the last step its hypotheses cite."""
        from neuraldbg_track.postmortem import format_hypotheses

        with self._lock:
            if self._closed:
                raise RuntimeError("TensorBoardSink.report() after close(); create a new sink")
            step = max((e.step for h in hypotheses for e in h.supporting), default=0)
            self._start().add_text(f"{self.prefix}/hypotheses", format_hypotheses(hypotheses, markdown=True),
                                   global_step=step)

    def flush(self) -> None:
        with self._lock:
            if self.writer is not None:
                self.writer.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed or self.writer is None:
                self._closed = True
                return
            self._closed = True
            if self._owns_writer:
                self.writer.close()
            else:
                self.writer.flush()

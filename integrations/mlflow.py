"""MLflow: training health as run tags one search filter away, the timeline as a table artifact.

    from neuraldbg_track.integrations.mlflow import MLflowSink
    with NeuralDbg(model, optimizer, sinks=[MLflowSink()]): ...

Which run: ``run_id`` if given; else the run active (``mlflow.start_run``) on the thread that
built the sink or the ``NeuralDbg``; else a new run in ``experiment_name`` (or the active /
``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_EXPERIMENT_ID`` / Default experiment), which is the only kind
of run the sink ends.
All calls go through ``MlflowClient`` with explicit run ids, so they work from the delivery thread.

Tags (values are states from :data:`~neuraldbg_track.integrations._payload.SEVERITY`):

=====================================  ========================================================
``neuraldbg.status``                   worst state any layer is in now (UNKNOWN: none confirmed)
``neuraldbg.peak``                     worst state any layer was ever in
``neuraldbg.failures``                 failure kinds ever seen, worst first ("none" if none)
``neuraldbg.first_step.<STATE>``       step of the first entry into STATE (also a metric)
``neuraldbg.first_layer.<STATE>``      the layer that entered it first
``neuraldbg.layers.<STATE>``           layers that ever entered STATE, comma-joined
``neuraldbg.event_count``              events so far (also a metric, with ``failing_layers``)
``neuraldbg.layer.<layer>.<type>``     that layer's current state (``<layer>`` via sanitize_key)
``neuraldbg.hypothesis``               at close: the top causal hypothesis, one line; with
                                       ``.cause``, ``.root_layer`` and ``.confidence``
=====================================  ========================================================

At close the ranked hypotheses also go to the text artifact ``hypotheses_file``.

Tags are sent on ``flush()``/``close()`` (the delivery thread flushes every few seconds), only
those that changed, at most 100 per request. The table (``table_file``, the whole timeline
re-uploaded when it changed) loads back with ``mlflow.load_table(table_file, run_ids=[...])``
(pandas reads a column of all-numeric layer names, as in ``nn.Sequential``, as integers).
Adopting a run that already has the table merges it, so :func:`~neuraldbg_track.delivery.replay`
into that run is idempotent.
"""
from __future__ import annotations

import importlib.util
import json
import os
import posixpath
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from neuraldbg_track.events import SemanticEvent
from neuraldbg_track.sinks import Sink

from ._mlflow_tags import PREFIX, event_key, summary
from ._payload import truncate

COLUMNS = ["step", "layer", "event_type", "from_state", "to_state", "confidence", "metadata"]
_TAGS_PER_BATCH = 100
_LOGGED_ARTIFACTS = "mlflow.loggedArtifacts"  # the tag mlflow.load_table searches for
_INSTALL = 'MLflowSink needs the mlflow package: pip install "neuraldbg-track[mlflow]"'


def _import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc
    return mlflow


class MLflowSink(Sink):
    """Sends events to an MLflow run as tags, metrics and a timeline table (see the module doc).

    Constructing it is cheap and starts nothing; the run is resolved on the first flush (or
    :meth:`start`). ``tags`` are extra tags for the run; ``end_run`` overrides whether close()
    ends the run (default: only a run this sink created); ``probe_timeout`` bounds the reachability
    check of an http(s) tracking server before each flush, so a server that is gone fails fast.
    """

    deliver_in_background = True

    def __init__(self, tracking_uri: str | None = None, run_id: str | None = None,
                 experiment_name: str | None = None, run_name: str | None = None,
                 table_file: str = "neuraldbg_events.json", *, tags: Mapping[str, Any] | None = None,
                 end_run: bool | None = None, probe_timeout: float = 2.0) -> None:
        if importlib.util.find_spec("mlflow") is None:
            raise ImportError(_INSTALL)
        if not table_file.endswith(".json") or any(c in table_file for c in "\"',:[]{}"):
            raise ValueError(f"table_file={table_file!r}; expected a run-relative path ending in .json "
                             "without quotes, commas, colons or brackets (mlflow.load_table refuses those)")
        self.tracking_uri, self.run_id = tracking_uri, None
        self.experiment_name, self.run_name, self.table_file = experiment_name, run_name, table_file
        self.hypotheses_file = posixpath.join(posixpath.dirname(table_file), "neuraldbg_hypotheses.txt")
        self.extra_tags = {str(k): truncate(v) for k, v in (tags or {}).items()}
        self.end_run, self.probe_timeout = end_run, probe_timeout
        self._adopt, self._experiment_id, self._explicit = run_id, None, (tracking_uri, run_id)
        self.capture_context()
        self._owns_run = False
        self._client: Any = None
        self._events: dict[tuple, SemanticEvent] = {}
        self._rows: dict[tuple, str] = {}  # each event's table row, serialised once
        self._sent_tags: dict[str, str] = {}
        self._sent_metrics: dict[str, float] = {}
        self._table_rows = -1
        self._table_registered = False
        self._closed = self._abandoned = False
        self._lock = threading.RLock()

    # ---- run lifecycle ------------------------------------------------------------------------
    def capture_context(self) -> None:
        """Read the caller's MLflow state: active run, tracking URI, experiment. The active run is
        thread-local, so this runs on the user's thread: at construction and again when NeuralDbg
        takes the sink (``prepare_sink``). Explicit arguments win; nothing changes once started."""
        fluent = sys.modules.get("mlflow")  # only a process that imported mlflow can have an active run
        if fluent is None or self.run_id is not None:
            return
        uri, run_id = self._explicit
        active = fluent.active_run() if run_id is None else None
        if active is not None:
            self._adopt = active.info.run_id
        if uri is None:
            self.tracking_uri = fluent.get_tracking_uri()
            self._experiment_id = getattr(getattr(fluent.tracking, "fluent", None), "_active_experiment_id", None)

    def start(self) -> str:
        """Resolve (adopt or create) the run; returns its id. Idempotent."""
        with self._lock:
            if self.run_id is not None:
                return self.run_id
            mlflow = _import_mlflow()
            self.tracking_uri = self.tracking_uri or mlflow.get_tracking_uri()
            self._probe()
            client = mlflow.MlflowClient(self.tracking_uri)
            if self._adopt is not None:
                run = client.get_run(self._adopt)
                self._merge_table(client, run.info.run_id)
                self._sent_tags = {k: v for k, v in run.data.tags.items() if k.startswith(PREFIX + ".")}
            else:
                tags = {f"{PREFIX}.table": self.table_file, **self.extra_tags}
                run = client.create_run(self._experiment(client), run_name=self.run_name, tags=tags)
                self._owns_run, self._sent_tags = True, dict(tags)
            self._client, self.run_id = client, run.info.run_id
            return self.run_id

    def _experiment(self, client: Any) -> str:
        name = self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if name:
            found = client.get_experiment_by_name(name)
            return found.experiment_id if found is not None else client.create_experiment(name)
        return self._experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID") or "0"

    def _probe(self) -> None:
        url = urlparse(self.tracking_uri or "")
        if url.scheme not in ("http", "https") or not url.hostname:
            return
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=self.probe_timeout).close()
        except OSError as exc:
            raise ConnectionError(f"MLflow tracking server {self.tracking_uri} is not reachable ({exc}); start it "
                                  "or fix tracking_uri. Events are kept for retry and replay.") from None

    # ---- the sink interface -------------------------------------------------------------------
    def emit(self, event: SemanticEvent) -> None:
        """Buffers the event (no network); ``flush()`` sends."""
        with self._lock:
            if self._closed:
                raise RuntimeError("MLflowSink.emit() after close(); create a new MLflowSink(run_id=...) "
                                   "to add to the same run")
            self._add(event)

    def flush(self) -> None:
        """Send the tags and metrics that changed and the table if it grew; raises if MLflow fails
        (everything stays buffered for the next flush)."""
        with self._lock:
            self._live()
            self._probe()
            run_id = self.start()
            tags, metrics = summary(self._events.values())
            tags = {f"{PREFIX}.table": self.table_file, **self.extra_tags, **tags}
            self._send(run_id, {k: v for k, v in tags.items() if self._sent_tags.get(k) != v},
                       {k: v for k, v in metrics.items() if self._sent_metrics.get(k) != v})
            if len(self._events) != self._table_rows:
                self._upload_table(run_id)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.flush()
            if self.end_run if self.end_run is not None else self._owns_run:
                self._client.set_terminated(self.run_id, "FINISHED")
            self._closed = True

    def report(self, hypotheses: Any) -> None:
        """The post-mortem: the top hypothesis as tags, all of them as the text artifact ``hypotheses_file``."""
        from neuraldbg_track.postmortem import format_hypotheses, summary as top_summary

        with self._lock:
            self._live()
            run_id = self.start()
            top = top_summary(hypotheses)
            tags = {f"{PREFIX}.{'hypothesis' if k == 'hypothesis' else 'hypothesis.' + k}": truncate(v)
                    for k, v in top.items() if k != "hypotheses"}
            self._send(run_id, tags, {})
            self._live()
            self._client.log_text(run_id, format_hypotheses(hypotheses) + "\n", self.hypotheses_file)

    def abandon(self) -> None:
        """Called (from another thread) when delivery gave up on this sink at close: stop before the
        next request, so a call that hung cannot later overwrite what a replay sent. Takes no lock."""
        self._abandoned = True

    def _live(self) -> None:
        if self._abandoned:
            raise RuntimeError("MLflowSink was abandoned at close; its events are listed for replay")

    def replay_hint(self) -> str:
        """How to rebuild this sink to re-send missed events (used in the undelivered warning)."""
        extra = "" if self.table_file == "neuraldbg_events.json" else f", table_file={self.table_file!r}"
        extra += ", end_run=True" if self._owns_run and not self._closed else ""
        return f"MLflowSink(tracking_uri={self.tracking_uri!r}, run_id={self.run_id!r}{extra})"

    # ---- payloads -----------------------------------------------------------------------------
    def _send(self, run_id: str, tags: dict[str, str], metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric, RunTag

        now, step = int(time.time() * 1000), max((e.step for e in self._events.values()), default=0)
        items = sorted(tags.items())
        for start in range(0, max(len(items), 1), _TAGS_PER_BATCH):
            chunk = items[start:start + _TAGS_PER_BATCH]
            batch_metrics = [Metric(k, v, now, step) for k, v in metrics.items()] if start == 0 else []
            if not chunk and not batch_metrics:
                return
            self._live()
            self._client.log_batch(run_id, metrics=batch_metrics, tags=[RunTag(k, v) for k, v in chunk],
                                   synchronous=True)
            self._sent_tags.update(chunk)
            if start == 0:
                self._sent_metrics.update(metrics)

    def _add(self, e: SemanticEvent) -> None:
        key = event_key(e)
        if key not in self._events:
            self._events[key] = e
            self._rows[key] = json.dumps([e.step, e.layer_name, e.event_type, e.from_state, e.to_state,
                                          e.confidence, json.dumps(e.to_dict()["metadata"], sort_keys=True)])

    def _upload_table(self, run_id: str) -> None:
        keys = sorted(self._events, key=lambda k: k[2])  # by step; stable, so arrival order within a step
        folder = posixpath.dirname(self.table_file) or None
        self._live()
        with tempfile.TemporaryDirectory() as tmp:  # mlflow.log_table's format: pandas orient="split"
            path = Path(tmp) / posixpath.basename(self.table_file)
            data = ",".join(self._rows[k] for k in keys)
            path.write_text(f'{{"columns": {json.dumps(COLUMNS)}, "data": [{data}]}}', encoding="utf-8")
            self._client.log_artifact(run_id, str(path), folder)  # replaces the previous upload
        self._table_rows = len(keys)
        if not self._table_registered:  # what mlflow.log_table records, so load_table finds it
            logged = json.loads(self._client.get_run(run_id).data.tags.get(_LOGGED_ARTIFACTS, "[]"))
            entry = {"path": self.table_file, "type": "table"}
            if entry not in logged:
                self._live()
                self._client.set_tag(run_id, _LOGGED_ARTIFACTS, json.dumps(logged + [entry]))
            self._table_registered = True

    def _merge_table(self, client: Any, run_id: str) -> None:
        """Take in the events an adopted run's table already holds."""
        folder = posixpath.dirname(self.table_file) or None
        if self.table_file not in {f.path for f in client.list_artifacts(run_id, folder)}:
            return
        with tempfile.TemporaryDirectory() as tmp:
            table = json.loads(Path(client.download_artifacts(run_id, self.table_file, tmp)).read_text("utf-8"))
        index = {name: i for i, name in enumerate(table["columns"])}
        keys = set()
        for row in table["data"]:
            event = SemanticEvent(event_type=row[index["event_type"]], layer_name=row[index["layer"]],
                                  step=row[index["step"]], from_state=row[index["from_state"]],
                                  to_state=row[index["to_state"]], confidence=row[index["confidence"]],
                                  metadata=json.loads(row[index["metadata"]] or "{}"))
            self._add(event)
            keys.add(event_key(event))
        self._table_rows = len(keys)  # events buffered before start() and not in it make the table grow

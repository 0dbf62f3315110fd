"""Weights & Biases: alerts when layers fail, an event-timeline table and chart, per-layer scalars.

``WandbSink()`` adopts ``wandb.run`` when one is active, else calls ``wandb.init`` on first use
(and then finishes only the run it started). What it logs:

* **alerts** (``run.alert``) for the states in ``alert_states``, at levels by severity; deduped,
  aggregated and rate-limited by :class:`~neuraldbg_track.integrations._alerts.AlertPolicy`;
* **timeline**: a table of every event so far (``<prefix>/timeline_table``) with a chart of it
  (``<prefix>/timeline``, preset ``chart``: step on x, layer index on y, ``to_state`` in the colour
  field), re-logged (W&B tables are immutable) every ``table_every`` events, at a flush at most every
  ``table_interval_s`` seconds, and at close;
* **scalars** on their own x-axis ``<prefix>/step`` (the event's training step), so the user's own
  step counter is untouched: ``<prefix>/state/<layer>/<event_type>`` = state code (see
  ``STATE_CODES``), ``<prefix>/events`` and ``<prefix>/failing_layers``. In a run it adopted the
  sink logs with ``commit=False`` (values join the user's next row, as ``wandb.watch`` does);
* **summary** at close: ``<prefix>/status`` (worst state any layer is in), failing layers and
  states, event and alert counts; the top causal hypothesis (``<prefix>/hypothesis``, ``.../cause``,
  ``.../root_layer``, ``.../confidence``), the ranked list as ``<prefix>/hypotheses`` text, and one
  alert naming the top hypothesis when it is a failure.
"""
from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from neuraldbg_track.events import SemanticEvent
from neuraldbg_track.sinks.base import Sink, log

from ._alerts import DEFAULT_ALERT_STATES, MAX_TITLE, Alert, AlertPolicy, resolve_levels
from ._codes import STATE_CODES, finite_number, key_statistic, state_code
from ._payload import sanitize_key, truncate, worst_state

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

COLUMNS = ["step", "layer", "layer_index", "event_type", "from_state", "to_state", "state_code",
           "confidence", "failure", "statistic", "value", "metadata"]
DEFAULT_CHART = "wandb/scatter/v0"
MAX_TABLE_ROWS = 10_000  # wandb.Table.MAX_ROWS: a logged run table keeps no more


def _import_wandb():
    try:
        import wandb
    except ImportError as exc:
        raise ImportError('WandbSink needs the wandb package: pip install "neuraldbg-track[wandb]"') from exc
    return wandb


class WandbSink(Sink):
    """Sends events to a W&B run; constructing it is cheap (the run opens on the first event)."""

    deliver_in_background = True

    def __init__(self, project: str | None = None, run: "Run | None" = None, *,
                 alert_states: Iterable[str] = DEFAULT_ALERT_STATES,
                 alert_levels: Mapping[str, str] | None = None, alert_window_s: float = 2.0,
                 min_alert_interval_s: float = 300.0, max_alerts: int = 20, table_every: int = 100,
                 table_interval_s: float = 30.0, chart: str | None = DEFAULT_CHART, prefix: str = "neuraldbg",
                 commit: bool | None = None, init_kwargs: Mapping[str, Any] | None = None) -> None:
        if not (isinstance(table_every, int) and table_every >= 1):
            raise ValueError(f"table_every={table_every!r}; expected an integer >= 1")
        if not (isinstance(table_interval_s, (int, float)) and table_interval_s >= 0):
            raise ValueError(f"table_interval_s={table_interval_s!r}; expected a number of seconds >= 0")
        self.project, self.prefix, self.chart, self.table_every = project, prefix, chart, table_every
        self.table_interval_s = table_interval_s
        self.init_kwargs = dict(init_kwargs or {})
        self.alerts = AlertPolicy(resolve_levels(alert_states, alert_levels), window_s=alert_window_s,
                                  min_interval_s=min_alert_interval_s, max_alerts=max_alerts)
        self.run = run
        self._commit = commit
        self._owns_run = False
        self._started = False
        self._closed = False
        self._lock = threading.RLock()
        self._timer: threading.Timer | None = None
        self._timer_due = 0.0
        self._rows: list[list[Any]] = []
        self._rows_dropped = 0
        self._logged_rows = 0
        self._table_logged_at: float | None = None
        self._layer_index: dict[str, int] = {}
        self._states: dict[tuple[str, str], SemanticEvent] = {}  # (layer, event type) -> latest
        self.count = 0
        self.alerts_failed = 0

    # ---- run lifecycle ------------------------------------------------------------------------
    def _start(self) -> "Run":
        if self._started:
            return self.run
        wandb = _import_wandb()
        if self.run is None and wandb.run is not None:
            self.run = wandb.run
        if self.run is None:
            kwargs = dict(self.init_kwargs)
            if self.project is not None:
                kwargs.setdefault("project", self.project)
            self.run = wandb.init(**kwargs)
            self._owns_run = True
        if self._commit is None:
            self._commit = self._owns_run
        p = self.prefix
        self.run.define_metric(f"{p}/step", hidden=True)
        self.run.define_metric(f"{p}/*", step_metric=f"{p}/step")
        self.run.config.update({f"{p}/state_codes": STATE_CODES}, allow_val_change=True)
        self._started = True
        return self.run

    # ---- the sink interface -------------------------------------------------------------------
    def emit(self, event: SemanticEvent) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("WandbSink.emit() after close(); create a new sink for a new run")
            run = self._start()
            states = {**self._states, (event.layer_name, event.event_type): event}
            code = state_code(event.event_type, event.to_state)
            p = self.prefix
            layer_key = f"{p}/state/{sanitize_key(event.layer_name)}/{event.event_type}"
            run.log({f"{p}/step": event.step, layer_key: code, f"{p}/events": self.count + 1,
                     f"{p}/failing_layers": _failing_layers(states)}, commit=self._commit)
            self._states = states  # only once the tracker took the event: a retried emit is clean
            self.count += 1
            self._add_row(event, code)
            if self.count - self._logged_rows >= self.table_every:
                self._log_table()
            if self.alerts.add(event):
                self._send_due_alerts()

    def flush(self) -> None:
        with self._lock:
            if self._started and not self._closed:
                self._send_due_alerts()
                last = self._table_logged_at
                if last is None or time.monotonic() - last >= self.table_interval_s:
                    self._log_table()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if not self._started:
                return
            for alert in self.alerts.drain():
                self._send(alert)
            self._log_table()
            self._write_summary()
            if self._owns_run:
                self.run.finish()

    def report(self, hypotheses: Any) -> None:
        """The post-mortem: the top hypothesis in the summary and, when it is a failure, one alert."""
        from neuraldbg_track.postmortem import format_hypotheses, summary as top_summary

        with self._lock:
            if self._closed:
                raise RuntimeError("WandbSink.report() after close(); create a new sink for a new run")
            run, p = self._start(), self.prefix
            run.summary.update({(f"{p}/hypothesis" if k == "hypothesis" else f"{p}/hypothesis/{k}"): v
                                for k, v in top_summary(hypotheses).items()})
            run.summary.update({f"{p}/hypotheses": truncate(format_hypotheses(hypotheses, limit=10))})
            top = hypotheses[0] if hypotheses else None
            policy = self.alerts  # alerts off (alert_states=()) or capped: no alert for the post-mortem either
            if top is not None and top.is_failure and policy.levels and policy.sent < policy.max_alerts:
                level = "ERROR" if top.cause in ("divergence", "exploding_gradients") else "WARN"
                policy.sent += 1
                self._send(Alert(truncate(f"neuraldbg: likely cause: {top.cause}", MAX_TITLE),
                                 truncate(f"{top.statement} (confidence {top.confidence:.2f})", 1000), level,
                                 (top.root_layer,) if top.root_layer else ()))

    # ---- alerts -------------------------------------------------------------------------------
    @property
    def pending_alerts(self) -> int:
        """Failing layers waiting for their (aggregated, rate-limited) alert."""
        with self._lock:
            return self.alerts.pending_layers

    def _send(self, alert) -> None:
        try:
            self.run.alert(title=alert.title, text=alert.text, level=alert.level,
                           wait_duration=self.alerts.min_interval_s or None)
        except Exception as exc:  # an alert is a notification; the events stay in the table and journal
            self.alerts_failed += 1
            log.warning("neuraldbg-track: W&B alert %r not sent (%s: %s); its events are in the timeline "
                        "table and the JSONL journal", alert.title, type(exc).__name__, exc)

    def _send_due_alerts(self) -> None:
        for alert in self.alerts.due():
            self._send(alert)
        wait = self.alerts.next_due_in()
        if wait is None:
            return
        due = time.monotonic() + wait  # no event may come to send it: a timer does, when it is due
        if self._timer is not None and self._timer.is_alive() and self._timer_due <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_due = threading.Timer(wait, self._on_timer), due
        self._timer.daemon = True
        self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            if self._timer is threading.current_thread():
                self._timer = None
            if not self._closed:
                self._send_due_alerts()

    # ---- timeline and summary -----------------------------------------------------------------
    def _add_row(self, event: SemanticEvent, code: int) -> None:
        if len(self._rows) >= MAX_TABLE_ROWS:
            if self._rows_dropped == 0:
                log.warning("neuraldbg-track: the W&B timeline table holds %d events; later ones are "
                            "counted in the run summary and kept in the JSONL journal", MAX_TABLE_ROWS)
            self._rows_dropped += 1
            return
        index = self._layer_index.setdefault(event.layer_name, len(self._layer_index))
        stat, value = key_statistic(event)
        self._rows.append([event.step, event.layer_name, index, event.event_type, event.from_state,
                           event.to_state, code, event.confidence, event.is_failure, stat, finite_number(value),
                           json.dumps(dict(event.to_dict()["metadata"]), sort_keys=True)])

    def _log_table(self) -> None:
        if self._logged_rows == self.count or not self._rows:
            return
        wandb = _import_wandb()
        table = wandb.Table(columns=COLUMNS, data=[list(r) for r in self._rows], allow_mixed_types=True)
        p = self.prefix
        if self.chart:
            value = wandb.plot_table(self.chart, table, {"x": "step", "y": "layer_index", "color": "to_state"},
                                     {"title": "neuraldbg event timeline (y: layer_index, colour: to_state)"})
            self.run.log({f"{p}/timeline": value}, commit=self._commit)
        else:
            self.run.log({f"{p}/timeline_table": table}, commit=self._commit)
        self._logged_rows, self._table_logged_at = self.count, time.monotonic()

    def _write_summary(self) -> None:
        p = self.prefix
        states = [e.to_state for e in self._states.values()]
        failing = sorted({e.to_state for e in self._states.values() if e.is_failure})
        self.run.summary.update({
            f"{p}/status": worst_state(states), f"{p}/events": self.count,
            f"{p}/failing_layers": _failing_layers(self._states), f"{p}/failing_states": failing,
            f"{p}/alerts_sent": self.alerts.sent, f"{p}/alerts_suppressed": self.alerts.suppressed,
            f"{p}/alerts_failed": self.alerts_failed, f"{p}/timeline_rows_dropped": self._rows_dropped})


def _failing_layers(states: Mapping[tuple[str, str], SemanticEvent]) -> int:
    return len({layer for (layer, _), e in states.items() if e.is_failure})

"""WandbSink against real offline W&B runs, read back from the run file; and the alert policy."""
from __future__ import annotations

import json
import sys
import time

import pytest
import torch
import wandb

from neuraldbg_track import NeuralDbg, SemanticEvent, read_journal
from neuraldbg_track.integrations._alerts import AlertPolicy, resolve_levels, title_for
from neuraldbg_track.integrations._wandb_offline import OfflineRunError, read_offline_run
from neuraldbg_track.integrations.wandb import WandbSink
from tests.helpers import exploding_mlp, regression_data, train
from tests.integrations.trackers import offline_wandb, run_dir, vanishing_sigmoid_mlp


def _event(layer: str, state: str = "VANISHING", step: int = 5, event_type: str = "gradient_health"):
    return SemanticEvent(event_type, layer, step, "HEALTHY" if event_type == "gradient_health" else "NORMAL",
                         state, 0.9, {"grad_norm": 1e-9})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ---- the alert policy (pure; a fake clock) ----------------------------------------------------
def test_a_burst_of_failing_layers_becomes_one_alert_with_a_stable_title():
    clock = Clock()
    policy = AlertPolicy(resolve_levels(["VANISHING"], None), window_s=2, clock=clock)
    for i in range(100):
        assert policy.add(_event(f"blocks.{i}"))
    clock.now = 1.9
    assert policy.due() == [] and policy.next_due_in() == pytest.approx(0.1)
    clock.now = 2.0
    (alert,) = policy.due()
    assert alert.title == "neuraldbg: gradients VANISHING" and alert.level == "WARN"
    assert len(alert.layers) == 100
    assert alert.text.startswith("100 layers' gradients became VANISHING at step 5: blocks.0 (grad_norm=1e-09)")
    assert alert.text.endswith("and 90 more.") and len(alert.text) <= 1000
    assert policy.next_due_in() is None


def test_alerts_are_deduped_per_layer_and_rate_limited_per_title():
    clock = Clock()
    policy = AlertPolicy(resolve_levels(["VANISHING", "EXPLODING"], None), window_s=0, min_interval_s=300,
                         clock=clock)
    policy.add(_event("a"))
    assert [a.layers for a in policy.due()] == [("a",)]
    assert not policy.add(_event("a", step=9))           # same layer, same state: never again
    clock.now = 10
    assert policy.add(_event("b")) and policy.add(_event("c"))
    assert policy.add(_event("a", "EXPLODING"))          # another title is not held back
    (exploding,) = policy.due()
    assert exploding.title == "neuraldbg: gradients EXPLODING" and exploding.level == "ERROR"
    assert policy.next_due_in() == pytest.approx(290)
    clock.now = 300
    (later,) = policy.due()
    assert later.layers == ("b", "c") and later.title == "neuraldbg: gradients VANISHING"


def test_alerts_past_the_cap_are_counted_and_healthy_or_unlisted_states_never_alert():
    policy = AlertPolicy(resolve_levels(["VANISHING", "NON_FINITE"], None), window_s=0, max_alerts=1)
    assert not policy.add(_event("x", "HEALTHY"))
    assert not policy.add(_event("x", "SATURATED"))
    policy.add(_event("a", "VANISHING"))
    policy.add(_event("b", "NON_FINITE"))
    policy.add(_event("c", "NON_FINITE"))
    (alert,) = policy.drain()
    assert alert.level == "ERROR" and alert.layers == ("b", "c")  # worst first
    assert policy.sent == 1 and policy.suppressed == 1


def test_alert_settings_are_validated_with_helpful_messages():
    with pytest.raises(ValueError, match="cannot alert on state 'HEALTHY'"):
        resolve_levels(["HEALTHY"], None)
    with pytest.raises(ValueError, match="add it to alert_states"):
        resolve_levels(["VANISHING"], {"DEAD": "WARN"})
    with pytest.raises(ValueError, match="expected one of"):
        resolve_levels(["DEAD"], {"DEAD": "loud"})
    assert resolve_levels(["DEAD", "VANISHING"], {"DEAD": "error"}) == {"DEAD": "ERROR", "VANISHING": "WARN"}
    assert len(title_for("x" * 200, "VANISHING")) < 64 and "\n" not in title_for("a\nb", "DEAD")


def test_missing_wandb_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r'pip install "neuraldbg-track\[wandb\]"'):
        WandbSink().emit(_event("a"))


# ---- a real training run in its own offline W&B run ---------------------------------------------
@pytest.fixture(scope="module")
def vanishing_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wandb_own")
    with offline_wandb(root):
        torch.manual_seed(0)
        model = vanishing_sigmoid_mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = regression_data()
        # window 0: the first failing layer alerts at once; the rest wait out the interval and
        # are sent, aggregated, at close.
        sink = WandbSink(project="neuraldbg-tests", alert_window_s=0, min_alert_interval_s=3600,
                         table_every=5)
        with NeuralDbg(model, opt, sinks=[sink], console=False, journal=root / "journal") as dbg:
            train(model, opt, x, y, steps=30)
        assert wandb.run is None  # the sink started this run, so it finished it
    return read_journal(dbg.journal_path), read_offline_run(run_dir(root, sink.run))


def test_failing_layers_send_few_deduplicated_alerts(vanishing_run):
    events, run = vanishing_run
    vanishing = [e.layer_name for e in events if e.to_state == "VANISHING"]
    layer_alerts = [a for a in run.alerts if not a["title"].startswith("neuraldbg: likely cause")]
    assert len(vanishing) == 12 and len(layer_alerts) == 2 < len(vanishing)
    assert {a["title"] for a in layer_alerts} == {"neuraldbg: gradients VANISHING"}
    assert {a["level"] for a in layer_alerts} == {"WARN"}
    assert {a["wait_duration_ms"] for a in layer_alerts} == {3_600_000}
    # plus one post-mortem alert at close naming the top hypothesis
    assert [(a["title"], a["level"]) for a in run.alerts if a not in layer_alerts] == [
        ("neuraldbg: likely cause: activation_saturation", "WARN")]
    first, rest = layer_alerts
    assert first["text"].startswith(f"1 layer's gradients became VANISHING at step 2: {vanishing[0]} (")
    assert rest["text"].startswith("11 layers' gradients became VANISHING at step 2: ")
    assert rest["text"].endswith("and 1 more.")
    assert "SATURATED" not in json.dumps(layer_alerts)  # activations saturate too, but do not alert
    assert run.summary["neuraldbg/alerts_sent"] == 3 and run.summary["neuraldbg/alerts_suppressed"] == 0


def test_timeline_table_holds_every_event_and_charts_it(vanishing_run):
    events, run = vanishing_run
    assert len(events) == 13
    assert len(run.table_paths("neuraldbg/timeline_table")) == 3  # after 5, 10 and at close (13)
    rows = run.table("neuraldbg/timeline_table")
    back = [SemanticEvent(r["event_type"], r["layer"], r["step"], r["from_state"], r["to_state"],
                          r["confidence"], json.loads(r["metadata"])) for r in rows]
    assert [e.to_dict() for e in back] == [e.to_dict() for e in events]
    assert rows[-1]["to_state"] == "SATURATED" and rows[-1]["state_code"] == 2
    assert rows[0]["statistic"] == "grad_norm" and rows[0]["failure"] is True
    chart = run.config["_wandb"]["visualize"]["neuraldbg/timeline"]["panel_config"]
    assert chart["panelDefId"] == "wandb/scatter/v0"
    assert chart["fieldSettings"] == {"x": "step", "y": "layer_index", "color": "to_state"}


def test_state_codes_and_counts_are_scalars_on_their_own_step_axis(vanishing_run):
    events, run = vanishing_run
    rows = [h for h in run.history if "neuraldbg/events" in h]
    assert [h["neuraldbg/events"] for h in rows] == list(range(1, 14))
    for row, event in zip(rows, events):
        assert row["neuraldbg/step"] == event.step
        # VANISHING (gradients) and SATURATED (activations) both rank 2 in their event type
        assert row[f"neuraldbg/state/{event.layer_name}/{event.event_type}"] == 2
    assert rows[-1]["neuraldbg/failing_layers"] == 13
    assert {"glob_name": "neuraldbg/*", "name": "", "step_metric": "neuraldbg/step"} in run.metrics
    assert run.config["neuraldbg/state_codes"]["gradient_health"]["VANISHING"] == 2
    assert run.summary["neuraldbg/failing_states"] == ["SATURATED", "VANISHING"]
    assert run.summary["neuraldbg/status"] == "VANISHING"


# ---- adopting the user's run --------------------------------------------------------------------
def test_adopts_the_active_run_keeps_its_steps_and_leaves_it_open(tmp_path):
    with offline_wandb(tmp_path):
        run = wandb.init(project="neuraldbg-tests")
        run.summary["user/blob"] = "x" * 70_000  # one record over three 32 KiB blocks
        torch.manual_seed(0)
        model = exploding_mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = regression_data()
        sink = WandbSink(alert_window_s=1.0)
        with NeuralDbg(model, opt, sinks=[sink], console=False, journal=tmp_path / "journal") as dbg:
            train(model, opt, x, y, steps=20, on_step=lambda i: run.log({"user/step_seen": i}, step=i))
            deadline = time.monotonic() + 30
            while sink.alerts.sent < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # the sink's timer sends the alerts while training would go on
            assert sink.pending_alerts == 0 and sink.alerts.sent == 2
        assert wandb.run is run and sink.run is run   # adopted, not finished by the sink
        run.log({"user/step_seen": 20}, step=20)
        run.finish()
    back = read_offline_run(run_dir(tmp_path, run))  # after wandb.teardown(): the file is complete
    assert back.summary["user/blob"] == "x" * 70_000
    user_rows = [h for h in back.history if "user/step_seen" in h]
    assert [(h["_step"], h["user/step_seen"]) for h in user_rows] == [(i, i) for i in range(21)]
    assert len(back.history) == 21  # the sink added values to the user's rows, never rows of its own
    ours = {k for h in back.history for k in h if k.startswith("neuraldbg/state/")}
    assert ours == {f"neuraldbg/state/{e.layer_name}/{e.event_type}" for e in dbg.events}
    assert sorted((a["title"], a["level"]) for a in back.alerts) == [
        ("neuraldbg: gradients EXPLODING", "ERROR"), ("neuraldbg: gradients NON_FINITE", "ERROR"),
        ("neuraldbg: likely cause: divergence", "ERROR")]
    assert len(back.table("neuraldbg/timeline_table")) == len(dbg.events) == 11


def test_reader_rejects_a_damaged_run_file(vanishing_run, tmp_path):
    _, run = vanishing_run
    data = bytearray(run.path.read_bytes())
    data[200] ^= 0xFF
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(OfflineRunError, match="checksum mismatch"):
        read_offline_run(bad)
    (tmp_path / "not.wandb").write_bytes(b"hello world")
    with pytest.raises(OfflineRunError, match="not a W&B run file"):
        read_offline_run(tmp_path / "not.wandb")

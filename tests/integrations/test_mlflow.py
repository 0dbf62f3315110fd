"""MLflowSink against real MLflow back-ends: a sqlite store, and a live ``mlflow server`` that is
killed mid-run and restarted (no mocks of MLflow)."""
from __future__ import annotations

import hashlib
import json
import re
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg_track import NeuralDbg, SemanticEvent, read_journal
from neuraldbg_track.delivery import BackgroundSink, replay
from neuraldbg_track.sinks import SinkWarning, iter_journal, read_run_info
from tests.helpers import regression_data, train
from tests.integrations.trackers import vanishing_sigmoid_mlp

mlflow = pytest.importorskip("mlflow")
from neuraldbg_track.integrations._payload import join_truncated, sanitize_key, worst_state  # noqa: E402
from neuraldbg_track.integrations.mlflow import MLflowSink  # noqa: E402

TABLE = "neuraldbg_events.json"
KEY = re.compile(r"[/\w.\- ]{1,250}", re.ASCII)


@pytest.fixture
def tracking(monkeypatch):
    """Point the fluent API (search_runs, load_table, start_run) at a store and experiment."""
    def use(uri: str, experiment_id: str) -> None:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", experiment_id)
    return use


def new_experiment(uri: str, name: str, root=None) -> str:
    location = (root / "artifacts" / name).as_uri() if root is not None else None
    return mlflow.MlflowClient(uri).create_experiment(name, artifact_location=location)


def watch(tmp_path, sink, steps=6, on_step=None, model=None) -> NeuralDbg:
    model = model or vanishing_sigmoid_mlp()  # every Linear vanishes at step 2, the last sigmoid saturates
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, sinks=[sink], console=False, journal=tmp_path / "nd") as dbg:
        train(model, opt, *regression_data(), steps=steps, on_step=on_step)
    return dbg


def rows(table) -> list[tuple]:
    # pandas reads a column of all-numeric names (nn.Sequential's "0", "2", ...) back as integers
    return sorted(zip(table.step, table.layer.astype(str), table.event_type, table.from_state, table.to_state))


def identities(events) -> list[tuple]:
    return sorted((e.step, e.layer_name, e.event_type, e.from_state, e.to_state) for e in events)


def search(filter_string: str) -> set[str]:
    return {r.info.run_id for r in mlflow.search_runs(filter_string=filter_string, output_format="list")}


def assert_tags_describe(tags: dict, events, states: dict) -> None:
    assert tags["neuraldbg.event_count"] == str(len(events))
    current = {(e.layer_name, e.event_type): e.to_state for e in sorted(events, key=lambda e: e.step)}
    for (layer, kind), state in current.items():
        assert state == states[layer][kind]  # the events agree with the debugger's own view
        assert tags[f"neuraldbg.layer.{sanitize_key(layer)}.{kind}"] == state
    assert tags["neuraldbg.status"] == worst_state(s for layer in states.values() for s in layer.values())
    vanishing = sorted((e for e in events if e.to_state == "VANISHING"), key=lambda e: e.step)
    assert tags["neuraldbg.first_step.VANISHING"] == str(vanishing[0].step)
    assert tags["neuraldbg.layers.VANISHING"].split(",") == list(dict.fromkeys(e.layer_name for e in vanishing))


def test_missing_mlflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an environment without mlflow looks like
    with pytest.raises(ImportError, match=re.escape('pip install "neuraldbg-track[mlflow]"')):
        MLflowSink()


def test_no_argument_sink_tags_metrics_and_table_in_sqlite_store(mlflow_store, tracking, tmp_path):
    exp = new_experiment(mlflow_store.uri, "sqlite-own-run", mlflow_store.root)
    tracking(mlflow_store.uri, exp)
    sink = MLflowSink()  # store and experiment from MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_ID
    dbg = watch(tmp_path, sink)
    journal = read_journal(dbg.journal_path)
    assert len(journal) == 13
    run = mlflow.MlflowClient(mlflow_store.uri).get_run(sink.run_id)
    assert run.info.experiment_id == exp and run.info.status == "FINISHED"  # its own run: ended
    assert_tags_describe(run.data.tags, journal, dbg.states())
    tags = run.data.tags
    assert (tags["neuraldbg.status"], tags["neuraldbg.failures"]) == ("VANISHING", "VANISHING,SATURATED")
    assert run.data.metrics["neuraldbg.event_count"] == 13 and run.data.metrics["neuraldbg.first_step.VANISHING"] == 2
    assert sink.run_id in search("tags.`neuraldbg.status` = 'VANISHING'")
    assert sink.run_id not in search("tags.`neuraldbg.status` = 'EXPLODING'")
    table = mlflow.load_table(TABLE, run_ids=[sink.run_id])
    assert len(table) == 13 and rows(table) == identities(journal)
    first = next(e for e in journal if e.layer_name == str(table.layer[0]) and e.event_type == table.event_type[0])
    assert json.loads(table.metadata[0]) == first.to_dict()["metadata"]


def test_adopts_the_active_run_and_leaves_it_open(mlflow_store, tracking, tmp_path):
    exp = new_experiment(mlflow_store.uri, "sqlite-active-run", mlflow_store.root)
    tracking(mlflow_store.uri, exp)
    client = mlflow.MlflowClient(mlflow_store.uri)
    sink = MLflowSink()  # built before the run: NeuralDbg picks up the run active where it is built
    with mlflow.start_run() as active:
        dbg = watch(tmp_path, sink)
        assert sink.run_id == active.info.run_id
        assert mlflow.active_run().info.run_id == active.info.run_id
        assert client.get_run(active.info.run_id).info.status == "RUNNING"  # not ended by the sink
        assert_tags_describe(client.get_run(active.info.run_id).data.tags, dbg.events, dbg.states())
    assert client.get_run(active.info.run_id).info.status == "FINISHED"


def test_keys_values_and_batches_respect_mlflow_limits(mlflow_store, tmp_path):
    names = [f"enc/blocks[{i}]:attn.{'x' * 300}" if i % 2 else f"enc.{i}.{'y' * 50}" for i in range(150)]
    events = [SemanticEvent("gradient_health", n, step=i, from_state="UNKNOWN", to_state="VANISHING",
                            confidence=0.9, metadata={"grad_norm": 0.0}) for i, n in enumerate(names)]
    sink = MLflowSink(tracking_uri=mlflow_store.uri, experiment_name="sqlite-limits")
    for e in events:
        sink.emit(e)
    sink.close()
    client = mlflow.MlflowClient(mlflow_store.uri)
    tags = client.get_run(sink.run_id).data.tags
    ours = {k: v for k, v in tags.items() if k.startswith("neuraldbg.")}
    assert all(KEY.fullmatch(k) for k in ours) and all(len(v) <= 8000 for v in ours.values())
    layer_tags = [k for k in ours if k.startswith("neuraldbg.layer.")]
    assert len(layer_tags) == 150  # two log_batch requests' worth: batches of at most 100 tags
    assert sorted(layer_tags) == sorted(f"neuraldbg.layer.{sanitize_key(n, 250 - 32)}.gradient_health" for n in names)
    listed = ours["neuraldbg.layers.VANISHING"]
    assert listed.endswith(" more)") and listed.split(",")[0] == names[0]  # whole names, then a count
    with open(client.download_artifacts(sink.run_id, TABLE, str(tmp_path)), encoding="utf-8") as f:
        assert [row[1] for row in json.load(f)["data"]] == names  # the table keeps the original names


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=400))
def test_sanitized_keys_are_valid_and_deterministic(name):
    key = sanitize_key(name)
    assert KEY.fullmatch(key) and "/" not in key and key == sanitize_key(name)
    if key != name:  # changed names carry a hash of the original, so they cannot collide
        assert key.endswith("-" + hashlib.sha256(name.encode()).hexdigest()[:8])
    assert sanitize_key("a/b") != sanitize_key("a:b") != "a_b"


def test_joined_lists_keep_whole_items_within_the_limit():
    text = join_truncated([f"layer{i}" for i in range(100)], limit=60)
    assert len(text) <= 60 and text.endswith("more)")
    assert all(part.startswith("layer") for part in text.split(",")[:-1])


def test_live_server_tags_searchable_and_table_loads(mlflow_server, tracking, tmp_path):
    exp = new_experiment(mlflow_server.uri, "server-tags")
    tracking(mlflow_server.uri, exp)
    sink = MLflowSink(tracking_uri=mlflow_server.uri, experiment_name="server-tags", run_name="vanishing")
    dbg = watch(tmp_path, sink)
    journal = read_journal(dbg.journal_path)
    run = mlflow.MlflowClient(mlflow_server.uri).get_run(sink.run_id)
    assert run.info.run_name == "vanishing" and run.info.status == "FINISHED"
    assert_tags_describe(run.data.tags, journal, dbg.states())
    for question in ("tags.`neuraldbg.status` = 'VANISHING'", "tags.`neuraldbg.failures` LIKE '%SATURATED%'",
                     "tags.`neuraldbg.first_step.VANISHING` IS NOT NULL",
                     "metrics.`neuraldbg.first_step.VANISHING` <= 2",
                     "tags.`neuraldbg.layer.0.gradient_health` = 'VANISHING'"):
        assert search(question) == {sink.run_id}, question
    assert search("tags.`neuraldbg.first_step.EXPLODING` IS NOT NULL") == set()
    table = mlflow.load_table(TABLE, run_ids=[sink.run_id])
    assert rows(table) == identities(journal)


def test_server_killed_mid_run_then_replay_delivers_the_rest(mlflow_server, tracking, tmp_path):
    exp = new_experiment(mlflow_server.uri, "server-killed")
    tracking(mlflow_server.uri, exp)
    sink = MLflowSink(tracking_uri=mlflow_server.uri, experiment_name="server-killed")
    model = vanishing_sigmoid_mlp()
    state = {}

    def on_step(i):
        if i == 4:  # the 13 step-2 events are out: wait until MLflow has them, then kill the server
            (bg,) = [s for s in state["dbg"].sinks.sinks if isinstance(s, BackgroundSink)]
            state["bg"] = bg
            bg.flush()
            deadline = time.monotonic() + 30  # a bounded wait, not a timing assertion
            while bg.stats.delivered < 13 and time.monotonic() < deadline:
                time.sleep(0.01)
            state["delivered_before_kill"] = bg.stats.delivered
            mlflow_server.kill()
        if i == 5:
            with torch.no_grad():
                model[22].bias.fill_(0.0)  # the last sigmoid leaves saturation: more events follow

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with pytest.warns(SinkWarning) as warned:
            with NeuralDbg(model, opt, sinks=[sink], console=False, journal=tmp_path / "nd") as dbg:
                state["dbg"] = dbg
                train(model, opt, *regression_data(), steps=25, on_step=on_step)
        assert dbg.step_count == 25  # training finished with the server gone
        journal = read_journal(dbg.journal_path)
        before = [e for e in journal if e.step <= 4]
        after = [e for e in journal if e.step > 4]
        assert state["delivered_before_kill"] == len(before) == 13 and len(after) > 0
        stats = state["bg"].stats
        assert (stats.delivered, stats.undelivered, stats.pending) == (len(before), len(after), 0)
        message = [str(w.message) for w in warned if issubclass(w.category, SinkWarning)]
        assert len(message) == 1 and f"{len(after)} of {len(journal)} events were not delivered" in message[0]
        run_dir = dbg.journal.run_dir
        assert identities(iter_journal(run_dir / "undelivered-MLflowSink.jsonl")) == identities(after)
        assert read_run_info(run_dir)["delivery"]["MLflowSink"]["undelivered"] == len(after)
    finally:
        mlflow_server.start()  # same store, same port
    table = mlflow.load_table(TABLE, run_ids=[sink.run_id])
    assert rows(table) == identities(before)  # what reached MLflow before the kill

    result = replay(run_dir, MLflowSink(tracking_uri=mlflow_server.uri, run_id=sink.run_id, end_run=True))
    assert (result.events, result.delivered, result.failed) == (len(after), len(after), 0)
    assert not (run_dir / "undelivered-MLflowSink.jsonl").exists()
    run = mlflow.MlflowClient(mlflow_server.uri).get_run(sink.run_id)
    assert run.info.status == "FINISHED"
    assert_tags_describe(run.data.tags, journal, dbg.states())
    assert rows(mlflow.load_table(TABLE, run_ids=[sink.run_id])) == identities(journal)
    again = replay(run_dir, MLflowSink(tracking_uri=mlflow_server.uri, run_id=sink.run_id), only_undelivered=False)
    assert again.delivered == len(journal)
    assert len(mlflow.load_table(TABLE, run_ids=[sink.run_id])) == len(journal)  # replay is idempotent

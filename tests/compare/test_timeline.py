"""Timelines from journals: every way to name a run, layer order, and the errors a user can cause."""
import json
import shutil
from pathlib import Path

import pytest

from neuraldbg_track import SemanticEvent, read_journal
from neuraldbg_track.sources import load_timeline
from neuraldbg_track.timeline import Timeline, TimelineError, layer_order, merge_orders, onset
from tests.compare.runs import LAYERS, SHIFT, VANISHING


def ev(layer, step, to, frm="HEALTHY", et="gradient_health", onset_step=None):
    metadata = {"onset_step": step - 2 if onset_step is None else onset_step}
    return SemanticEvent(et, layer, step, frm, to, 0.8, metadata)


def test_a_journal_loads_the_same_from_its_file_its_run_dir_and_a_parent(journals):
    run_dir = journals["late"]
    by_dir = load_timeline(run_dir)
    assert by_dir.name == "late" and by_dir.steps == 120 and by_dir.layers == tuple(LAYERS)
    assert by_dir.layers_known and by_dir.source == f"journal:{run_dir}"
    assert [e.to_dict() for e in by_dir.events] == [e.to_dict() for e in read_journal(run_dir)]
    for spec in (run_dir / "events.jsonl", run_dir.parent, run_dir.parent.parent / "late"):
        assert load_timeline(spec) == by_dir
    firsts = by_dir.first_failures()
    assert firsts[("gradient_health", "VANISHING")] == {"step": SHIFT, "first_layers": VANISHING,
                                                         "layers": VANISHING}
    assert by_dir.final_state("7", "activation_regime") == "SATURATED"
    assert by_dir.final_state("8", "gradient_health") == "HEALTHY"       # watched, no event: healthy
    assert by_dir.final_state("nope", "gradient_health") is None         # not in the run


def test_a_directory_with_several_runs_is_an_error_listing_them(journals, tmp_path):
    for name, run_dir in journals.items():
        shutil.copytree(run_dir, tmp_path / "all" / name)
    with pytest.raises(TimelineError, match="holds 2 runs") as err:
        load_timeline(tmp_path / "all")
    assert str(tmp_path / "all" / "early") in str(err.value) and str(tmp_path / "all" / "late") in str(err.value)


def test_user_mistakes_name_the_source_file_and_line(journals, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(journals["early"], bad)
    lines = (bad / "events.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"event_type": "gradient_health", "oops"\n'
    (bad / "events.jsonl").write_text("".join(lines))
    with pytest.raises(TimelineError, match=rf"{bad / 'events.jsonl'}:3: not a valid event"):
        load_timeline(bad)
    with pytest.raises(TimelineError, match=r"unknown source 'mlfow:'"):
        load_timeline("mlfow:abc")
    with pytest.raises(TimelineError, match=r"missing-dir: no such file or directory"):
        load_timeline(tmp_path / "missing-dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TimelineError, match="no neuraldbg run found"):
        load_timeline(tmp_path / "empty")
    with pytest.raises(TimelineError, match="expected wandb:ENTITY/PROJECT/RUN_ID"):
        load_timeline("wandb:just-a-name")


def test_a_truncated_last_line_is_skipped_with_a_warning(journals, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(journals["early"], cut)
    text = (cut / "events.jsonl").read_text()
    (cut / "events.jsonl").write_text(text[:-25])  # the last event, half written
    with pytest.warns(UserWarning, match="incomplete last line ignored"):
        t = load_timeline(cut)
    assert len(t.events) == len(read_journal(journals["early"])) - 1


def test_an_empty_run_is_a_timeline_without_events(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "events.jsonl").write_text("")
    (run / "run.json").write_text(json.dumps({"run_id": "r", "steps": 50, "layers": ["a", "b"]}))
    t = load_timeline(run)
    assert t.events == () and t.layers == ("a", "b") and t.steps == 50 and t.last_step == 49
    assert t.first_failures() == {} and t.final_state("b", "activation_regime") == "NORMAL"


def test_merge_orders_keeps_every_sequence_order_and_breaks_ties_naturally():
    assert merge_orders([["a", "c"], ["a", "b", "c"], ["c", "d"]]) == ["a", "b", "c", "d"]
    assert merge_orders([["blocks.10.fc"], ["blocks.2.fc"], ["blocks.1.fc"]]) == \
        ["blocks.1.fc", "blocks.2.fc", "blocks.10.fc"]
    assert merge_orders([["enc", "dec"], ["dec", "head"]]) == ["enc", "dec", "head"]   # not alphabetical
    assert sorted(merge_orders([["x", "y"], ["y", "x"]])) == ["x", "y"]                # a cycle still ends


def test_tracker_layer_order_is_rebuilt_from_the_order_events_were_emitted():
    # NeuralDbg emits one step's events of one type in model order: "enc" before "dec"
    events = [ev("enc", 5, "VANISHING"), ev("dec", 5, "VANISHING"), ev("dec", 9, "HEALTHY", frm="VANISHING"),
              ev("head", 9, "EXPLODING")]
    assert layer_order(events) == ["enc", "dec", "head"]
    t = Timeline.build("t", "test", events[2:] + events[:2])  # out of step order: sorted, stable within a step
    assert [(e.step, e.layer_name) for e in t.events] == [(5, "enc"), (5, "dec"), (9, "dec"), (9, "head")]
    assert t.layers == ("enc", "dec", "head") and not t.layers_known
    assert onset(t.events[0]) == 3
    assert onset(SemanticEvent("gradient_health", "x", 4, "HEALTHY", "VANISHING", 1.0)) == 4  # no onset_step
    assert t.last_step == 9 and t.final_states() == {"enc": {"gradient_health": "VANISHING"},
                                                      "dec": {"gradient_health": "HEALTHY"},
                                                      "head": {"gradient_health": "EXPLODING"}}


def test_an_online_wandb_run_is_read_through_the_public_api(monkeypatch):
    # No network here: a stand-in for wandb.Api() with the shape the public API documents (run.summary_metrics,
    # run.file(path).download(root=...)), serving a table as WandbSink logs it.
    wandb = pytest.importorskip("wandb")
    from neuraldbg_track.integrations.wandb import COLUMNS
    event = ev("blocks.0.fc", 12, "VANISHING")
    row = {"step": 12, "layer": "blocks.0.fc", "layer_index": 0, "event_type": "gradient_health",
           "from_state": "HEALTHY", "to_state": "VANISHING", "state_code": 3, "confidence": 0.8, "failure": True,
           "statistic": "", "value": None, "metadata": json.dumps(dict(event.metadata))}
    table_path = "media/table/neuraldbg/timeline_table_1_abc.table.json"
    asked = []

    class File:
        def download(self, root, replace):
            target = Path(root) / table_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps({"columns": COLUMNS, "data": [[row[c] for c in COLUMNS]]}))

    class Run:
        name, id, url = "lr-0.1", "abc123", "https://wandb.ai/me/proj/runs/abc123"
        summary_metrics = {"neuraldbg/timeline_table": {"_type": "table-file", "path": table_path},
                           "neuraldbg/timeline_rows_dropped": 3}

        def file(self, path):
            asked.append(path)
            return File()

    class Api:
        def run(self, path):
            if path != "me/proj/abc123":
                raise ValueError(f"Could not find run {path}")
            return Run()

    monkeypatch.setattr(wandb, "Api", Api)
    with pytest.warns(UserWarning, match="table lacks the run's last 3 events"):
        t = load_timeline("wandb:me/proj/abc123")
    assert t.info["timeline_rows_dropped"] == 3
    assert t.name == "lr-0.1" and t.source == "wandb:me/proj/abc123" and asked == [table_path]
    assert [e.to_dict() for e in t.events] == [event.to_dict()]
    with pytest.raises(TimelineError, match=r"wandb:me/proj/nope: ValueError: Could not find run me/proj/nope"):
        load_timeline("wandb:me/proj/nope")

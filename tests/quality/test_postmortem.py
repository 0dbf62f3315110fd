"""The post-mortem at close: every sink gets the ranked hypotheses (journal, MLflow, W&B, TensorBoard),
``dbg.explain()`` agrees with the reasoner on the loaded run, and ``neuraldbg-track explain`` prints it."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from neuraldbg_track.cli import main as cli
from neuraldbg_track.delivery import BackgroundSink
from neuraldbg_track.postmortem import explain_timeline, format_hypotheses
from neuraldbg_track.reasoner import CausalHypothesis
from neuraldbg_track.scenarios import SCENARIOS, run_scenario
from neuraldbg_track.sinks import FanOut, Sink, SinkWarning, read_run_info
from neuraldbg_track.sources import load_timeline

DEAD = SCENARIOS["dead_relu_bias_shift_midrun"]  # shift of Linear 2 -> ReLU 3 dead -> 0 and 2 vanish


class Recorder:
    """A tracker-like sink that records the calls it gets, in order."""

    deliver_in_background = True

    def __init__(self, fail_report: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_report = fail_report

    def emit(self, event):
        self.calls.append(("emit", event))

    def flush(self):
        self.calls.append(("flush",))

    def report(self, hypotheses):
        if self.fail_report:
            raise ConnectionError("tracker down")
        self.calls.append(("report", list(hypotheses)))

    def close(self):
        self.calls.append(("close",))


def test_fanout_reports_to_every_sink_that_listens_and_isolates_failures():
    h = [CausalHypothesis("x", "dead_units", "3", 0.5)]
    got, plain = Recorder(), []

    class Quiet(Sink):
        def emit(self, event):
            pass

    class Broken(Sink):
        def emit(self, event):
            pass

        def report(self, hypotheses):
            raise RuntimeError("boom")

    fan = FanOut([Broken(), got, plain.append, Quiet()])
    with pytest.warns(SinkWarning, match="Broken failed in report"):
        fan.report(h)
    assert got.calls == [("report", h)] and plain == [] and fan.failures == {"Broken": 1}


def test_journal_holds_the_hypotheses_and_the_loaded_run_explains_the_same(tmp_path, capsys):
    run = run_scenario(DEAD, journal=tmp_path, run_id="dead")
    run_dir = tmp_path / "dead"
    live = [h.to_dict() for h in run.hypotheses]
    assert json.loads((run_dir / "hypotheses.json").read_text()) == live
    info = read_run_info(run_dir)
    assert info["top_hypothesis"]["cause"] == "dead_units" and info["top_hypothesis"]["root_layer"] == "2"
    assert info["execution_order"] == run.execution_order and info["layer_sizes"]["2"] == 64 * 64 + 64
    loaded = explain_timeline(load_timeline(run_dir))
    assert [h.to_dict() for h in loaded] == live        # the reasoner is the same on live and loaded runs
    assert cli(["explain", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert run.hypotheses[0].statement in out and out.splitlines()[1].startswith("1. [0.75] 100% of the units of 3")
    assert cli(["explain", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hypotheses"] == live
    assert cli(["explain", str(tmp_path / "missing")]) == 1 and "error" in capsys.readouterr().err


def test_a_healthy_journal_says_no_failure_found(tmp_path):
    run_scenario(SCENARIOS["healthy_mlp_sgd"], journal=tmp_path, run_id="ok")
    (h,) = json.loads((tmp_path / "ok" / "hypotheses.json").read_text())
    assert h["cause"] == "none" and h["confidence"] == 1.0 and h["statement"].startswith("No failure found")


def test_background_sinks_get_the_report_after_every_event_and_before_close(tmp_path):
    rec = Recorder()
    run = run_scenario(DEAD, sinks=[rec], journal=tmp_path)
    verbs = [c[0] for c in rec.calls]
    assert verbs.count("report") == 1 and verbs[-1] == "close"
    assert verbs.index("report") > max(i for i, v in enumerate(verbs) if v == "emit")
    assert [e for v, *rest in rec.calls if v == "emit" for e in rest] == run.events
    assert rec.calls[verbs.index("report")][1] == run.hypotheses


def test_a_failing_report_loses_no_event(tmp_path):
    rec = Recorder(fail_report=True)
    bg = BackgroundSink(rec, max_attempts=1, backoff=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SinkWarning)  # no event may be reported undelivered
        run = run_scenario(DEAD, sinks=[bg], journal=tmp_path)
    assert bg.stats.delivered == len(run.events) == bg.stats.received and bg.stats.undelivered == 0
    assert [c[0] for c in rec.calls][-1] == "close"


def test_format_hypotheses_lists_chain_and_escapes_markdown():
    h = CausalHypothesis("a_b *c*", "dead_units", "3", 0.5, 1, ("step 1: x_y", "step 2: z"))
    assert format_hypotheses([h]) == "1. [0.50] a_b *c* (root: 3)\n     step 1: x_y\n     step 2: z"
    assert format_hypotheses([h], markdown=True).startswith("1. [0.50] a\\_b \\*c\\* (root: 3)\n    - step 1: x\\_y")


# ---- the trackers -----------------------------------------------------------------------------------
def test_mlflow_gets_the_top_hypothesis_as_tags_and_all_as_text(mlflow_store, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from neuraldbg_track.integrations.mlflow import MLflowSink

    sink = MLflowSink(tracking_uri=mlflow_store.uri, experiment_name="postmortem")
    run = run_scenario(DEAD, sinks=[sink], journal=tmp_path)
    client = mlflow.MlflowClient(mlflow_store.uri)
    tags = client.get_run(sink.run_id).data.tags
    top = run.hypotheses[0]
    assert tags["neuraldbg.hypothesis"] == top.statement and tags["neuraldbg.hypothesis.cause"] == "dead_units"
    assert tags["neuraldbg.hypothesis.root_layer"] == "2"
    assert float(tags["neuraldbg.hypothesis.confidence"]) == top.confidence
    (tmp_path / "dl").mkdir()
    text = Path(client.download_artifacts(sink.run_id, "neuraldbg_hypotheses.txt", str(tmp_path / "dl")))
    assert text.read_text(encoding="utf-8") == format_hypotheses(run.hypotheses) + "\n"
    assert client.get_run(sink.run_id).info.status == "FINISHED"  # reported before the run was ended


def test_wandb_gets_the_top_hypothesis_in_the_summary_and_one_alert(tmp_path):
    pytest.importorskip("wandb")
    from neuraldbg_track.integrations._wandb_offline import read_offline_run
    from neuraldbg_track.integrations.wandb import WandbSink

    from tests.integrations.trackers import offline_wandb, run_dir

    with offline_wandb(tmp_path):
        sink = WandbSink(project="neuraldbg-tests", alert_states=("NON_FINITE",))  # the run's events: none alert
        run = run_scenario(DEAD, sinks=[sink], journal=tmp_path / "journal")
    back = read_offline_run(run_dir(tmp_path, sink.run))
    top = run.hypotheses[0]
    assert back.summary["neuraldbg/hypothesis"] == top.statement
    assert back.summary["neuraldbg/hypothesis/cause"] == "dead_units"
    assert back.summary["neuraldbg/hypothesis/root_layer"] == "2"
    assert back.summary["neuraldbg/hypotheses"] == format_hypotheses(run.hypotheses)
    (alert,) = back.alerts
    assert alert["title"] == "neuraldbg: likely cause: dead_units" and alert["level"] == "WARN"
    assert alert["text"].startswith(top.statement) and back.summary["neuraldbg/alerts_sent"] == 1


def test_tensorboard_gets_the_hypotheses_as_markdown_text(tmp_path):
    pytest.importorskip("tensorboard")
    from neuraldbg_track.integrations.tensorboard import TensorBoardSink

    from tests.integrations.trackers import tb_reader, tb_texts

    run = run_scenario(DEAD, sinks=[TensorBoardSink(log_dir=str(tmp_path / "tb"))])
    ((step, text),) = tb_texts(tb_reader(tmp_path / "tb"), "neuraldbg/hypotheses")
    assert text == format_hypotheses(run.hypotheses, markdown=True)
    assert step == max(e.step for e in run.hypotheses[0].supporting)
    # read back from the tracker (no run.json: order rebuilt from the events, no sizes): same conclusion
    (loaded,) = explain_timeline(load_timeline(tmp_path / "tb"))
    assert (loaded.cause, loaded.root_layer, loaded.chain) == (run.hypotheses[0].cause, "2", run.hypotheses[0].chain)

"""Compare runs read back from every tracker: two real runs logged to the journal, MLflow (sqlite
store), W&B (offline) and TensorBoard at once, loaded from each source, compared."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from neuraldbg_track.compare import compare
from neuraldbg_track.integrations.mlflow import MLflowSink
from neuraldbg_track.integrations.tensorboard import TensorBoardSink
from neuraldbg_track.integrations.wandb import WandbSink
from neuraldbg_track.sources import load_timeline
from neuraldbg_track.timeline import TimelineError
from tests.compare.runs import LAYERS, SHIFT, saturating_run
from tests.integrations.trackers import offline_wandb, run_dir

EXPERIMENT = "compare-sources"
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout


@pytest.fixture(scope="module")
def tracked(mlflow_store, tmp_path_factory):
    """Each run of tests/compare/runs.py logged to every tracker: ``{name: {source: spec}}``."""
    root = tmp_path_factory.mktemp("compare-sources")
    mlflow.MlflowClient(mlflow_store.uri).create_experiment(
        EXPERIMENT, artifact_location=(root / "mlflow-artifacts").as_uri())
    specs = {}
    for name in ("early", "late"):
        mlflow_sink = MLflowSink(tracking_uri=mlflow_store.uri, experiment_name=EXPERIMENT, run_name=name)
        wandb_root = root / f"wandb-{name}"
        wandb_root.mkdir()
        with offline_wandb(wandb_root):
            wandb_sink = WandbSink(project="neuraldbg-compare", table_every=1000)
            dbg = saturating_run(root / "journal" / name, name,
                                 sinks=[mlflow_sink, wandb_sink, TensorBoardSink(log_dir=str(root / "tb" / name))])
        assert dbg.journal.count > 0
        specs[name] = {"journal": dbg.journal.run_dir, "mlflow_id": f"mlflow:{mlflow_sink.run_id}",
                       "mlflow_name": f"mlflow:{EXPERIMENT}/{name}", "tensorboard": root / "tb" / name,
                       "wandb_run": run_dir(wandb_root, wandb_sink.run), "wandb_dir": wandb_root / "wandb"}
    return specs


def test_every_source_gives_the_journal_timeline(tracked, mlflow_store):
    for name, specs in tracked.items():
        journal = load_timeline(specs["journal"])
        assert len(journal.events) >= 5 and journal.layers == tuple(LAYERS)
        for source in ("mlflow_id", "mlflow_name", "tensorboard", "wandb_run", "wandb_dir"):
            t = load_timeline(specs[source], tracking_uri=mlflow_store.uri)
            assert [e.to_dict() for e in t.events] == [e.to_dict() for e in journal.events], (name, source)
            assert t.same_events(journal) and t.layers == tuple(journal.event_layers), (name, source)
            assert not t.layers_known and t.steps is None
        assert load_timeline(specs["mlflow_name"], tracking_uri=mlflow_store.uri).name == name


def test_runs_compared_across_trackers_give_the_journal_comparison(tracked, mlflow_store):
    by_journal = compare([load_timeline(tracked["early"]["journal"]), load_timeline(tracked["late"]["journal"])])
    for a, b in (("mlflow_id", "tensorboard"), ("wandb_run", "mlflow_name"), ("tensorboard", "wandb_dir")):
        mixed = compare([load_timeline(tracked["early"][a], tracking_uri=mlflow_store.uri),
                         load_timeline(tracked["late"][b], tracking_uri=mlflow_store.uri)])
        assert mixed.onsets == by_journal.onsets, (a, b)
        assert f"run B's layers 0, 2, 4 and 6 vanish {SHIFT} steps later than run A's" in mixed.verdict
        # trackers do not know the run lengths; everything else the verdict says is the same
        assert by_journal.verdict.replace("Run A ran 80 steps, run B ran 120 steps; run", "Run") == mixed.verdict


def test_cli_compares_an_mlflow_run_with_a_wandb_run(tracked, mlflow_store, tmp_path):
    picture = tmp_path / "mixed.png"
    cmd = [sys.executable, "-m", "neuraldbg_track.cli", "compare", tracked["early"]["mlflow_name"],
           str(tracked["late"]["wandb_run"]), "--tracking-uri", mlflow_store.uri, "--json", "--plot", str(picture)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [r["source"].split(":")[0] for r in doc["runs"]] == ["mlflow", "wandb-offline"]
    assert {"layer": "6", "event_type": "gradient_health", "state": "VANISHING", "status": "shifted",
            "onsets": {"A": 0, "B": SHIFT}, "shift_vs_A": {"A": 0, "B": SHIFT}} in doc["onsets"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and doc["plot"] == str(picture)


def test_mlflow_mistakes_name_the_source(tracked, mlflow_store, tmp_path):
    cmd = [sys.executable, "-m", "neuraldbg_track.cli", "show", "mlflow:0123456789abcdef",
           "--tracking-uri", mlflow_store.uri]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("neuraldbg-track: error: mlflow:0123456789abcdef: ")
    assert len(done.stderr.strip().splitlines()) == 1
    with pytest.raises(TimelineError, match=f"no run named 'nope' in experiment '{EXPERIMENT}'"):
        load_timeline(f"mlflow:{EXPERIMENT}/nope", tracking_uri=mlflow_store.uri)
    with pytest.raises(TimelineError, match="no experiment 'missing-exp'"):
        load_timeline("mlflow:missing-exp/early", tracking_uri=mlflow_store.uri)
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    with pytest.raises(TimelineError, match="no MLflow store at"):
        load_timeline("mlflow:abc", tracking_uri=missing)
    assert not (tmp_path / "none.db").exists()  # reading never creates a store

"""Hydra apps end to end, as users run them: our demo with each sink, and a user's own app."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuraldbg_track import read_journal
from tests.integrations.trackers import tb_reader, tb_texts

DEMO = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def run_app(script, cwd, *overrides):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(cwd), "WANDB_SILENT": "true",
           "WANDB_DISABLE_GIT": "true", "WANDB_CONSOLE": "off", "NEURALDBG_DIR": str(cwd / "journal")}
    done = subprocess.run([sys.executable, str(script), *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (journal,) = (cwd / "journal").glob("*/events.jsonl")
    return done, read_journal(journal)


@pytest.mark.parametrize("sink", ["jsonl", "tensorboard", "mlflow", "wandb"])
def test_demo_with_each_sink(sink, tmp_path, mlflow_store):
    extra = [f"neuraldbg.mlflow.tracking_uri={mlflow_store.uri}",
             f"neuraldbg.mlflow.experiment_name=hydra-demo-{tmp_path.name}"] if sink == "mlflow" else []
    done, events = run_app(DEMO, tmp_path, "steps=30", f"neuraldbg.sink={sink}", *extra)
    assert len(events) >= 5 and "blocks.0.fc" in done.stderr
    if sink == "tensorboard":
        (log_dir,) = {p.parent for p in (tmp_path / "runs").rglob("events.out.tfevents.*")}
        texts = tb_texts(tb_reader(log_dir), "neuraldbg/events")
        assert len(texts) == len(events)
    elif sink == "mlflow":
        import mlflow
        runs = mlflow.MlflowClient(mlflow_store.uri).search_runs(
            [mlflow.MlflowClient(mlflow_store.uri).get_experiment_by_name(f"hydra-demo-{tmp_path.name}").experiment_id])
        (run,) = runs
        assert run.data.tags["neuraldbg.event_count"] == str(len(events))
        assert run.data.tags["neuraldbg.status"] == "VANISHING"
    elif sink == "wandb":
        from neuraldbg_track.integrations._wandb_offline import read_offline_run
        (run_path,) = (tmp_path / "wandb").glob("offline-run-*")
        offline = read_offline_run(run_path)
        assert any("VANISHING" in a["title"] for a in offline.alerts)
        assert len(offline.table("neuraldbg/timeline_table")) == len(events)


def test_a_users_own_app_pulls_our_node_and_switches_sink(tmp_path):
    app = tmp_path / "app"
    (app / "conf").mkdir(parents=True)
    (app / "conf" / "config.yaml").write_text(textwrap.dedent("""\
        defaults:
          - neuraldbg: default
          - _self_
        epochs: 3
        hydra:
          run:
            dir: .
          output_subdir: null
    """))
    (app / "train.py").write_text(textwrap.dedent("""\
        import hydra, torch
        from torch import nn
        from neuraldbg_track import NeuralDbg

        @hydra.main(version_base="1.3", config_path="conf", config_name="config")
        def main(cfg):
            torch.manual_seed(0)
            layers = []
            for _ in range(10):
                layers += [nn.Linear(16, 16), nn.Sigmoid()]
            model = nn.Sequential(*layers, nn.Linear(16, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(64, 16), torch.randn(64, 1)
            with NeuralDbg.from_config(cfg.neuraldbg, model, opt) as dbg:
                for _ in range(cfg.epochs * 5):
                    loss = nn.functional.mse_loss(model(x), y)
                    opt.zero_grad(); loss.backward(); opt.step()
            print("EVENTS", len(dbg.events))

        if __name__ == "__main__":
            main()
    """))
    done, events = run_app(app / "train.py", app, "neuraldbg.sink=tensorboard", "neuraldbg=strict")
    assert f"EVENTS {len(events)}" in done.stdout and len(events) >= 1
    (log_dir,) = {p.parent for p in (app / "runs").rglob("events.out.tfevents.*")}
    assert len(tb_texts(tb_reader(log_dir), "neuraldbg/events")) == len(events)
    info = json.loads((next((app / "journal").glob("*/run.json"))).read_text())
    assert info["thresholds"]["vanishing"] == 1e-05      # the strict preset was applied

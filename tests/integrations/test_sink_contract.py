"""One contract for every sink: the same event stream in (through the real delivery path), the same
events read back out of each backend's own storage."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import neuraldbg_track
from neuraldbg_track import ConsoleSink, JsonlSink, SemanticEvent, read_journal
from neuraldbg_track.delivery import prepare_sink
from neuraldbg_track.integrations._wandb_offline import read_offline_run
from neuraldbg_track.integrations.mlflow import MLflowSink
from neuraldbg_track.integrations.tensorboard import TensorBoardSink
from neuraldbg_track.integrations.wandb import WandbSink
from tests.integrations.trackers import offline_wandb, run_dir, tb_reader, tb_texts

G, A = "gradient_health", "activation_regime"
STREAM = [  # layer names with Markdown specials; confidences with two decimals (what text shows)
    SemanticEvent(G, "enc.layer_1", 3, "UNKNOWN", "VANISHING", 0.75, {"grad_norm": 1e-9, "threshold": 1e-6}),
    SemanticEvent(G, "enc.layer_2", 3, "UNKNOWN", "VANISHING", 0.5, {"grad_norm": 2e-8}),
    SemanticEvent(A, "enc.act*_1", 4, "NORMAL", "DEAD", 1.0, {"dead_fraction": 1.0, "rms": 0.0}),
    SemanticEvent(G, "head", 9, "HEALTHY", "NON_FINITE", 1.0, {"grad_norm": "nan", "nonfinite": True}),
    SemanticEvent(G, "enc.layer_1", 12, "VANISHING", "HEALTHY", 0.25, {"grad_norm": 0.3}),
    SemanticEvent(A, "enc.act*_1", 15, "DEAD", "NORMAL", 0.5, {"dead_fraction": 0.1, "rms": 0.8}),
]


def identity(e) -> tuple:
    return (e.step, e.layer_name, e.event_type, e.from_state, e.to_state, round(e.confidence, 2))


def _unescape(cell: str) -> str:
    return re.sub(r"\\(.)", r"\1", cell.strip()).replace("&lt;", "<").replace("&amp;", "&")


def jsonl(tmp_path, request):
    sink = JsonlSink(tmp_path / "nd", run_id="contract")
    return sink, lambda: [identity(e) for e in read_journal(sink.path)]


def console(tmp_path, request):
    stream = io.StringIO()
    line = re.compile(r"\[neuraldbg\] step\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+) -> (\S+)\s+conf=([\d.]+)")

    def read():
        found = [line.match(text).groups() for text in stream.getvalue().splitlines()]
        return [(int(s), layer, kind, old, new, float(c)) for s, layer, kind, old, new, c in found]
    return ConsoleSink(stream=stream, color=False), read


def tensorboard(tmp_path, request):
    sink = TensorBoardSink(log_dir=str(tmp_path / "tb"))

    def read():
        out = []
        for step, text in tb_texts(tb_reader(tmp_path / "tb"), "neuraldbg/events"):
            cells = [_unescape(c) for c in re.split(r"(?<!\\)\|", text.split("\n")[2])[1:-1]]
            old, new = cells[3].split(" → ")
            out.append((step, cells[1], cells[2], old, new.strip("*"), float(cells[4])))
        return out
    return sink, read


def wandb(tmp_path, request):
    env = offline_wandb(tmp_path)
    env.__enter__()
    request.addfinalizer(lambda: env.__exit__(None, None, None))
    sink = WandbSink(project="neuraldbg-contract")

    def read():
        env.__exit__(None, None, None)  # wandb exits: the run file is complete
        rows = read_offline_run(run_dir(tmp_path, sink.run)).table("neuraldbg/timeline_table")
        for row, event in zip(rows, STREAM):  # the metadata survives too
            assert json.loads(row["metadata"]) == event.to_dict()["metadata"]
        return [(r["step"], r["layer"], r["event_type"], r["from_state"], r["to_state"], r["confidence"])
                for r in rows]
    return sink, read


def mlflow(tmp_path, request):
    import mlflow as client

    store = request.getfixturevalue("mlflow_store")
    sink = MLflowSink(tracking_uri=store.uri, experiment_name=f"contract-{tmp_path.name}")

    def read():
        request.getfixturevalue("monkeypatch").setenv("MLFLOW_TRACKING_URI", store.uri)  # load_table looks here
        tracking = client.MlflowClient(store.uri)
        experiment = tracking.get_run(sink.run_id).info.experiment_id
        table = tracking.load_table(experiment, sink.table_file, run_ids=[sink.run_id])
        order = {identity(e)[:5]: i for i, e in enumerate(STREAM)}  # the table may be in any order
        rows = sorted(zip(table.step, table.layer, table.event_type, table.from_state, table.to_state,
                          table.confidence), key=lambda r: order.get(r[:5], -1))
        return [(int(step), str(layer), kind, old, new, round(float(conf), 2))
                for step, layer, kind, old, new, conf in rows]
    return sink, read


@pytest.mark.parametrize("backend", [jsonl, console, tensorboard, wandb, mlflow],
                         ids=lambda f: f.__name__)
def test_every_sink_gives_back_the_events_it_was_given(backend, tmp_path, request):
    sink, read = backend(tmp_path, request)
    delivered = prepare_sink(sink, None)  # tracker sinks get the background delivery thread
    for event in STREAM:
        delivered.emit(event)
    delivered.close()
    if hasattr(delivered, "stats"):
        assert delivered.stats.delivered == len(STREAM) and delivered.stats.undelivered == 0
    assert read() == [identity(e) for e in STREAM]


def test_tracker_sinks_construct_without_importing_their_tracker():
    code = ("import sys\n"
            "from neuraldbg_track.integrations.mlflow import MLflowSink\n"
            "from neuraldbg_track.integrations.tensorboard import TensorBoardSink\n"
            "from neuraldbg_track.integrations.wandb import WandbSink\n"
            "sinks = [MLflowSink(), TensorBoardSink(), WandbSink()]\n"
            "assert all(s.deliver_in_background for s in sinks)\n"
            "trackers = ('mlflow', 'wandb', 'tensorboard', 'torch.utils.tensorboard')\n"
            "print(sorted(m for m in trackers if m in sys.modules))\n")
    here = str(Path(neuraldbg_track.__file__).resolve().parent.parent)  # import what this process imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

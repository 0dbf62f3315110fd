"""The MLflow row of the reliability report: a real ``mlflow server`` killed mid-run and restarted.

A local server (sqlite store under ``root``) receives a run through :class:`MLflowSink`; at step 4
it is SIGKILLed, training goes on, the sink reports what it could not deliver; then the server is
restarted on the same store and port and :func:`~neuraldbg_track.delivery.replay` sends the rest.
Delivered counts are read back from the server (the run's event-table artifact), not from the sink.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from .debugger import NeuralDbg
from .delivery import BackgroundSink, replay
from .sinks import read_journal

KILL_AT = 4
STEPS = 20
TABLE = "neuraldbg_events.json"


class LocalServer:
    """``mlflow server`` on 127.0.0.1; ``kill`` and ``start`` keep the store and the port."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root, self.uri, self.proc = root, f"http://127.0.0.1:{self.port}", None

    def start(self, timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.root / "server.log", "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"mlflow server did not start; see {self.root / 'server.log'}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _table_identities(uri: str, run_id: str) -> set[tuple]:
    import mlflow
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.MlflowClient(uri).download_artifacts(run_id, TABLE, tmp)
        except Exception:  # no table logged yet
            return set()
        doc = json.loads(Path(path).read_text())
    cols = doc["columns"]
    rows = [dict(zip(cols, r)) for r in doc["data"]]
    return {(int(r["step"]), str(r["layer"]), r["event_type"], r["to_state"]) for r in rows}


def mlflow_server_restart(root: Path):
    """Run the fault and return a :class:`~neuraldbg_track.reliability.FaultResult`."""
    from .integrations.mlflow import MLflowSink
    from .reliability import FaultResult, hook_count, vanishing_mlp

    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a report, not a progress bar
    server = LocalServer(root)
    server.start()
    try:
        sink = MLflowSink(tracking_uri=server.uri, experiment_name="reliability")
        model = vanishing_mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = NeuralDbg(model, opt, sinks=[sink], console=False, journal=root / "nd")

        def on_step(step: int) -> None:
            if step == KILL_AT:  # wait (bounded) until MLflow holds the step-2 events, then pull the plug
                (bg,) = [s for s in dbg.sinks.sinks if isinstance(s, BackgroundSink)]
                bg.flush()
                deadline = time.monotonic() + 60
                while bg.stats.delivered < len(dbg.events) and time.monotonic() < deadline:
                    time.sleep(0.01)
                server.kill()
            if step == KILL_AT + 1:
                with torch.no_grad():
                    model[22].bias.fill_(0.0)  # the last sigmoid leaves saturation: more events follow

        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(256, 16, generator=g), torch.randn(256, 1, generator=g)
        with dbg:
            for i in range(STEPS):
                batch = slice((i % 8) * 32, (i % 8 + 1) * 32)
                loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
                on_step(i)
        server.start()  # same store, same port
        journal = read_journal(dbg.journal_path)
        ident = {(e.step, e.layer_name, e.event_type, e.to_state) for e in journal}
        delivered = len(_table_identities(server.uri, sink.run_id) & ident)
        replay(dbg.journal_path.parent, MLflowSink(tracking_uri=server.uri, run_id=sink.run_id, end_run=True))
        after = len(_table_identities(server.uri, sink.run_id) & ident)
    finally:
        server.kill()
    produced = len(dbg.events) + dbg.dropped_events
    return FaultResult("mlflow server killed mid-run, restarted", "completed", produced, len(journal),
                       delivered={"mlflow": delivered}, after_replay={"mlflow": after},
                       hooks_left=hook_count(model, opt), dbg=dbg)

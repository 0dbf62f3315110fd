"""MLflow back-ends for the tests: one sqlite tracking store and one real ``mlflow server`` on it.

Creating an MLflow sqlite database takes seconds (migrations), so there is one per test session;
the server serves that same store, so it starts without migrating. Each test makes its own
experiment. The server is a process group started here and stopped by its pid.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

READY_TIMEOUT_S = 90.0  # a cold start on a busy 2-core machine takes 10-30 s


@dataclass
class SqliteStore:
    uri: str
    root: Path


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory) -> SqliteStore:
    pytest.importorskip("mlflow")
    import mlflow

    root = tmp_path_factory.mktemp("mlflow-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # the Default experiment's artifact root is ./mlruns at creation time
        mlflow.MlflowClient(uri).search_experiments()  # creates and migrates the database
    return SqliteStore(uri, root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on 127.0.0.1; :meth:`kill` and :meth:`start` keep the store and the port."""

    def __init__(self, store: SqliteStore) -> None:
        self.store, self.port = store, _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = store.root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store.uri,
               "--artifacts-destination", str(self.store.root / "served-artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job-runner process
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.store.root, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        tail = self.log.read_text(errors="replace")[-2000:]
        self.kill()
        pytest.fail(f"mlflow server did not answer {self.uri}/health within {READY_TIMEOUT_S:g} s; log:\n{tail}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server's process group (the CLI and its uvicorn child) and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for signum in (sig, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, signum)
                self.proc.wait(timeout=15)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + 15  # the uvicorn child may outlive the CLI by a moment
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                time.sleep(0.1)
            except OSError:
                return


@pytest.fixture(scope="session")
def mlflow_server(mlflow_store):
    server = MlflowServer(mlflow_store)
    server.start()
    yield server
    server.kill(signal.SIGTERM)

"""The framework examples run and show what they promise (docs cannot rot)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from neuraldbg_track import read_journal

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _vanishing(events) -> set[str]:
    return {e.layer_name for e in events if e.to_state == "VANISHING"}


def test_lightning_example(tmp_path, capsys):
    dbg = _load("lightning_train").main(steps=12, root_dir=str(tmp_path)).dbg
    assert {"net.0", "net.2"} <= _vanishing(dbg.events) and "net.24" not in _vanishing(dbg.events)
    assert f"journal: {dbg.journal_path}" in capsys.readouterr().out


def test_hf_example(tmp_path, capsys):
    dbg = _load("hf_train").main(steps=12, output_dir=str(tmp_path / "out")).dbg
    assert {"net.0", "net.2"} <= _vanishing(dbg.events) and "net.24" not in _vanishing(dbg.events)
    assert f"journal: {dbg.journal_path}" in capsys.readouterr().out


def test_ddp_example_under_torchrun(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(EXAMPLES / "ddp_train.py"), "--steps", "20", "--bad-from", "10"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "neuraldbg").iterdir()  # one journal: rank 0's
    events = read_journal(run_dir)
    assert {(e.metadata["rank"], e.step, e.to_state) for e in events} == {(1, 12, "ANOMALOUS")}
    assert "rank 1  layer 0     NORMAL -> ANOMALOUS" in done.stdout

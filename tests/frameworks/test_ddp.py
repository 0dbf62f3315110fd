"""DDP: two gloo ranks on CPU, a failure on rank 1 only, rank 0's journal tells which rank it was."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from neuraldbg_track import read_journal
from neuraldbg_track.distributed import has_sharded_parameters

from . import ddp_worker

STEPS, BAD_RANK, BAD_FROM = 20, 1, 10
DEADLINE_S = 180  # a hang (mismatched collectives) fails the test instead of blocking the suite


def _spawn(root) -> None:
    ctx = mp.spawn(ddp_worker.run, args=(2, str(root / "init"), str(root), STEPS, BAD_RANK, BAD_FROM),
                   nprocs=2, join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the DDP ranks did not finish within {DEADLINE_S} s (deadlock in the event exchange?)")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    _spawn(root)
    return root, {r: json.loads((root / f"rank{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.parametrize("run_id", ["every1", "every4"])
def test_rank0_journal_holds_rank1_anomaly(ddp_run, run_id):
    root, reports = ddp_run
    journal = read_journal(root / run_id)
    assert all("rank" in e.metadata for e in journal)
    anomalous = [e for e in journal if e.to_state == "ANOMALOUS"]
    assert {e.layer_name for e in anomalous} == {"0", "1", "2"}
    # confirmed on rank 1 after patience 3; rank 0's data never changed
    assert {(e.metadata["rank"], e.step) for e in anomalous} == {(BAD_RANK, BAD_FROM + 2)}
    assert not any(e.event_type == "gradient_health" and e.metadata["rank"] != 0 for e in journal)
    # rank 1 judged them, did not write them, and rank 0 received them
    rank1 = [e for e in reports[1][run_id]["events"] if e["to_state"] == "ANOMALOUS"]
    assert len(rank1) == 3 and reports[0][run_id]["received"] == 3
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["every1", "every4", "fsdp"]


def test_both_ranks_finish_with_the_same_exchanges(ddp_run):
    _, reports = ddp_run
    for run_id, expected in (("every1", STEPS), ("every4", STEPS // 4 + 1)):  # every4: 5 + the one at close
        assert [reports[r][run_id]["steps"] for r in (0, 1)] == [STEPS, STEPS]
        assert [reports[r][run_id]["exchanges"] for r in (0, 1)] == [expected, expected]


def test_fsdp_gradients_are_refused_and_activations_relayed(ddp_run):
    root, reports = ddp_run
    for rank in (0, 1):
        fsdp = reports[rank]["fsdp"]
        assert "sharded parameters" in fsdp["refused"] and "gradients=False" in fsdp["refused"]
        assert fsdp["steps"] == STEPS
    anomalous = [e for e in read_journal(root / "fsdp") if e.to_state == "ANOMALOUS"]
    assert {(e.layer_name, e.metadata["rank"], e.step) for e in anomalous} == {
        (layer, BAD_RANK, BAD_FROM + 2) for layer in ("0", "1", "2")}


def test_fsdp1_wrappers_and_flat_parameters_count_as_sharded():
    FullyShardedDataParallel = type("FullyShardedDataParallel", (nn.Module,), {})
    FlatParameter = type("FlatParameter", (nn.Parameter,), {})
    wrapped = nn.Sequential(nn.Linear(2, 2), FullyShardedDataParallel())
    flat = nn.Module()
    flat.register_parameter("flat", FlatParameter(torch.zeros(2)))
    assert has_sharded_parameters(wrapped) and has_sharded_parameters(flat)
    assert not has_sharded_parameters(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))

"""Stepping, the journal, bounded memory and sink isolation, through real training."""
import warnings

import pytest
import torch
from torch import nn

from neuraldbg_track import JsonlSink, NeuralDbg, read_journal
from neuraldbg_track.sinks import SinkWarning, read_run_info
from tests.helpers import mlp, regression_data, train


def deep_sigmoid():
    return mlp([16] + [32] * 10 + [1], act=nn.Sigmoid)


def test_journal_round_trips_every_event():
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, x, y, steps=20)
    assert len(dbg.events) >= 3
    assert read_journal(dbg.journal_path) == dbg.events
    assert read_journal(dbg.journal_path.parent) == dbg.events      # a run directory works too
    info = read_run_info(dbg.journal_path.parent)
    assert info["model_class"] == "Sequential" and info["thresholds"]["vanishing"] == 1e-6
    assert info["events"] == len(dbg.events) and info["status"] == "completed" and info["steps"] == 20
    assert dbg.journal_path.parent.parent.name == "neuraldbg"      # under the working directory


def test_journal_location_argument_then_env_then_default(tmp_path, monkeypatch):
    model = mlp([4, 4])
    monkeypatch.setenv("NEURALDBG_DIR", str(tmp_path / "from_env"))
    assert NeuralDbg(model).journal_path.is_relative_to(tmp_path / "from_env")
    assert NeuralDbg(model, journal=tmp_path / "explicit").journal_path.is_relative_to(tmp_path / "explicit")
    sink = JsonlSink(tmp_path / "own", run_id="r1")
    assert NeuralDbg(model, journal=sink).journal_path == tmp_path / "own" / "r1" / "events.jsonl"


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, *regression_data(), steps=5)
    with open(dbg.journal_path, "a") as f:
        f.write('{"event_type": "gradient_health", "layer')   # a crash mid-write
    with pytest.warns(UserWarning, match="incomplete last line"):
        assert read_journal(dbg.journal_path) == dbg.events


def test_max_events_bounds_memory_and_the_journal_keeps_all():
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, console=False, max_events=2) as dbg:
        train(model, opt, *regression_data(), steps=10)
    everything = read_journal(dbg.journal_path)
    assert len(everything) > 2
    assert dbg.events == everything[-2:] and dbg.dropped_events == len(everything) - 2


def test_every_n_steps_observes_only_those_steps():
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with NeuralDbg(model, opt, console=False, every_n_steps=5, sinks=[seen.append]) as dbg:
        train(model, opt, *regression_data(), steps=30)
    assert seen and all(e.step % 5 == 0 for e in seen) and dbg.observed_steps == 6
    first = min(e.step for e in seen)
    assert first == 10  # third observation (steps 0, 5, 10) confirms with patience 3


def test_gradient_accumulation_gives_one_observation_per_optimizer_step():
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        for step in range(6):
            opt.zero_grad()
            for micro in range(4):
                nn.functional.mse_loss(model(x[micro::4][:32]), y[micro::4][:32]).backward()
            opt.step()
    assert dbg.step_count == 6 and dbg.observed_steps == 6     # 24 backward passes, 6 observations
    vanishing = [e for e in dbg.events if e.to_state == "VANISHING"]
    assert vanishing and all(e.step < 6 for e in vanishing)


def test_manual_steps_without_optimizer():
    model = nn.Linear(4, 4)
    with NeuralDbg(model, console=False, journal=False) as dbg:
        for i in range(6):
            model.weight.grad = torch.full_like(model.weight, 1e-12)
            model.bias.grad = torch.zeros_like(model.bias)
            dbg.step()
    assert [(e.step, e.to_state) for e in dbg.events] == [(2, "VANISHING")]


class Exploding:
    def __init__(self):
        self.calls = 0

    def emit(self, event):
        self.calls += 1
        raise ConnectionError("tracker is down")


def test_a_failing_sink_is_reported_once_and_loses_nothing():
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad, good = Exploding(), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with NeuralDbg(model, opt, console=False, sinks=[bad, good.append]) as dbg:
            train(model, opt, *regression_data(), steps=20)
    reports = [w for w in caught if issubclass(w.category, SinkWarning)]
    assert len(reports) == 1 and "tracker is down" in str(reports[0].message)
    assert bad.calls == len(dbg.events) > 1 and good == dbg.events
    assert read_journal(dbg.journal_path) == dbg.events
    assert read_run_info(dbg.journal_path)["sink_failures"] == {"Exploding": len(dbg.events)}


def test_console_prints_each_event_line(capsys):
    model = deep_sigmoid()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt) as dbg:
        train(model, opt, *regression_data(), steps=5)
    err = capsys.readouterr().err
    for e in dbg.events:
        assert f"{e.layer_name}" in err
    assert err.count("UNKNOWN -> VANISHING") == sum(e.to_state == "VANISHING" for e in dbg.events)


def test_huge_finite_gradients_explode_and_nan_is_counted():
    model = nn.Linear(4, 4)
    with NeuralDbg(model, console=False, journal=False) as dbg:
        for value in [1e25] * 3 + [float("nan")]:
            model.weight.grad = torch.full_like(model.weight, 1.0)
            model.weight.grad[0, 0] = value                   # float32 norm overflows, values are finite
            model.bias.grad = torch.zeros_like(model.bias)
            dbg.step()
    (explode, nan) = dbg.events
    assert (explode.to_state, explode.metadata["grad_norm"]) == ("EXPLODING", pytest.approx(1e25, rel=1e-6))
    assert (nan.step, nan.to_state, nan.metadata["nonfinite_count"]) == (3, "NON_FINITE", 1)


class Reordered(nn.Module):
    def __init__(self):
        super().__init__()
        self.late = nn.Linear(8, 1)        # registered first, runs last
        self.early = nn.Linear(4, 8)

    def forward(self, x):
        return self.late(torch.relu(self.early(x)))


def test_execution_order_is_recorded_from_the_forward_pass():
    model = Reordered()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, torch.randn(64, 4), torch.randn(64, 1), steps=2)
    assert [l.name for l in dbg.layers] == ["late", "early"]
    assert dbg.execution_order == ["early", "late"]
    assert read_run_info(dbg.journal_path)["execution_order"] == ["early", "late"]

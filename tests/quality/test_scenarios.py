"""Every scenario of the suite runs and meets its ground truth; the quality figures are computed."""
from __future__ import annotations

import pytest
import torch

from neuraldbg_track.quality import Report, main, score
from neuraldbg_track.scenarios import SCENARIOS, ScenarioRun, run_scenario

FAILURES = [n for n, s in SCENARIOS.items() if not s.healthy]
HEALTHY = [n for n, s in SCENARIOS.items() if s.healthy]


def test_the_suite_covers_every_failure_family_and_healthy_architecture():
    families = {s.family for s in SCENARIOS.values()}
    assert families == {"vanishing", "exploding", "divergence", "dead", "saturation", "healthy"}
    assert any(s.expect[0].onset for s in SCENARIOS.values() if not s.healthy)  # mid-run regime changes
    described = " ".join(SCENARIOS[n].description for n in HEALTHY)
    for needed in ("MLP", "CNN", "LSTM", "GRU", "transformer", "Adam", "SGD", "accumulation", "bf16"):
        assert needed in described


@pytest.mark.parametrize("name", FAILURES)
def test_failure_is_reported_in_the_right_layers_and_state_in_time(suite_runs, name):
    run = suite_runs[name]
    s = score(run)
    assert s.missed == [] and s.found == s.expected > 0
    assert s.false_events == []                      # nothing the scenario does not explain
    assert s.events_per_change == 1.0                # one event per real change: no flapping
    if s.latency is not None:
        assert 0 <= s.latency <= run.patience + 1
    for expect in run.scenario.expect:
        for layer in expect.layers:
            first = next(e for e in run.events if (e.layer_name, e.to_state) == (layer, expect.state))
            assert first.event_type == expect.event_type and first.confidence > 0.3
            if expect.onset:  # healthy before the injected fault: the event says where it came from
                assert first.from_state in ("HEALTHY", "NORMAL") and first.metadata["onset_step"] >= expect.onset


@pytest.mark.parametrize("name", FAILURES)
def test_top_hypothesis_names_the_injected_cause_and_root(suite_runs, name):
    run = suite_runs[name]
    top = run.hypotheses[0]
    assert top.cause == run.scenario.cause
    if run.scenario.root:
        assert top.root_layer in run.scenario.root
    assert top.root_layer in run.layers and 0 < top.confidence <= 1
    assert set(top.supporting) <= set(run.events)


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_baseline_is_silent_and_gets_no_failure_found(suite_runs, name):
    run = suite_runs[name]
    assert run.events == [] and run.steps == run.scenario.steps
    assert len(run.execution_order) >= 2                  # it was watched: forward hooks ran
    (only,) = run.hypotheses
    assert only.cause == "none" and only.confidence == 1.0 and "No failure found" in only.statement


def test_quality_figures_meet_every_target(suite_runs):
    report = Report([score(r) for r in suite_runs.values()])
    o = report.overall
    assert o["recall"] == 1.0 and o["expected"] == sum(len(x.layers) for s in SCENARIOS.values() for x in s.expect)
    assert o["false_events_healthy"] == 0 and o["max_events_per_change"] == 1.0
    assert o["latency_within_bound"] and o["max_latency"] <= o["latency_bound"] == 4
    assert o["reasoner_accuracy"] >= 0.9 and o["healthy_no_failure_found"] == o["healthy_runs"] == len(HEALTHY)
    assert all(report.targets_met.values()), report.render()
    text = report.render()
    assert f"recall: {o['found']}/{o['expected']} = 100%" in text and "[MISSED]" not in text


def test_figures_are_computed_from_the_events(suite_runs):
    run = suite_runs["dead_relu_bias_shift_midrun"]
    hit = next(e for e in run.events if e.to_state == "DEAD")
    late = run.events[0].__class__.from_dict({**hit.to_dict(), "step": hit.step + 10})
    crippled = ScenarioRun(run.scenario, [e for e in run.events if e is not hit], run.execution_order, run.layers,
                           run.steps, run.patience, run.hypotheses[1:])
    s = score(crippled)
    assert s.found == 0 and s.missed == ["3 DEAD"] and not s.cause_ok
    flapping = ScenarioRun(run.scenario, run.events + [hit.__class__.from_dict(
        {**hit.to_dict(), "from_state": "DEAD", "to_state": "NORMAL", "step": hit.step + 5}), late],
        run.execution_order, run.layers, run.steps, run.patience, run.hypotheses)
    assert score(flapping).events_per_change == 1.5
    noisy = ScenarioRun(SCENARIOS["healthy_mlp_sgd"], [hit], ["0"], ["0"], 10, 3, run.hypotheses)
    report = Report([score(noisy)])
    assert report.overall["false_events_healthy"] == 1
    assert not report.targets_met["no false event on healthy runs"]


def test_quality_command_prints_figures_and_fails_on_a_missed_target(capsys):
    assert main(["--only", "dead_relu_bias_shift", "healthy_mlp_sgd"]) == 0
    out = capsys.readouterr().out
    assert "dead_relu_bias_shift" in out and "recall: 1/1 = 100%" in out and "[met] recall 100%" in out
    # patience 1: a one-step output swing of a healthy run is confirmed as a failure -> a target is missed
    assert main(["--only", "healthy_sigmoid_mlp_sgd", "--set", "patience=1"]) == 1
    assert "[MISSED] no false event on healthy runs" in capsys.readouterr().out
    assert main(["--only", "no_such_scenario"]) == 2
    assert "unknown scenario" in capsys.readouterr().err
    assert main(["--set", "patience=0", "--only", "healthy_mlp_sgd"]) == 2
    assert "patience=0 is not allowed" in capsys.readouterr().err


def test_run_scenario_restores_the_global_rng_and_threads():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    run_scenario(SCENARIOS["dead_relu_bias_shift"])
    assert torch.equal(torch.rand(3), expected) and torch.get_num_threads() == threads

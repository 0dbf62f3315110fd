"""compare(): onsets side by side, differences, final states and the verdict, on real and edge-case runs."""
import json

import pytest

from neuraldbg_track import SemanticEvent
from neuraldbg_track.compare import compare
from neuraldbg_track.sources import load_timeline
from neuraldbg_track.timeline import Timeline
from tests.compare.runs import SHIFT, VANISHING


def ev(layer, step, to, frm="HEALTHY", et="gradient_health"):
    return SemanticEvent(et, layer, step, frm, to, 0.8, {"onset_step": step - 2})


def test_two_real_runs_differ_by_the_known_shift(journals):
    early, late = load_timeline(journals["early"]), load_timeline(journals["late"])
    result = compare([early, late])
    rows = {(r.layer, r.event_type, r.state): r for r in result.onsets}
    for layer in VANISHING:  # onset = the step of the cut in each run
        row = rows[(layer, "gradient_health", "VANISHING")]
        assert row.onsets == (0, SHIFT) and row.status == "shifted" and row.shifts() == (0, SHIFT)
    assert rows[("7", "activation_regime", "SATURATED")].onsets == (0, SHIFT)
    only = [r for r in result.onsets if r.status == "only_in"]
    assert [(r.layer, r.state, r.onsets) for r in only] == [("6", "ANOMALOUS", (None, SHIFT))]
    assert not any(f.differs for f in result.finals)  # both end saturated and vanishing, layer 6 back to NORMAL
    assert result.verdict == (
        f"Run A ran 80 steps, run B ran 120 steps; run B turns anomalous at step {SHIFT} (layer 6), run A never "
        f"does; run B's layers 0, 2, 4 and 6 vanish {SHIFT} steps later than run A's; run B's layer 7 saturates "
        f"{SHIFT} steps later than run A's.")
    doc = json.loads(json.dumps(result.to_dict()))  # plain JSON all the way down
    assert doc["runs"][1]["first_failures"]["gradient VANISHING"]["step"] == SHIFT
    assert {"layer": "0", "event_type": "gradient_health", "state": "VANISHING", "status": "shifted",
            "onsets": {"A": 0, "B": SHIFT}, "shift_vs_A": {"A": 0, "B": SHIFT}} in doc["onsets"]
    assert compare([late, early]).onsets[0].shifts() == (0, -SHIFT)  # measured against the first run


def test_failure_in_one_run_only_different_lengths_and_layer_sets():
    a = Timeline.build("a", "t", [ev("fc1", 10, "VANISHING"), ev("fc3", 102, "VANISHING"),
                                  ev("fc2", 814, "EXPLODING")],
                       layers=["fc1", "fc2", "fc3"], steps=1000)
    b = Timeline.build("b", "t", [ev("fc1", 10, "VANISHING"), ev("fc1", 52, "HEALTHY", frm="VANISHING"),
                                  ev("fc3", 522, "VANISHING")],
                       layers=["fc1", "fc2", "fc3", "fc4"], steps=500)
    result = compare([a, b])
    assert result.layers == ("fc1", "fc2", "fc3", "fc4")
    assert [(r.layer, r.state, r.onsets, r.status) for r in result.onsets] == [
        ("fc1", "VANISHING", (8, 8), "same"), ("fc2", "EXPLODING", (812, None), "only_in"),
        ("fc3", "VANISHING", (100, 520), "shifted")]
    assert "run A explodes at step 812 (layer fc2), run B never does (run B stops at step 499)" in result.verdict
    assert "run B's layer fc3 vanishes 420 steps later than run A's" in result.verdict
    assert "at the end layer fc1 is VANISHING in run A but HEALTHY in run B" in result.verdict  # B recovered
    assert "at the end layer fc2" not in result.verdict  # implied: it exploded in run A only
    assert "run B has 1 layer the others lack (fc4)" in result.verdict
    finals = {(f.layer, f.event_type): f.states for f in result.finals}
    assert finals[("fc4", "gradient_health")] == (None, "HEALTHY")  # not in run A at all


def test_empty_runs_and_identical_runs():
    a = Timeline.build("a", "t", [ev("fc1", 10, "DEAD", frm="NORMAL", et="activation_regime")], layers=["fc1"],
                       steps=50)
    empty = Timeline.build("e", "t", [], layers=["fc1"], steps=50)
    result = compare([a, empty])
    assert [r.status for r in result.onsets] == ["only_in"]
    assert result.verdict.startswith("Run B logged no events; run A dies at step 8 (layer fc1), run B never does")
    assert compare([a, a]).verdict == ("Run A and run B show the same failures at the same steps and end in the "
                                       "same states.")
    assert compare([empty, empty]).onsets == ()
    assert compare([empty]).verdict == "Run e logged no events in 50 steps."
    with pytest.raises(ValueError, match="at least one"):
        compare([])


def test_three_runs_are_measured_against_the_first():
    runs = [Timeline.build(n, "t", [ev("x", s, "VANISHING")], layers=["x"])
            for n, s in (("a", 10), ("b", 30), ("c", 5))]
    result = compare(runs)
    assert result.labels == ("A", "B", "C") and result.onsets[0].shifts() == (0, 20, -5)
    assert result.verdict == ("Run B's layer x vanishes 20 steps later than run A's; "
                              "run C's layer x vanishes 5 steps earlier than run A's.")

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg_track.classify import NormWindow, classify_gradient
from neuraldbg_track.config import Thresholds
from neuraldbg_track.stats import GradientStats
from neuraldbg_track.transitions import TransitionDetector, confidence

TH = Thresholds()


def run(norms, patience=TH.patience, th=TH):
    det, window, events = TransitionDetector(patience), NormWindow(th.saturation_window), []
    for step, n in enumerate(norms):
        window.add(n)
        v = classify_gradient(GradientStats(n, not math.isfinite(n), 1), det.state("gradient_health", "fc"), th, window)
        e = det.observe("gradient_health", "fc", step, v)
        if e:
            events.append(e)
    return events


def test_patience_confirms_after_k_observations_and_healthy_start_is_silent():
    events = run([1.0] * 5 + [1e-8] * 5)
    assert [(e.step, e.from_state, e.to_state) for e in events] == [(7, "HEALTHY", "VANISHING")]
    assert events[0].metadata["onset_step"] == 5 and events[0].metadata["observations"] == 3


def test_unhealthy_first_observation_is_unknown_to_state():
    events = run([1e-9] * 4)
    assert [(e.from_state, e.to_state) for e in events] == [("UNKNOWN", "VANISHING")]


def test_non_finite_is_confirmed_at_once():
    events = run([1.0] * 4 + [math.nan])
    assert [(e.step, e.to_state) for e in events] == [(4, "NON_FINITE")]
    assert events[0].confidence == 1.0


def test_oscillation_at_threshold_gives_one_event_per_real_change():
    healthy = [1.0 * (1 + 0.3 * (i % 3)) for i in range(50)]
    hovering = [1e3 * (1.05 if i % 2 else 0.95) for i in range(100)]   # +-5% around the threshold
    clearly = [1e5] * 30
    back = [0.1 * (1 + 0.3 * (i % 3)) for i in range(30)]
    events = run(healthy + hovering + clearly + back)
    assert [(e.from_state, e.to_state) for e in events] == [("HEALTHY", "EXPLODING"), ("EXPLODING", "HEALTHY")]


def test_confidence_grows_with_margin_and_persistence():
    assert confidence([0.01], 0.5, 3, False) < 0.05
    assert confidence([0.1], 0.5, 3, False) < confidence([1.0], 0.5, 3, False) < confidence([3.0], 0.5, 3, False)
    assert confidence([1.0], 0.5, 1, False) < confidence([1.0], 0.5, 5, False)
    assert confidence([math.inf], 0.5, 1, True) == 1.0
    assert 0.0 <= confidence([-2.0], 0.5, 3, False) <= 1.0


def test_barely_crossing_scores_below_a_clear_failure():
    barely = run([1.0] * 5 + [0.9e-6] * 3)[0]
    clear = run([1.0] * 5 + [1e-10] * 3)[0]
    assert barely.confidence < 0.3 < 0.7 < clear.confidence


norms = st.one_of(st.floats(1e-12, 1e8), st.sampled_from([math.nan, math.inf, 0.0]))


@settings(max_examples=200, deadline=None)
@given(st.lists(norms, max_size=120), st.integers(1, 6))
def test_events_are_consistent_state_changes_never_flapping(stream, patience):
    events = run(stream, patience=patience)
    previous = "UNKNOWN"
    last_step = None
    for e in events:
        assert e.from_state != e.to_state                      # never an event without a change
        # a consistent chain of states (a healthy start is confirmed silently)
        assert e.from_state == previous or (previous, e.from_state) == ("UNKNOWN", "HEALTHY")
        if e.to_state != "NON_FINITE" and last_step is not None:
            assert e.step - last_step >= patience              # new state held `patience` observations
        previous, last_step = e.to_state, e.step
        assert 0.0 <= e.confidence <= 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-0.24, 0.24), min_size=1, max_size=200), st.floats(1e-6, 1e2))
def test_hovering_within_the_hysteresis_band_gives_at_most_one_event(offsets, threshold):
    th = Thresholds(vanishing=threshold * 1e-3, exploding=threshold, saturation_norm=threshold * 1e-2)
    stream = [threshold * 10 ** o for o in offsets]           # within +-0.24 decades of `exploding`
    assert len(run(stream, th=th)) <= 1

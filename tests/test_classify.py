import math

from hypothesis import given, settings
from hypothesis import strategies as st

from neuraldbg_track.classify import Baseline, NormWindow, classify_activation, classify_gradient
from neuraldbg_track.config import Thresholds
from neuraldbg_track.stats import ActivationStats, GradientStats

TH = Thresholds()


def grad(norm, nonfinite=False):
    return GradientStats(norm, nonfinite, 1)


def g_state(norm, current="HEALTHY", window=None, nonfinite=False):
    return classify_gradient(grad(norm, nonfinite), current, TH, window or NormWindow(TH.saturation_window)).state


def test_gradient_bands_follow_the_seed_defaults():
    assert g_state(1e-7) == "VANISHING"
    assert g_state(1e-3) == "HEALTHY"
    assert g_state(2e3) == "EXPLODING"
    assert g_state(0.0) == "VANISHING"
    assert g_state(math.nan) == "NON_FINITE" and g_state(math.inf) == "NON_FINITE"
    assert g_state(1.0, nonfinite=True) == "NON_FINITE"


def test_gradient_hysteresis_needs_a_margin_to_leave():
    assert g_state(1.5e-6, current="VANISHING") == "VANISHING"    # above 1e-6 but inside the margin
    assert g_state(5e-6, current="VANISHING") == "HEALTHY"        # past 1e-6 * 10**0.5
    assert g_state(900, current="EXPLODING") == "EXPLODING"
    assert g_state(100, current="EXPLODING") == "HEALTHY"


def test_gradient_saturated_needs_high_and_stable_norm():
    stable, noisy = NormWindow(TH.saturation_window), NormWindow(TH.saturation_window)
    for i in range(TH.saturation_window):
        stable.add(5.0 * (1 + 0.001 * (i % 2)))
        noisy.add(5.0 * (1 + 0.3 * (i % 2)))
    assert g_state(5.0, window=stable) == "SATURATED"
    assert g_state(5.0, window=noisy) == "HEALTHY"
    low = NormWindow(TH.saturation_window)
    for _ in range(TH.saturation_window):
        low.add(0.1)
    assert g_state(0.1, window=low) == "HEALTHY"                 # stable but small is fine
    assert g_state(5.0, window=NormWindow(TH.saturation_window)) == "HEALTHY"  # window not yet full


def act(rms=1.0, dead=0.0, sat=None, finite=True):
    return ActivationStats(rms if finite else math.nan, dead, sat, 64)


def a_state(stats, current="NORMAL", baseline=None):
    return classify_activation(stats, current, TH, baseline or Baseline(0.9, 5, 20)).state


def test_activation_regimes():
    assert a_state(act(dead=0.95)) == "DEAD"
    assert a_state(act(dead=0.5)) == "NORMAL"
    assert a_state(act(sat=0.8)) == "SATURATED"
    assert a_state(act(sat=None, dead=0.0)) == "NORMAL"          # unbounded outputs are never saturated
    assert a_state(act(finite=False)) == "ANOMALOUS"
    assert a_state(act(dead=0.8), current="DEAD") == "DEAD"      # hysteresis: 0.9 * 0.75 = 0.675
    assert a_state(act(dead=0.6), current="DEAD") == "NORMAL"


def test_anomalous_is_relative_to_the_layers_own_baseline():
    base = Baseline(0.9, 5, 20)
    for _ in range(5):
        base.update(2.0, anomalous=False)
    assert a_state(act(rms=2.5), baseline=base) == "NORMAL"
    assert a_state(act(rms=25.0), baseline=base) == "ANOMALOUS"
    assert a_state(act(rms=0.15), baseline=base) == "ANOMALOUS"
    assert a_state(act(rms=25.0), baseline=Baseline(0.9, 5, 20)) == "NORMAL"  # no baseline yet
    for _ in range(20):                                          # a shift that holds becomes the baseline
        base.update(25.0, anomalous=True)
    assert a_state(act(rms=25.0), baseline=base) == "NORMAL"


@settings(max_examples=300, deadline=None)
@given(norm=st.floats(allow_nan=True, allow_infinity=True),
       current=st.sampled_from(["UNKNOWN", "HEALTHY", "VANISHING", "EXPLODING", "SATURATED", "NON_FINITE"]),
       flagged=st.booleans())
def test_non_finite_always_wins(norm, current, flagged):
    state = g_state(norm, current=current, nonfinite=flagged)
    if flagged or not math.isfinite(norm):
        assert state == "NON_FINITE"
    else:
        assert state != "NON_FINITE"

import json
import math

import pytest

from neuraldbg_track import ActivationRegime, GradientHealth, SemanticEvent


def _event(**kw):
    base = dict(event_type="gradient_health", layer_name="encoder.2.fc", step=41, from_state="HEALTHY",
                to_state="VANISHING", confidence=0.8, metadata={"grad_norm": 3e-8, "nested": {"a": [1, 2]}})
    base.update(kw)
    return SemanticEvent(**base)


def test_round_trip_and_json():
    e = _event()
    assert SemanticEvent.from_dict(e.to_dict()) == e
    assert SemanticEvent.from_dict(json.loads(e.to_json())) == e
    assert e.to_dict()["metadata"] == {"grad_norm": 3e-8, "nested": {"a": [1, 2]}}


def test_immutable_including_metadata():
    e = _event()
    with pytest.raises(AttributeError):
        e.step = 3
    with pytest.raises(TypeError):
        e.metadata["grad_norm"] = 1.0
    with pytest.raises(TypeError):
        e.metadata["nested"]["a"] = 0


def test_states_are_upper_case_str_enums():
    assert GradientHealth.NON_FINITE == "NON_FINITE" and ActivationRegime.DEAD.value == "DEAD"
    assert {s.value for s in GradientHealth} == {"UNKNOWN", "HEALTHY", "VANISHING", "EXPLODING", "SATURATED",
                                                 "NON_FINITE"}
    assert {s.value for s in ActivationRegime} == {"UNKNOWN", "NORMAL", "SATURATED", "DEAD", "ANOMALOUS"}
    e = _event(from_state=GradientHealth.HEALTHY, to_state=GradientHealth.EXPLODING)
    assert e.to_state == "EXPLODING" and type(e.to_state) is str


def test_non_finite_metadata_is_json_safe():
    e = _event(metadata={"grad_norm": math.nan, "big": math.inf})
    assert json.loads(e.to_json())["metadata"] == {"grad_norm": "nan", "big": "inf"}


@pytest.mark.parametrize("bad", [dict(confidence=1.5), dict(confidence=-0.1), dict(event_type="loss"),
                                 dict(metadata={"t": object()})])
def test_invalid_events_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        _event(**bad)


def test_is_failure():
    assert _event().is_failure
    assert not _event(from_state="VANISHING", to_state="HEALTHY").is_failure

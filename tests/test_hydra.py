"""Hydra: presets and sink choices compose, bad values fail at start-up naming key and allowed values."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize
from omegaconf import OmegaConf

from neuraldbg_track import ConfigError, NeuralDbg
from neuraldbg_track.configure import validated
from neuraldbg_track.sinks.background import BackgroundSink
from tests.helpers import mlp

PRESETS = ["default", "strict", "lenient", "mlflow", "wandb", "tensorboard"]
SINK_CLASSES = {"mlflow": "MLflowSink", "wandb": "WandbSink", "tensorboard": "TensorBoardSink"}


def neuraldbg_node(*overrides, preset="default"):
    """Compose our node the way a user's app gets it (through the search-path plugin)."""
    with initialize(version_base=None, config_path=None):
        return compose(config_name=f"neuraldbg/{preset}", overrides=list(overrides)).neuraldbg


def tracker_names(dbg):
    return sorted(type(s.sink if isinstance(s, BackgroundSink) else s).__name__ for s in dbg.sinks.sinks
                  if type(s.sink if isinstance(s, BackgroundSink) else s).__name__ in SINK_CLASSES.values())


def build(node):
    model = mlp([4, 8, 1])
    return NeuralDbg.from_config(node, model, torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_builds(preset):
    node = neuraldbg_node(preset=preset)
    dbg = build(node)
    expected = [SINK_CLASSES[preset]] if preset in SINK_CLASSES else []
    assert tracker_names(dbg) == expected
    assert dbg.journal is not None and len(dbg.layers) == 3


def test_presets_differ_from_the_library_defaults_as_documented():
    default, strict, lenient = (build(neuraldbg_node(preset=p)).config.thresholds for p in ("default", "strict", "lenient"))
    from neuraldbg_track import Thresholds
    assert default == Thresholds()
    assert strict.vanishing > default.vanishing and strict.patience < default.patience
    assert lenient.vanishing < default.vanishing and lenient.patience > default.patience


@pytest.mark.parametrize("sink", ["jsonl", "console", "none", "mlflow", "wandb", "tensorboard"])
def test_every_sink_choice(sink, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    dbg = build(neuraldbg_node(f"neuraldbg.sink={sink}"))
    assert tracker_names(dbg) == ([SINK_CLASSES[sink]] if sink in SINK_CLASSES else [])


def test_several_sinks_at_once():
    dbg = build(neuraldbg_node("neuraldbg.sinks=[mlflow,tensorboard]"))
    assert tracker_names(dbg) == ["MLflowSink", "TensorBoardSink"]


def test_overrides_reach_the_extractor():
    node = neuraldbg_node("neuraldbg.thresholds.vanishing=1e-7", "neuraldbg.patience=5",
                          "neuraldbg.every_n_steps=10", "neuraldbg.include=[0,2]", "neuraldbg.console=false")
    dbg = build(node)
    th = dbg.config.thresholds
    assert (th.vanishing, th.patience, dbg.config.every_n_steps) == (1e-7, 5, 10)
    assert [l.name for l in dbg.layers] == ["0", "2"]


def test_enabled_false_installs_zero_hooks():
    model = mlp([4, 8, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg.from_config(neuraldbg_node("neuraldbg.enabled=false", "neuraldbg.sink=tensorboard"),
                               model, opt) as dbg:
        assert sum(len(m._forward_hooks) for m in model.modules()) == 0
        assert not opt._optimizer_step_pre_hooks
    assert dbg.sinks.sinks == [] and dbg.journal is None


@pytest.mark.parametrize("override, message", [
    ("neuraldbg.sink=nonsense", "Invalid value 'nonsense', expected one of [jsonl, mlflow, wandb, tensorboard, "
                                "console, none]"),
    ("neuraldbg.bogus=1", "Key 'bogus' not in 'NeuralDbgConf'"),
    ("neuraldbg.thresholds.vanishnig=1e-7", "Key 'vanishnig' not in 'ThresholdsConf'"),
    ("neuraldbg.every_n_steps=often", "Value 'often' of type 'str' could not be converted to Integer"),
])
def test_hydra_rejects_bad_names_and_types(override, message):
    with pytest.raises(Exception) as info:
        neuraldbg_node(override)
    text = str(info.value) + str(info.value.__cause__ or "")
    assert message in text and "neuraldbg." in text


@pytest.mark.parametrize("override, message", [
    ("neuraldbg.thresholds.vanishing=-1", "neuraldbg.thresholds.vanishing=-1.0 is not allowed; expected a finite number > 0"),
    ("neuraldbg.thresholds.vanishing=1e4", "neuraldbg.thresholds.vanishing=10000.0 must be below "
                                           "neuraldbg.thresholds.exploding=1000.0"),
    ("neuraldbg.patience=0", "neuraldbg.patience=0 is not allowed; expected an integer >= 1"),
    ("neuraldbg.thresholds.dead_fraction=1.5", "neuraldbg.thresholds.dead_fraction=1.5 is not allowed; "
                                               "expected a fraction in (0, 1]"),
    ("neuraldbg.max_events=0", "neuraldbg.max_events=0 is not allowed; expected an integer >= 1"),
    ("neuraldbg.include=[encoder.*]", "neuraldbg.include pattern 'encoder.*' matches no layer of Sequential"),
])
def test_range_errors_fail_before_training_naming_key_value_and_rule(override, message):
    with pytest.raises(ConfigError) as info:
        build(neuraldbg_node(override))
    assert message in str(info.value)


def test_plain_dicts_are_validated_against_the_schema_too():
    with pytest.raises(ConfigError, match=r"key: neuraldbg.sinks.*Invalid value 'kafka'"):
        validated({"sinks": ["kafka"]})
    assert OmegaConf.to_container(validated({"sink": "tensorboard"}))["sink"].name == "tensorboard"


def test_presets_ship_inside_the_package():
    import neuraldbg_track.conf as conf
    shipped = sorted(p.stem for p in (Path(conf.__file__).parent / "neuraldbg").glob("*.yaml"))
    assert shipped == sorted(PRESETS)
